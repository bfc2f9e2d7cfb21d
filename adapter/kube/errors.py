"""The errors of the Kubernetes client: one base class, so a caller can catch every failure at once."""

from __future__ import annotations


class KubeError(Exception):
    """Any failure talking to the Kubernetes API."""


class KubeConfigError(KubeError):
    """Where the API server is, or how to authenticate to it, could not be worked out."""


class KubeConnectionError(KubeError):
    """The API server could not be reached, or the connection broke before a whole answer."""


class KubeWatchSilent(KubeConnectionError):
    """A watch stream sent nothing (no event, no bookmark) for the client's watch_silence_timeout: taken for dead,
    though its connection may still look open (docs/architecture.md#staleness-bounds)."""


class KubeAPIError(KubeError):
    """The API server answered with an error; `message` and `reason` come from its metav1.Status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class ResponseTooLarge(KubeConnectionError):
    """An answer larger than the client's `max_response_bytes`."""
