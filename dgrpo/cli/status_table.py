"""The nodes table of ``dgrpo status`` and of ``dgrpo testnet up``'s live view: one row per node, drawn from its
``/status`` JSON (:func:`dgrpo.daemon.snapshot.node_snapshot`).

A message a node refuses is refused by one of three stages, and the table counts each apart, with its most frequent
reason: an attacker caught by the defense chain is invisible in the wire count, and a count without its reason does
not say whether the defense worked or the network is broken. Blacklisted peers are shown by short id, so that the
node which did the blacklisting and the node it blacklisted can be read off the same table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

TABLE_ROWS = 20  # a live table shows this many nodes, and the others in one line
SHORT_ID = 8  # a peer id's last characters: enough to tell a testnet's nodes apart
BLACKLIST_SHOWN = 3  # peer ids listed in a cell; past that, a count

COLUMNS = (
    "node", "peer", "state", "round", "done", "peers", "reach", "links", "accepted",
    "wire", "admit", "defense", "blacklisted", "reward",
)  # fmt: skip
CAPTION = "rejected by stage (top reason): wire = validator and transport, admit = round admission, defense = the chain"


def short_id(peer: str) -> str:
    return peer[-SHORT_ID:]


def stage_rejections(st: Mapping[str, Any]) -> dict[str, dict[str, int] | None]:
    """Rejections by stage, each ``reason -> count`` (None: the node has no such stage, i.e. no defense chain).
    ``.get``: a status.json of an older node, or a federated one, may lack a stage's key."""
    defense = st.get("defense")
    return {
        "wire": dict(st.get("messages_rejected") or {}),
        "admit": dict(st.get("round_rejections") or {}),
        "defense": None if defense is None else dict(defense.get("rejected_by_reason") or {}),
    }


def blacklisted(st: Mapping[str, Any]) -> list[str]:
    """Peers this node has blacklisted: those its gossip layer drops, and those its reputation has blacklisted
    (the same peers once the daemon has acted on the reputation; both, so that neither is hidden)."""
    reputation = (st.get("defense") or {}).get("blacklisted") or {}
    return sorted({*(st.get("blacklisted_peers") or ()), *reputation})


def rejection_cell(reasons: Mapping[str, int] | None) -> str:
    """``16 (logit:outside_top_k)``; with other reasons too, ``18 (logit:outside_top_k 16, +1 more)``."""
    if reasons is None:
        return "-"
    total = sum(reasons.values())
    if not total:
        return "0"
    top, count = max(reasons.items(), key=lambda item: (item[1], item[0]))
    if len(reasons) == 1:
        return f"{total} ({top})"
    return f"{total} ({top} {count}, +{len(reasons) - 1} more)"


def blacklist_cell(peers: Sequence[str]) -> str:
    """``0``, or the count and the peers' short ids (``2: 1a2b3c4d,5e6f7a8b``), at most BLACKLIST_SHOWN of them."""
    if not peers:
        return "0"
    shown = ",".join(short_id(p) for p in peers[:BLACKLIST_SHOWN])
    more = f" +{len(peers) - BLACKLIST_SHOWN}" if len(peers) > BLACKLIST_SHOWN else ""
    return f"{len(peers)}: {shown}{more}"


def _row(name: str, st: Mapping[str, Any]) -> list[str]:
    reward = st.get("mean_reward")
    net = st.get("network") or {}
    stages = stage_rejections(st)
    return [
        name,
        short_id(str(st.get("peer_id", ""))),
        str(st.get("state", "")),
        str(st.get("round", "")),
        str(st.get("rounds_done", "")),
        str(len(st.get("peers") or ())),
        str((net.get("reachability") or {}).get("status", "")),
        f"{net.get('direct_peers', 0)}d/{net.get('relayed_peers', 0)}r" if net else "",
        str(st.get("messages_accepted", "")),
        *(rejection_cell(stages[stage]) for stage in ("wire", "admit", "defense")),
        blacklist_cell(blacklisted(st)),
        "" if reward is None else f"{reward:.3f}",
    ]


def _summary_row(hidden: int, rest: Sequence[Mapping[str, Any]]) -> list[str]:
    """The nodes past TABLE_ROWS in one row: how many are up, their rounds done, and their rejections and
    blacklisted peers summed (a large testnet's attack is still visible without a row per node)."""
    done = sorted(int(st.get("rounds_done", 0)) for st in rest) or [0]
    totals: dict[str, dict[str, int] | None] = {"wire": {}, "admit": {}, "defense": None}
    for st in rest:
        for stage, reasons in stage_rejections(st).items():
            if reasons is None:
                continue
            into = totals[stage]
            if into is None:
                into = totals[stage] = {}
            for reason, n in reasons.items():
                into[reason] = into.get(reason, 0) + n
    peers = sorted({p for st in rest for p in blacklisted(st)})
    cells = [rejection_cell(totals[stage]) for stage in ("wire", "admit", "defense")]
    return [f"+{hidden} more", "", f"{len(rest)} up", "", f"{done[0]}..{done[-1]}", "", "", "", "",
            *cells, blacklist_cell(peers), ""]  # fmt: skip


def status_table(statuses: Sequence[Mapping[str, Any] | None], names: Sequence[str]) -> Table:
    """One row per node (None: not answering yet, "starting"); past TABLE_ROWS + 1 nodes, the others in one row."""
    table = Table(title="dgrpo nodes", caption=CAPTION)
    for col in COLUMNS:
        table.add_column(col)
    shown = TABLE_ROWS if len(names) > TABLE_ROWS + 1 else len(names)
    for name, st in zip(names[:shown], statuses[:shown], strict=True):
        if st is None:
            table.add_row(name, "-", "starting", *[""] * (len(COLUMNS) - 3))
        else:
            table.add_row(*_row(name, st))
    if len(names) > shown:
        table.add_row(*_summary_row(len(names) - shown, [st for st in statuses[shown:] if st is not None]))
    return table
