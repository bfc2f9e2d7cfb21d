"""A real data plane for the end-to-end tests: kube-proxy v1.37.2 (built by scripts/k8s/build from the same pin as
the control plane) in a network namespace of the test's own.

Our control plane has no nodes and no kube-proxy, so a Service's ClusterIP routes nowhere. `DataPlane` makes one
node's worth of it: a network namespace joined to this machine by a veth pair, a Node object for it, and
kube-proxy (nftables mode) inside, programming that namespace's nftables from the API server's Services and
EndpointSlices exactly as it does on a cluster node. A client run in the namespace (`run_client`) reaches a
ClusterIP through those rules; the endpoints the slices list may be any address the namespace can route to, this
machine's own non-loopback address included (the namespace's default route is the veth pair).

The API server listens on 127.0.0.1 only: a relay on the veth address of this side carries kube-proxy's
connections to it (its kubeconfig keeps checking the serving certificate for 127.0.0.1).

Everything is removed on exit, whatever happened: kube-proxy, the namespace (and with it the veth pair and the
rules), the relay and the Node. Needs root, `ip` and `nft`; `DataPlane.unavailable()` says why not otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cluster import API_PORT, K8S_SCRIPTS, ControlPlane, Kube, wait_for

ROOT = Path(__file__).resolve().parents[2]
CLIENT = Path(__file__).with_name("netns_client.py")
# kube-proxy's rules are ready once it logged a full sync for IPv4.
_SYNCED = '"SyncProxyRules complete" ipFamily="IPv4"'


def kube_proxy_binary() -> Path:
    """The kube-proxy scripts/k8s/build built (a cache hit once built; prints the bin directory last)."""
    done = subprocess.run([K8S_SCRIPTS / "build"], capture_output=True, text=True, timeout=3600, check=True)
    return Path(done.stdout.strip().splitlines()[-1]) / "kube-proxy"


class _Relay:
    """host:port -> 127.0.0.1:API_PORT, a thread per direction per connection: kube-proxy's few watches."""

    def __init__(self, host: str, port: int) -> None:
        self._server = socket.create_server((host, port))
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="apiserver relay").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
                upstream = socket.create_connection(("127.0.0.1", API_PORT), timeout=10)
            except OSError:
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._server.close()


class DataPlane:
    """One node's data plane: see the module docstring. Use as a context manager."""

    def __init__(self, plane: ControlPlane, kube: Kube, workdir: Path) -> None:
        self._plane = plane
        self._kube = kube
        tag = os.getpid() % 100_000
        self.namespace = f"zsdp{tag}"
        self.node = f"zs-dataplane-{tag}"
        self._third = third = tag % 250
        self.host_address = f"10.251.{third}.1"  # this machine's end of the veth pair
        self.address = f"10.251.{third}.2"  # the namespace's end
        self._veth = (f"zsdp{tag}a", f"zsdp{tag}b")
        self._workdir = workdir
        self._log = workdir / "kube-proxy.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._relay: _Relay | None = None

    @staticmethod
    def unavailable() -> str | None:
        """Why a data plane cannot run here, or None."""
        if os.geteuid() != 0:
            return "kube-proxy and network namespaces need root"
        for tool in ("ip", "nft"):
            if shutil.which(tool) is None:
                return f"`{tool}` is not installed (scripts/setup-system.sh installs it)"
        probe = subprocess.run(["unshare", "-n", "nft", "list", "ruleset"], capture_output=True, text=True)
        if probe.returncode != 0:
            return f"nftables does not work in a new network namespace here: {probe.stderr.strip()}"
        return None

    def __enter__(self) -> DataPlane:
        try:
            self._create()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        subprocess.run(["ip", "netns", "delete", self.namespace], capture_output=True)
        subprocess.run(["ip", "link", "delete", self._veth[0]], capture_output=True)
        if self._relay is not None:
            self._relay.close()
        self._kube.kubectl("delete", "node", self.node, "--ignore-not-found", check=False)

    def _ip(self, *args: str, inside: bool = False) -> None:
        command = ["ip", "netns", "exec", self.namespace, "ip", *args] if inside else ["ip", *args]
        subprocess.run(command, check=True, capture_output=True)

    def _create(self) -> None:
        outside, inside = self._veth
        subprocess.run(["ip", "netns", "add", self.namespace], check=True, capture_output=True)
        self._ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        self._ip("link", "set", inside, "netns", self.namespace)
        self._ip("addr", "add", f"{self.host_address}/30", "dev", outside)
        self._ip("link", "set", outside, "up")
        self._ip("addr", "add", f"{self.address}/30", "dev", inside, inside=True)
        self._ip("link", "set", inside, "up", inside=True)
        self._ip("link", "set", "lo", "up", inside=True)
        self._ip("route", "add", "default", "via", self.host_address, inside=True)
        self._relay = _Relay(self.host_address, API_PORT)
        self._kube.apply([{"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node}}])
        status = {"status": {"addresses": [{"type": "InternalIP", "address": self.address}]}}
        self._kube.kubectl("patch", "node", self.node, "--subresource=status", "--type=merge", "-p", json.dumps(status))
        kubeconfig = self._workdir / "kube-proxy.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(self._kubeconfig()))
        command = [
            "ip", "netns", "exec", self.namespace, str(kube_proxy_binary()),
            f"--kubeconfig={kubeconfig}",
            "--proxy-mode=nftables",
            f"--hostname-override={self.node}",
            "--cluster-cidr=10.244.0.0/16",
            # Leave the machine's conntrack sysctls alone (a namespace cannot set them all).
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--v=2",
        ]  # fmt: skip
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: _SYNCED in self._log.read_text(errors="replace") or None, 60, "kube-proxy's first sync")

    def _kubeconfig(self) -> dict[str, Any]:
        config: dict[str, Any] = yaml.safe_load(self._plane.admin_kubeconfig.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://{self.host_address}:{API_PORT}"
            cluster["cluster"]["tls-server-name"] = "127.0.0.1"  # the serving certificate's address
        return config

    def host_alias(self, number: int) -> str:
        """One more address of this machine that the namespace routes to (through its default route), as a pod
        has an IP of its own: on this side's veth, so it goes with the namespace."""
        address = f"10.252.{self._third}.{number}"
        self._ip("addr", "add", f"{address}/32", "dev", self._veth[0])
        return address

    def synced_since(self, offset: int) -> bool:
        """kube-proxy logged a sync after byte `offset` of its log."""
        with self._log.open("rb") as log:
            log.seek(offset)
            return _SYNCED.encode() in log.read()

    def log_size(self) -> int:
        return self._log.stat().st_size

    @contextmanager
    def client(self, target: str, *, connections: int, label: str = "c", pause: float = 0.0) -> Iterator[ClientRun]:
        """Continuous HTTP traffic to `target` (ClusterIP:port) from inside the namespace until the block ends;
        each connection waits `pause` seconds between its requests."""
        run = ClientRun(self.namespace, target, connections, label, self._workdir, pause)
        try:
            yield run
        finally:
            run.stop()

    def get(self, url: str, timeout: float = 2.0) -> tuple[int, str]:
        """One GET from inside the namespace: (status, body) or (0, the error)."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.namespace, sys.executable, str(CLIENT), "once", url, str(timeout)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=timeout + 10,
        )
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
        return int(outcome["status"]), str(outcome.get("body") or outcome.get("error"))


class ClientRun:
    """A netns_client.py process sending requests with unique ids on `connections` connections."""

    def __init__(self, namespace: str, target: str, connections: int, label: str, workdir: Path, pause: float) -> None:
        self.output = workdir / f"client-{label}-{time.monotonic_ns()}.jsonl"
        self._stop = workdir / f"{self.output.name}.stop"
        command = [
            "ip", "netns", "exec", namespace, sys.executable, str(CLIENT), "loop", target,
            str(connections), label, str(self._stop), str(pause),
        ]  # fmt: skip
        self._file = self.output.open("wb")
        self._process = subprocess.Popen(command, stdout=self._file, cwd=ROOT)

    def stop(self) -> None:
        self._stop.touch()
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._file.close()

    def outcomes(self) -> list[dict[str, Any]]:
        """One object per request sent: {id, status, body | error, started, ended}."""
        lines = self.output.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]
