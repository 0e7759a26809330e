"""Operating a node: the daemon (:mod:`daemon`), its settings, status and metrics endpoint, checkpoints, the
poison monitor, and local testnets of daemons."""
