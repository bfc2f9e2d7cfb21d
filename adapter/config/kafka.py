"""The `kafka` source (a cluster to read) and its `consumer_lag` metric (docs/protocols.md#kafka-lag)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from adapter.config.base import Duration, MetricBase, SecretFile, SourceBase, Strict, TLSClientFiles


class KafkaSasl(Strict):
    """SASL authentication; the password (and, if wanted, the user name) come from files."""

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    """The SASL mechanism."""
    username: str | SecretFile
    """The user name, written here or read from a file."""
    password: SecretFile
    """The password, read from a file."""

    def read_username(self) -> str:
        return self.username if isinstance(self.username, str) else self.username.read()


class KafkaSource(SourceBase):
    type: Literal["kafka"]
    """`kafka`: a Kafka cluster's consumer groups."""
    bootstrap_servers: list[str] = Field(min_length=1)
    """Brokers to ask for the cluster's metadata, as `host:port`."""
    client_id: str = "zeroscale"
    """The client id sent to the brokers."""
    tls: TLSClientFiles | None = None
    """Present (even empty, `tls: {}`) means TLS towards the brokers, verified with the system CAs by default."""
    sasl: KafkaSasl | None = None
    """SASL authentication; unset: none."""
    request_timeout: Duration = 5.0
    """Below cache.query_timeout, so a broker that does not answer is reported as such."""
    metadata_max_age: Duration = 5.0
    """One cluster metadata read serves every group for this long (docs/protocols.md#kafka-requests)."""
    offsets_max_age: Duration = 5.0
    """One read of a group's offsets serves every series of that group for this long: one read per group per refresh
    interval (the default is cache.interval's)."""
    poll_interval: Duration = Field(default=0.8, gt=0)
    """While series read a group, its offsets are read this often in one round with every other watched group, and a
    change wakes the group's series at once: the lag shows within about this long. A round reuses the metadata
    (metadata_max_age), so it costs one OffsetFetch per coordinator and two ListOffsets per leader: at 0.8s that is no
    more than one full refresh's requests per second."""
    persistent_lag_window: Duration = Field(default=5.0, ge=0)
    """With exclude_persistent_lag, a partition's lag is persistent when its commit did not move over this long:
    compared with the read at least this much older, whether a series is evaluated every interval or woken by the poller
    at each change (0: the read before). A consumer committing less often than this looks stuck between its commits."""
    partition_lag_series_limit: int = Field(default=10_000, ge=0)
    """Bound on the per-partition series this source exports to Prometheus: per partition read, its committed offset,
    log start and log end, plus the lag per metric reading it."""


# The selector labels a consumer_lag metric understands.
KAFKA_LABELS = ("group", "topic", "partition")


class KafkaMetric(MetricBase):
    """Total consumer-group lag, with KEDA's `kafka` trigger parameters (docs/protocols.md#kafka-lag), snake_case.

    The HPA's selector gives `group` (required), `topic` (optional; default: every topic the group
    has committed offsets for) and `partition` (optional: numbers or ranges like `0-9`); each must be
    declared under `labels:` with the values it may take.
    """

    type: Literal["kafka"]
    """`kafka`: read from a `kafka` source."""
    query: Literal["consumer_lag"] = "consumer_lag"
    """`consumer_lag`: the group's total lag."""
    offset_reset_policy: Literal["latest", "earliest"] = "latest"
    """Where a partition without a valid committed offset is counted from, as the consumer would restart: latest (lag 1)
    or earliest (its whole log)."""
    lag_threshold: int = Field(default=10, gt=0)
    """The lag one consumer is expected to handle (KEDA's lagThreshold): the total is capped at this times the
    partitions that could have a consumer."""
    activation_lag_threshold: int = Field(default=0, ge=0)
    """The workload is active when the lag is above this (KEDA's activationLagThreshold)."""
    allow_idle_consumers: bool = False
    """Do not cap the total at one consumer per partition."""
    exclude_persistent_lag: bool = False
    """Leave out the lag of partitions whose commit did not move over persistent_lag_window (a stuck consumer does not
    keep the group scaled up)."""
    limit_to_partitions_with_lag: bool = False
    """Cap the total at one consumer per partition with lag, not per partition."""
    ensure_even_distribution_of_partitions: bool = False
    """Round the total so the consumers divide the partitions evenly."""
    scale_to_zero_on_invalid_offset: bool = False
    """Count a partition without a valid committed offset as lag 0."""

    @model_validator(mode="before")
    @classmethod
    def _activation_from_lag(cls, data: Any) -> Any:
        # KEDA activates when lag > activation_lag_threshold; the shared rule is "value >= threshold",
        # the same thing for whole numbers of messages.
        if isinstance(data, dict) and "activation_threshold" not in data:
            lag = data.get("activation_lag_threshold", 0)
            if isinstance(lag, int) and not isinstance(lag, bool):
                data = {**data, "activation_threshold": lag + 1}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> KafkaMetric:
        unknown = sorted(set(self.labels) - set(KAFKA_LABELS))
        if unknown:
            raise ValueError(f"labels {unknown} mean nothing to a kafka metric (it reads {', '.join(KAFKA_LABELS)})")
        group = self.labels.get("group")
        if group is None or not group.required:
            raise ValueError("labels.group must be declared with required: true (the HPA selects the group)")
        if self.allow_idle_consumers and self.limit_to_partitions_with_lag:
            raise ValueError("allow_idle_consumers and limit_to_partitions_with_lag cannot both be true")
        if self.allow_idle_consumers and self.ensure_even_distribution_of_partitions:
            raise ValueError("allow_idle_consumers and ensure_even_distribution_of_partitions cannot both be true")
        return self
