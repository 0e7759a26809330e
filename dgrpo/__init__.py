"""dgrpo: a peer-to-peer decentralised GRPO node with attack and defense modules."""

__version__ = "0.1.0"
