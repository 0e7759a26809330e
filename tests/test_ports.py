"""The ports a node binds (dgrpo.daemon.ports): a taken default moves to the next free port, a taken chosen port
is refused naming the setting, and TIME_WAIT is not "taken"."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest

from dgrpo.daemon.ports import (
    DEFAULT_LISTEN_PORT,
    DEFAULT_STATUS_PORT,
    listen_in_effect,
    next_free_port,
    port_free,
    port_in_effect,
    refuse_taken_chosen_ports,
    status_port_in_effect,
)
from dgrpo.errors import ConfigError

HOST = "127.0.0.1"


def listener(port: int = 0) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((HOST, port))
    s.listen()
    return s


@pytest.fixture
def taken() -> Iterator[int]:
    with listener() as s:
        yield int(s.getsockname()[1])


def hold(port: int) -> socket.socket | None:
    """A listener on ``port`` (None where another process holds it already: then it is taken anyway)."""
    try:
        return listener(port)
    except OSError:
        return None


def test_a_listening_port_is_taken_and_a_closed_one_is_free(taken: int) -> None:
    assert not port_free(HOST, taken)
    with listener() as s:
        port = s.getsockname()[1]
    assert port_free(HOST, port)


def test_a_port_in_time_wait_is_free() -> None:
    # The side that closes first keeps the connection in TIME_WAIT; SO_REUSEADDR binds over it (as trio does).
    with listener() as server:
        port = server.getsockname()[1]
        client = socket.create_connection((HOST, port))
        conn, _ = server.accept()
        conn.close()  # the server side closes first: its port holds a TIME_WAIT entry
        client.close()
    assert port_free(HOST, port)


def test_an_address_not_on_this_machine_is_an_error_not_a_taken_port() -> None:
    with pytest.raises(OSError):
        port_free("192.0.2.1", 0)  # TEST-NET-1: no interface here has it
    with pytest.raises(ConfigError, match=r"status\.port: cannot listen on 192\.0\.2\.1 port 5 \("):
        port_in_effect("192.0.2.1", 5, DEFAULT_STATUS_PORT, "status.port", "fix it")


def test_next_free_port_skips_taken_ones(taken: int) -> None:
    chosen = next_free_port(HOST, taken)
    assert chosen != taken and port_free(HOST, chosen)
    assert next_free_port(HOST, taken, tries=0) != taken  # none of the next free: the system picks one


def test_a_taken_default_moves_and_says_where(caplog: pytest.LogCaptureFixture) -> None:
    held = [hold(DEFAULT_STATUS_PORT), hold(DEFAULT_LISTEN_PORT)]
    try:
        with caplog.at_level(logging.INFO, logger="dgrpo"):
            status = status_port_in_effect(HOST, DEFAULT_STATUS_PORT)
            listen = listen_in_effect(f"/ip4/{HOST}/tcp/{DEFAULT_LISTEN_PORT}")
    finally:
        for s in held:
            if s is not None:
                s.close()
    assert status != DEFAULT_STATUS_PORT
    moved = int(listen.rpartition("/")[2])
    assert listen.startswith(f"/ip4/{HOST}/tcp/") and moved != DEFAULT_LISTEN_PORT
    assert f"status port {DEFAULT_STATUS_PORT} is taken; serving on {status} (set status.port to choose)" in caplog.text
    assert f"listen port {DEFAULT_LISTEN_PORT} is taken; listening on {listen} (set network.listen" in caplog.text


def test_a_taken_chosen_port_is_refused_naming_the_setting_and_the_fix(taken: int) -> None:
    with pytest.raises(ConfigError, match=rf"status\.port: port {taken} on {HOST} is taken .*--set status\.port="):
        status_port_in_effect(HOST, taken)
    with pytest.raises(ConfigError, match=rf"network\.listen: port {taken} .* --listen, e\.g\. /ip4/{HOST}/tcp/0 "):
        listen_in_effect(f"/ip4/{HOST}/tcp/{taken}")
    with pytest.raises(ConfigError, match=r"network\.listen"):
        refuse_taken_chosen_ports(f"/ip4/{HOST}/tcp/{taken}", None)
    with pytest.raises(ConfigError, match=r"status\.port"):
        refuse_taken_chosen_ports(f"/ip4/{HOST}/tcp/0", (HOST, taken))


def test_free_ports_and_port_zero_are_kept(taken: int) -> None:
    assert status_port_in_effect(HOST, 0) == 0
    assert listen_in_effect(f"/ip4/{HOST}/tcp/0") == f"/ip4/{HOST}/tcp/0"
    with listener() as s:
        free = s.getsockname()[1]
    assert listen_in_effect(f"/ip4/{HOST}/tcp/{free}") == f"/ip4/{HOST}/tcp/{free}"
    refuse_taken_chosen_ports(f"/ip4/{HOST}/tcp/{free}", (HOST, 0))
    # the defaults are never refused, taken or not: they move at the bind (listen_in_effect)
    held = hold(DEFAULT_LISTEN_PORT)
    try:
        refuse_taken_chosen_ports(f"/ip4/{HOST}/tcp/{DEFAULT_LISTEN_PORT}", None)
    finally:
        if held is not None:
            held.close()
