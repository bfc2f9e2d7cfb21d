"""Zeroscale: scale-to-zero for the Kubernetes HorizontalPodAutoscaler.

Each command of `zeroscale` (adapter/cli.py) and the packages it uses; the two long-running processes have
a composition root at this level that builds and tears down everything they run:

- `serve` (adapter/serve.py): api/ (the external metrics API), keda/ (KEDA's external scaler), rpc/ (gRPC
  servers), metrics/ (the series cache), sources/ (kafka/, redis/, proxy_counts/), kube/ (TokenReview,
  SubjectAccessReview, the trust bundle).
- `proxy` (adapter/proxy_main.py): proxy/ (the buffering proxy and its counts stream), rpc/, kube/
  (EndpointSlices, HPAs, the scale subresource). `proxy --route-for` (proxy/dry_run.py) serves nothing: it
  routes one request over the config file's routes and says why.
- `check` (check.py): sources/. `certs` (certs.py). `explain` (hpa/explain.py): hpa/.
  `doctor` (doctor/): kube/. `demo` (demo/): hpa/, kube/ and the `serve` and `proxy` processes.

Under all of them: config/ (every config model), telemetry/ (every Prometheus metric), and k8s_wire/
(label selectors and quantities) at the bottom; argtypes.py holds the argparse types the commands share.
tests/core/test_layering.py keeps the package graph acyclic.
"""

import os
from importlib.metadata import PackageNotFoundError, version

# gRPC's C core writes a line to stderr for every failed TLS handshake, unthrottled and outside our
# logging, some at ERROR level (a client naming an unknown server name): any peer could fill the log at
# will. So it says nothing; what fails reaches us as exceptions, status codes and our own metrics. It
# reads this once, when grpc is first imported, and every entry point imports this package first. An
# operator's own GRPC_VERBOSITY wins (for debugging).
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

try:
    __version__ = version("zeroscale")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
