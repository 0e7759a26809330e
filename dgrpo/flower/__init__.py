"""Fed-GRPO as a Flower app (``flwr`` >= 1.42, Message API; ``docs/flower.md``): a ``FedGRPO`` strategy and a
``ClientApp`` that runs dgrpo's GRPO learner on its partition. The optional extra ``dgrpo[flower]``."""
