"""The ports a node binds. Several nodes on one machine need no extra flags: where the port in effect is the
default (``network.listen`` on TCP 4001, ``status.port`` 8780) and another process holds it, the node takes the
next free port and says which; a port the user chose is theirs, and when it is taken the node refuses to start
(:class:`~dgrpo.errors.ConfigError`: one line, exit status 2) instead of quietly listening elsewhere.

A port is probed by binding a socket with ``SO_REUSEADDR`` and closing it: that is how trio (libp2p's listener)
and the status server bind, so a port held only by connections in ``TIME_WAIT`` counts as free, as it is to
them. The probe and the real bind are apart (the model loads in between), so another process may still take
the port first; :func:`dgrpo.daemon.launch.run_daemon` turns that ``EADDRINUSE`` into the same kind of error.
"""

from __future__ import annotations

import errno
import logging
import re
import socket

from multiaddr import Multiaddr

from dgrpo.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_LISTEN_PORT = 4001
DEFAULT_STATUS_PORT = 8780
TRIES = 20  # next ports tried before the system picks one


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_free(host: str, port: int) -> bool:
    """Whether a TCP listener could bind ``host:port`` now. Errors other than the port being taken (an address
    this machine does not have, a privileged port) are raised: they are no reason to try another port."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def next_free_port(host: str, port: int, tries: int = TRIES) -> int:
    """``port`` or one of the ``tries`` after it, the first free; else one the system picks."""
    for candidate in range(port, min(port + tries + 1, 65536)):
        if port_free(host, candidate):
            return candidate
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        chosen: int = s.getsockname()[1]
        return chosen


def port_in_effect(host: str, port: int, default: int, key: str, fix: str) -> int:
    """The port to bind for ``key``: ``port`` where it is free (or 0: the system picks); the default taken, the
    next free one; another port taken, a :class:`ConfigError` naming the setting and ``fix``."""
    if port == 0:
        return 0
    try:
        free = port_free(host, port)
    except OSError as exc:
        raise ConfigError(f"{key}: cannot listen on {host} port {port} ({exc.strerror or exc}); {fix}") from None
    if free:
        return port
    if port != default:
        raise ConfigError(f"{key}: port {port} on {host} is taken by another process; {fix}")
    return next_free_port(host, port + 1)


def _listen_parts(listen: str) -> tuple[str, int] | None:
    """The IP and TCP port of a listen multiaddr; None where it has no IP or no TCP part (nothing to probe)."""
    try:
        addr = Multiaddr(listen)
        names = [p.name for p in addr.protocols()]
        host = addr.value_for_protocol("ip4" if "ip4" in names else "ip6")
        return str(host), int(addr.value_for_protocol("tcp"))
    except Exception:  # the settings validate the address; whatever else it is, libp2p reports
        return None


def _with_port(listen: str, port: int) -> str:
    return re.sub(r"/tcp/\d+", f"/tcp/{port}", listen, count=1)


def _listen_fix(listen: str) -> str:
    return f"choose another with --listen, e.g. {_with_port(listen, 0)} (port 0: any free one)"


STATUS_FIX = "choose another with --set status.port=PORT (0: any free one)"


def listen_in_effect(listen: str) -> str:
    """``network.listen`` with the port it will bind (:func:`port_in_effect`); logs a moved default port."""
    parts = _listen_parts(listen)
    if parts is None:
        return listen
    host, port = parts
    chosen = port_in_effect(host, port, DEFAULT_LISTEN_PORT, "network.listen", _listen_fix(listen))
    if chosen == port:
        return listen
    moved = _with_port(listen, chosen)
    log.info("listen port %d is taken; listening on %s (set network.listen to choose)", port, moved)
    return moved


def status_port_in_effect(host: str, port: int) -> int:
    """``status.port`` as it will be bound (:func:`port_in_effect`); logs a moved default port."""
    chosen = port_in_effect(host, port, DEFAULT_STATUS_PORT, "status.port", STATUS_FIX)
    if chosen != port:
        log.info("status port %d is taken; serving on %d (set status.port to choose)", port, chosen)
    return chosen


def refuse_taken_chosen_ports(listen: str, status: tuple[str, int] | None) -> None:
    """Before the model loads (seconds to minutes): a port the user chose (not the default) that is taken is
    refused now, not after the wait. ``status``: the status server's host and port, None where it is off."""
    parts = _listen_parts(listen)
    if parts is not None and parts[1] != DEFAULT_LISTEN_PORT:
        port_in_effect(*parts, DEFAULT_LISTEN_PORT, "network.listen", _listen_fix(listen))
    if status is not None and status[1] != DEFAULT_STATUS_PORT:
        port_in_effect(*status, DEFAULT_STATUS_PORT, "status.port", STATUS_FIX)
