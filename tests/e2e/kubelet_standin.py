"""A STAND-IN for kubelet and the EndpointSlice controller, for one Deployment: our control plane has neither (no
node runs a Pod), so this runs the Deployment's "pods" as real servers in this process and writes the
EndpointSlices of the Service that selects them, as those two would.

It follows the Deployment's spec.replicas, which the Deployment and ReplicaSet controllers (which do run) turn into
Pods that never start. For each replica wanted it starts a pod (`pod(name)`: tests/e2e/pods.py's HTTP one, or
tests/e2e/grpc_pod.py's gRPC one) after `start_delay` (pulling and starting a container), probes its readiness
every 0.1 s until it passes, and then lists it ready, its port carrying the Service port's `appProtocol` as the
EndpointSlice controller copies it. For each replica no longer wanted it does what kubelet does with a pod being
deleted: the endpoint goes terminating at once (ready false, serving true, terminating true) while the pod's
preStop hook keeps it listening for `pre_stop` seconds, then it stops listening, and then the endpoint goes (the
pod object is removed). Each pod gets a slice of its own (the controller may
spread endpoints over slices as it likes; one each keeps a stopping pod's write from touching a starting one's).

`events` records what happened with the wall-clock time: ("replicas", n), ("ready", pod), ("terminating", pod),
("stopped", pod), so a test can time the switches around them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from tests.e2e.cluster import ENDPOINTSLICE_API, Kube, Watch

PROBE_PERIOD = 0.1  # the readiness probe's periodSeconds (kubelet's least is 1 s; a test's seconds are dear)


class StandInPod(Protocol):
    """What the stand-in needs of a pod: where it listens, its readiness probe, and its stop."""

    name: str

    @property
    def address(self) -> str: ...

    @property
    def port(self) -> int: ...

    def ready(self) -> bool: ...

    def stop(self) -> None: ...


P = TypeVar("P", bound=StandInPod)


class KubeletStandIn(Generic[P]):
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        deployment: str,
        service: str,
        port_name: str,
        *,
        pod: Callable[[str], P],
        start_delay: float,
        pre_stop: float,
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._deployment = deployment
        self._service = service
        self._port_name = port_name
        self._start_delay = start_delay
        self._pre_stop = pre_stop
        self._new_pod = pod
        self._slices = f"/apis/{ENDPOINTSLICE_API}/namespaces/{namespace}/endpointslices"
        self.events: list[tuple[float, str, Any]] = []
        self.pods: list[P] = []  # every pod ever started, in order
        self._running: list[P] = []  # started and not terminating
        self._wanted = 0
        self._changed = threading.Condition()
        self._closed = False
        self._stoppers: list[threading.Thread] = []
        self._worker = threading.Thread(target=self._work, daemon=True, name="kubelet stand-in")
        self._worker.start()
        path = f"/apis/apps/v1/namespaces/{namespace}/deployments?fieldSelector=metadata.name%3D{deployment}"
        self._watch = Watch(kube, path, self._deployment_event)

    def _record(self, what: str, detail: Any) -> None:
        self.events.append((time.time(), what, detail))

    def _deployment_event(self, kind: str, obj: dict[str, Any], at: float) -> None:
        replicas = 0 if kind == "DELETED" else int(obj.get("spec", {}).get("replicas", 0))
        with self._changed:
            if replicas != self._wanted:
                self.events.append((at, "replicas", replicas))
                self._wanted = replicas
                self._changed.notify()

    def _work(self) -> None:
        """Start or stop one pod at a time until as many run as are wanted (the API is called outside the lock:
        the Deployment's events keep arriving meanwhile)."""
        while True:
            with self._changed:
                while not self._closed and len(self._running) == self._wanted:
                    self._changed.wait()
                if self._closed:
                    return
                stopping = self._running.pop() if len(self._running) > self._wanted else None
            if stopping is not None:
                self._terminate(stopping)
                continue
            time.sleep(self._start_delay)  # the container starting, its readiness probe not passed yet
            with self._changed:
                if self._closed or len(self._running) >= self._wanted:
                    continue
                pod = self._new_pod(f"{self._deployment}-{len(self.pods) + 1}")
                self.pods.append(pod)
                self._running.append(pod)
            # Probed until ready even if no longer wanted meanwhile: the next turn terminates it, as kubelet would.
            while not pod.ready():
                if self._closed:
                    return
                time.sleep(PROBE_PERIOD)
            ready_at = time.time()  # before the write: a switch timed from here includes the write itself
            self._kube.request("POST", self._slices, self._slice(pod, terminating=False))
            self.events.append((ready_at, "ready", pod.name))

    def _terminate(self, pod: P) -> None:
        path = f"{self._slices}/{self._slice_name(pod)}"
        self._kube.request("PUT", path, self._slice(pod, terminating=True))
        self._record("terminating", pod.name)
        stopper = threading.Thread(target=self._stop_after_pre_stop, args=(pod, path), daemon=True)
        self._stoppers.append(stopper)
        stopper.start()

    def _stop_after_pre_stop(self, pod: P, path: str) -> None:
        time.sleep(self._pre_stop)
        pod.stop()
        self._record("stopped", pod.name)
        self._kube.delete(path)

    def _slice_name(self, pod: P) -> str:
        return f"{self._service}-{pod.name}"

    def _slice(self, pod: P, *, terminating: bool) -> dict[str, Any]:
        conditions = {"ready": not terminating, "serving": True, "terminating": terminating}
        port = {"name": self._port_name, "port": pod.port, "protocol": "TCP", **self._app_protocol()}
        return {
            "apiVersion": ENDPOINTSLICE_API,
            "kind": "EndpointSlice",
            "metadata": {
                "name": self._slice_name(pod),
                "namespace": self._namespace,
                "labels": {
                    "kubernetes.io/service-name": self._service,
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                },
            },
            "addressType": "IPv4",
            "ports": [port],
            "endpoints": [
                {
                    "addresses": [pod.address],
                    "conditions": conditions,
                    "targetRef": {"kind": "Pod", "namespace": self._namespace, "name": pod.name},
                }
            ],
        }

    def _app_protocol(self) -> dict[str, str]:
        """The Service port's appProtocol, if it has one, as the EndpointSlice controller copies it into the slice."""
        service = self._kube.get(f"/api/v1/namespaces/{self._namespace}/services/{self._service}")
        (port,) = [port for port in service["spec"]["ports"] if port.get("name") == self._port_name]
        return {"appProtocol": port["appProtocol"]} if "appProtocol" in port else {}

    def close(self) -> None:
        """Stop following the Deployment; stop every pod and remove its endpoint."""
        self._watch.close()
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._worker.join(timeout=10)
        for stopper in self._stoppers:
            stopper.join(timeout=self._pre_stop + 10)
        for pod in self._running:
            pod.stop()
            self._kube.delete(f"{self._slices}/{self._slice_name(pod)}")
