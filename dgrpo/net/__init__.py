"""Moving rollouts between nodes: the transport interface (:mod:`transport`), the in-memory network that
simulations use, over the same signed wire format (:mod:`memory`), and libp2p gossipsub (:mod:`gossip`,
:mod:`p2p`)."""
