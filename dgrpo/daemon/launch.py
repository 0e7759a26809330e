"""Starting a daemon: the class for its mode, resumed or fresh (``--allow-fresh`` moves the old state aside,
:mod:`dgrpo.daemon.fresh`), and the ``node.json`` a running node writes for tools to find it."""

from __future__ import annotations

import errno
from collections.abc import Callable

import trio

from dgrpo.daemon.completions import CompletionExchange
from dgrpo.daemon.daemon import Daemon
from dgrpo.daemon.exchange import Exchange
from dgrpo.daemon.federated import FederatedExchange
from dgrpo.daemon.fresh import FreshStart, move_aside
from dgrpo.daemon.node_file import read_node_file as read_node_file  # re-exported: its old home, still imported
from dgrpo.daemon.settings import NodeSettings
from dgrpo.errors import ConfigError, DgrpoError

EXCHANGES: dict[str, type[CompletionExchange] | type[FederatedExchange]] = {
    CompletionExchange.mode: CompletionExchange,
    FederatedExchange.mode: FederatedExchange,
}


def exchange_for(settings: NodeSettings) -> type[Exchange]:
    """The exchange of the settings' ``mode`` (:mod:`dgrpo.daemon.exchange`)."""
    return EXCHANGES[settings.mode]


def open_daemon(settings: NodeSettings, resume: bool = False, allow_fresh: bool = False) -> Daemon:
    """The daemon of ``settings``, with its mode's exchange: resumed from its state (``resume``), or, with
    ``allow_fresh``, a new node where resuming is impossible (or always, without ``resume``), the old state moved
    aside (:mod:`dgrpo.daemon.fresh`)."""
    exchange = exchange_for(settings)
    if allow_fresh and not resume:
        move_aside(settings, "a fresh node was asked for")
        return Daemon(settings, exchange)
    try:
        return Daemon(settings, exchange, resume=resume, allow_fresh=allow_fresh)
    except FreshStart as why:
        move_aside(settings, str(why))
        return Daemon(settings, exchange)


def run_daemon(settings: NodeSettings, resume: bool = False, allow_fresh: bool = False) -> None:
    """Run a daemon until it stops. An error the user can fix arrives as a :class:`DgrpoError` (one line, exit
    status 2, on the command line), also from inside the daemon's nurseries, where trio wraps it in an
    exception group."""
    daemon = open_daemon(settings, resume, allow_fresh)
    try:
        trio.run(daemon.run)
    except (BaseExceptionGroup, OSError) as exc:
        error = user_error(exc, settings)
        if error is None:
            raise
        raise error from None


def user_error(exc: BaseException, settings: NodeSettings) -> DgrpoError | None:
    """The :class:`DgrpoError` in ``exc`` (itself, or one in an exception group, however nested); else a port
    another process took between the probe and the bind (:mod:`dgrpo.daemon.ports`) as a :class:`ConfigError`;
    else None (a bug: its traceback is wanted)."""
    found = _first(exc, lambda e: isinstance(e, DgrpoError))
    if isinstance(found, DgrpoError):
        return found
    taken = _first(exc, lambda e: isinstance(e, OSError) and e.errno == errno.EADDRINUSE)
    if taken is not None:
        return ConfigError(
            f"an address this node listens on was taken by another process as it started ({taken}); "
            f"start it again, or choose free ports (--listen, now {settings.network.listen}; --set status.port=PORT, "
            f"now {settings.status.port})"
        )
    return None


def _first(exc: BaseException, wanted: Callable[[BaseException], bool]) -> BaseException | None:
    if wanted(exc):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first(inner, wanted)
            if found is not None:
                return found
    return None
