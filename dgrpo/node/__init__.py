"""A decentralised GRPO node: learner, round loop, transports."""
