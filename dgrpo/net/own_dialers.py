"""py-libp2p 0.8.1 dials peers by itself in two places, whatever the node decided; both are turned off, so that
whom a node connects to is the peering loop's decision alone (:mod:`dgrpo.net.peering`: ``target_peers``,
``max_per_subnet``, the blacklist, backoff).

1. The swarm's ``AutoConnector`` (network/auto_connector.py) dials peers from the peer store whenever the node
   holds fewer than ``(low_watermark + high_watermark) / 2`` connections (200 by default), every 10-30 s. Any
   address that reached the peer store (identify, a PRUNE's peer records, mDNS) became a dial, past
   ``max_per_subnet`` and the blacklist: a joiner behind a hostile bootstrap held five of its Sybils.
2. Gossipsub dials the peers a PRUNE names (peer exchange, up to ``px_peers_count``, 16) whatever ``do_px`` says
   (``do_px`` only governs sending them): a hostile peer could hand every node it prunes 16 Sybils to dial.
   :data:`ROUTER_OPTIONS` sets that count to 0.
"""

from __future__ import annotations

from typing import Any

ROUTER_OPTIONS: dict[str, Any] = {"px_peers_count": 0, "do_px": False}


def disable_auto_connector(host: Any) -> None:
    """Make the swarm's auto-connector a no-op (its background task keeps running, and finds nothing to do)."""
    connector = host.get_network().auto_connector

    async def never() -> None:
        return None

    connector.maybe_connect = never
