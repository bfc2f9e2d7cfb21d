"""Servers started without port races (adapter/children.py, adapter/ready.py; docs/architecture.md#no-port-races).

Each test here failed before: ports were chosen by binding 0, closing and handing the number on, `zeroscale
serve|proxy` could not say which ports they bound, and a child that exited at start was waited for until a
timeout (60 s in the demo) with no word of why.
"""

from __future__ import annotations

import functools
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from adapter.children import (
    ChildFailed,
    PortAttempts,
    ephemeral_range,
    listening,
    on_a_free_port,
    port_outside_ephemeral,
    shared_port,
    stop_blocking,
    wait_ready_blocking,
)
from adapter.ready import read_ready_file
from tests.fixtures.netutil import LOOPBACK_SERVER, refused_port
from tests.fixtures.replicas import spawn


def _connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except ConnectionRefusedError:
        return False


# Far under the 60 s the demo used to wait for a child that had already exited; generous for a loaded machine.
AT_ONCE = 20.0


def test_a_child_that_exits_before_it_is_ready_is_reported_at_once_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    script = "import sys; print('loading'); print('fatal: the config names no listener', flush=True); sys.exit(3)"
    with log.open("wb") as out:
        child = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=subprocess.STDOUT)
    ready = functools.partial(read_ready_file, tmp_path / "never-written.json")
    started = time.monotonic()
    with pytest.raises(ChildFailed) as failed:
        wait_ready_blocking(child, ready, "the child", log, within=120)
    assert time.monotonic() - started < AT_ONCE
    message = str(failed.value)
    assert "the child exited with code 3 before it was ready" in message
    assert message.endswith("loading\nfatal: the config names no listener")


@pytest.mark.parametrize("command", ["serve", "proxy"])
def test_zeroscale_binds_port_0_and_reports_every_listener_it_bound(command: str, tmp_path: Path) -> None:
    config = {
        "server": LOOPBACK_SERVER,
        "grpc": {
            "scaler": {"enabled": True, "bind": "127.0.0.1", "port": 0},
            "counts": {"enabled": True, "bind": "127.0.0.1", "port": 0},
        },
        "proxy": {
            "bind": "127.0.0.1",
            "port": 0,
            "admin_bind": "127.0.0.1",
            "admin_port": 0,
            "routes": [{"name": "web", "upstream": {"address": "192.0.2.1:9"}, "wake": "none"}],
        },
        "sources": [{"name": "demo", "type": "static", "series": [{"value": 1}]}],
        "metrics": [{"name": "demo-depth", "type": "static", "source": "demo"}],
    }
    path = tmp_path / "zeroscale.yaml"
    path.write_text(yaml.safe_dump(config))
    child = spawn(command, command, tmp_path, "--config", str(path))
    try:
        ports = child.ports
        expected = {"serve": {"https", "metrics", "grpc"}, "proxy": {"http", "admin", "counts"}}[command]
        assert set(ports) == expected
        for port in ports.values():
            assert port > 0
            assert listening(child.process.pid, port)
            assert _connects(port)
        written = (tmp_path / f"{command}.ready.json").read_text()
        assert written.endswith("}\n")  # one document, written at once
    finally:
        child.stop()
    assert child.process.returncode == 0
    assert not (tmp_path / f"{command}.ready.json").exists()  # it names ports only while they are bound


def test_a_port_another_listener_holds_is_seen_in_the_exit_and_another_is_tried(tmp_path: Path) -> None:
    """A server that cannot report (redis-server) exits saying its port is taken: that is seen at once (not
    mistaken for it listening: the other listener answers meanwhile), and it is started again elsewhere."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    log = tmp_path / "redis.log"
    taken = socket.create_server(("127.0.0.1", port_outside_ephemeral()))
    tried: list[int] = []
    children: list[subprocess.Popen[bytes]] = []

    def start(port: int) -> int:
        port = port if tried else taken.getsockname()[1]  # the first try meets the other listener
        tried.append(port)
        with log.open("ab") as out:
            argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
            children.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path))
        wait_ready_blocking(children[-1], functools.partial(listening, children[-1].pid, port), "redis", log, 120)
        return port

    started = time.monotonic()
    try:
        port = on_a_free_port(start)
        assert time.monotonic() - started < AT_ONCE
        assert tried == [taken.getsockname()[1], port]
        assert children[0].poll() is not None
        assert "Address already in use" in log.read_text()
        assert _connects(port)
    finally:
        taken.close()
        for child in children:
            if child.poll() is None:
                child.terminate()
                child.wait(10)


def test_a_failure_other_than_a_taken_port_is_not_retried(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("fatal: cannot read the certificate\n")
    with pytest.raises(ChildFailed, match="cannot read the certificate"):
        PortAttempts().failed(ChildFailed("the child exited with code 1 before it was ready", log.read_text()))


def test_ports_chosen_for_others_are_outside_the_ephemeral_range() -> None:
    """Outgoing connections are given local ports from this range: a port outside it cannot be taken by one."""
    low, high = ephemeral_range()
    assert (low, high) == tuple(
        int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    )
    for _ in range(200):
        port = port_outside_ephemeral()
        assert 1024 <= port < low or high < port <= 65535


_IP_LOCAL_PORT_RANGE = 51  # Linux 6.3+: a socket's own range for the local port connect() picks


def _outgoing_connection_from(port: int, target: tuple[str, int]) -> socket.socket | OSError:
    """An outgoing connection that may be given no local port but `port` (if the kernel lets it have it)."""
    client = socket.socket()
    try:
        client.setsockopt(socket.IPPROTO_IP, _IP_LOCAL_PORT_RANGE, struct.pack("=I", port << 16 | port))
    except OSError:
        client.close()
        pytest.skip("IP_LOCAL_PORT_RANGE needs Linux 6.3 or later")
    try:
        client.connect(target)
    except OSError as refused:
        client.close()
        return refused
    return client


def test_an_outgoing_connection_cannot_take_a_port_handed_to_a_server() -> None:
    """Issue 28's race, made certain: an outgoing connection on this machine was given the port a test had
    chosen (bound to 0, closed, handed on) before the server bound it. A port held bound (the demo's shared
    web port, a test's refused port) is never given to one; a port outside the ephemeral range neither."""
    target = socket.create_server(("127.0.0.1", 0))
    opened: list[socket.socket] = []
    try:
        held = shared_port()
        opened.append(held)
        for port in (held.getsockname()[1], refused_port()):
            outcome = _outgoing_connection_from(port, target.getsockname())
            assert isinstance(outcome, OSError), f"an outgoing connection was given {port}"
        chosen = port_outside_ephemeral()
        outcome = _outgoing_connection_from(chosen, target.getsockname())
        if isinstance(outcome, socket.socket):
            opened.append(outcome)
            assert outcome.getsockname()[1] != chosen
        with socket.create_server(("127.0.0.1", chosen)):  # still free for the server it was chosen for
            pass
    finally:
        target.close()
        for sock in opened:
            sock.close()


def test_a_shared_port_refuses_until_a_replica_listens_and_nobody_else_can_bind_it() -> None:
    holder = shared_port()
    port = holder.getsockname()[1]
    try:
        assert not _connects(port)  # refused: no replica yet
        with socket.socket() as stranger, pytest.raises(OSError, match="in use"):
            stranger.bind(("127.0.0.1", port))  # without SO_REUSEPORT (another program): refused
        replica = socket.socket()
        replica.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        replica.bind(("127.0.0.1", port))
        replica.listen()
        assert _connects(port)
        replica.close()
        assert not _connects(port)  # the replica is gone: refused again, the port still held
    finally:
        holder.close()


def _started(script: str) -> subprocess.Popen[bytes]:
    """A Python child that has run `script`'s setup and says so on its stdout before it waits."""
    child = subprocess.Popen(
        [sys.executable, "-c", f"{script}; print('up', flush=True); import time; time.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    with child.stdout:
        assert child.stdout.readline() == b"up\n"
    return child


def test_stop_blocking_terminates_and_kills_what_ignores_the_terminate() -> None:
    polite = _started("pass")
    stop_blocking(polite)
    assert polite.returncode == -signal.SIGTERM
    deaf = _started("import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    started = time.monotonic()
    stop_blocking(deaf, within=0.5)
    assert deaf.returncode == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - started < AT_ONCE
    stop_blocking(deaf)  # gone already: nothing to do
    stop_blocking(None)
