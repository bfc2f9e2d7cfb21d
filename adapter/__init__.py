"""Zeroscale: scale-to-zero for the Kubernetes HorizontalPodAutoscaler."""

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
