"""KEDA v2.21's operator and metrics server (built by scripts/keda) as processes beside the control plane.

What differs from a KEDA installed by its chart is what a cluster without kubelet forces: both run here with the
cluster admin's kubeconfig (no Pod, so no ServiceAccount mount), on loopback ports, with one serving and client
certificate for both (the chart's `kedaorg-certs` Secret: ca.crt, tls.crt, tls.key) made by trustme, and the
operator's certificate rotation and APIService patching off, as beside Zeroscale they must be
(deploy/overlays/beside-keda). The CRDs are the module's own config/crd/bases, applied server-side.
"""

from __future__ import annotations

import ssl
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

import trustme

from adapter.children import port_outside_ephemeral
from tests.e2e.cluster import ControlPlane, Kube, wait_for
from tests.e2e.processes import Managed

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "scripts" / "keda" / "build"
NAMESPACE = "keda"
METRICS_SERVER_SERVICE = "keda-operator-metrics-apiserver"
# The names the chart's certificate carries, and loopback, where these processes really are.
CERT_NAMES = [
    "127.0.0.1",
    "localhost",
    f"keda-operator.{NAMESPACE}.svc",
    f"{METRICS_SERVER_SERVICE}.{NAMESPACE}.svc",
]
_CRDS = ["scaledobjects", "scaledjobs", "triggerauthentications", "clustertriggerauthentications"]


def build() -> Path:
    """scripts/keda/build (a no-op when cached; scripts/e2e.sh ran it before the control plane came up)."""
    done = subprocess.run([BUILD], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/keda/build failed: {done.stderr.strip()}")
    return Path(done.stdout.strip().splitlines()[-1])


def install_crds(kube: Kube, crds: Path) -> None:
    kube.namespace(NAMESPACE)
    # Server-side: the ScaledObject CRD is larger than client-side apply's last-applied annotation allows.
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    for name in _CRDS:
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}.keda.sh"

        def established(path: str = path) -> bool:
            conditions = (kube.get(path).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(established, 60, f"CRD {name}.keda.sh established")


def make_certs(directory: Path) -> Path:
    """ca.crt, tls.crt, tls.key: serving (operator gRPC, metrics server) and client (between them) in one."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="keda-e2e-ca")
    leaf = ca.issue_cert(*CERT_NAMES)
    ca.cert_pem.write_to_path(str(directory / "ca.crt"))
    (directory / "ca").mkdir()
    ca.cert_pem.write_to_path(str(directory / "ca" / "ca.crt"))
    leaf.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
    leaf.private_key_pem.write_to_path(str(directory / "tls.key"))
    return directory


class GoProcess(Managed):
    """One KEDA binary with its arguments and environment; start() again after kill() keeps them."""

    def __init__(self, binary: Path, args: list[str], env: dict[str, str], log_file: Path, ready_url: str) -> None:
        super().__init__(log_file)
        self.binary = binary
        self.args = args
        self.env = env
        self.ready_url = ready_url

    def start(self, timeout: float = 90.0) -> GoProcess:
        self.launch([str(self.binary), *self.args], self.env)
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # readiness only; the certificate is checked by its real callers

        def ready() -> bool:
            if self.exited():
                raise RuntimeError(f"{self.binary.name} exited at start:\n{self.log_tail()}")
            with urllib.request.urlopen(self.ready_url, timeout=2, context=context) as answer:
                return bool(answer.status == 200)

        try:
            wait_for(_quiet(ready), timeout, f"{self.binary.name} ready at {self.ready_url}", interval=0.3)
        except TimeoutError:
            raise RuntimeError(f"{self.binary.name} not ready:\n{self.log_tail()}") from None
        return self


def _quiet(check: Callable[[], bool]) -> Callable[[], bool]:
    """A readiness check whose connection errors mean `not yet`."""

    def attempt() -> bool:
        try:
            return check()
        except OSError:
            return False

    return attempt


class Keda:
    """The operator and the metrics server; `metrics_server_port` is where Zeroscale's delegate calls."""

    def __init__(self, plane: ControlPlane, build_dir: Path, certs: Path, workdir: Path) -> None:
        grpc_port = port_outside_ephemeral()
        self.metrics_server_port = port_outside_ephemeral()
        self.certs = certs
        kubeconfig = str(plane.admin_kubeconfig)
        env = {"KUBECONFIG": kubeconfig, "WATCH_NAMESPACE": "", "POD_NAMESPACE": NAMESPACE}
        probe_port = port_outside_ephemeral()
        self.operator = GoProcess(
            build_dir / "bin" / "operator",
            [
                f"--metrics-bind-address=127.0.0.1:{port_outside_ephemeral()}",
                f"--health-probe-bind-address=127.0.0.1:{probe_port}",
                f"--metrics-service-bind-address=127.0.0.1:{grpc_port}",
                f"--cert-dir={certs}",
                f"--ca-dir={certs / 'ca'}",  # CA certificates only: the operator reads every file there
                "--enable-cert-rotation=false",
                "--enable-webhook-patching=false",
                "--enable-apiservice-patching=false",
                "--zap-log-level=info",
            ],
            {**env, "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE},
            workdir / "keda-operator.log",
            f"http://127.0.0.1:{probe_port}/readyz",
        )
        self.metrics_server = GoProcess(
            build_dir / "bin" / "adapter",
            [
                "--bind-address=127.0.0.1",
                f"--secure-port={self.metrics_server_port}",
                f"--cert-dir={certs}",
                f"--tls-cert-file={certs / 'tls.crt'}",
                f"--tls-private-key-file={certs / 'tls.key'}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--lister-kubeconfig={kubeconfig}",
                f"--metrics-service-address=127.0.0.1:{grpc_port}",
                f"--port={port_outside_ephemeral()}",
            ],
            env,
            workdir / "keda-metrics-server.log",
            f"https://127.0.0.1:{self.metrics_server_port}/readyz",
        )

    def start(self) -> Keda:
        self.operator.start()
        self.metrics_server.start()
        return self

    def stop(self) -> None:
        self.metrics_server.stop()
        self.operator.stop()
