"""A node's model and what it does with it: loading (:mod:`models`), generation and the GRPO update
(:mod:`learner`), the loss and advantage maths (:mod:`grpo`) and the verifiable seeded sampler (:mod:`sampler`)."""
