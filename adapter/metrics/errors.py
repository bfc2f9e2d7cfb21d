"""Why a metric read failed, with the HTTP status and `metav1.Status` reason the API answers with."""

from __future__ import annotations


class MetricError(Exception):
    code = 500
    reason = "InternalError"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class MetricNotFound(MetricError):
    code = 404
    reason = "NotFound"


class BadSelector(MetricError):
    code = 400
    reason = "BadRequest"


class MetricUnavailable(MetricError):
    """The source failed and no value young enough remains; the HPA keeps its current size."""

    code = 503
    reason = "ServiceUnavailable"
