"""The committed generated code is what the .proto files produce, and the .proto matches
docs/protocols.md#keda-external-scaler field for field."""

from __future__ import annotations

from pathlib import Path

from adapter.rpc.codegen import PACKAGE_PATH, REPO_ROOT, generate
from adapter.rpc.generated import externalscaler_pb2 as pb


def test_regenerating_gives_the_committed_files(tmp_path: Path) -> None:
    written = generate(tmp_path)
    assert written, "protoc wrote nothing"
    committed = sorted(p for p in (REPO_ROOT / PACKAGE_PATH).iterdir() if p.suffix in (".py", ".pyi"))
    committed = [p for p in committed if p.name != "__init__.py"]
    assert [p.name for p in written] == [p.name for p in committed]
    for fresh, old in zip(written, committed, strict=True):
        assert fresh.read_bytes() == old.read_bytes(), f"{old} is stale: run python -m adapter.rpc.codegen"


# docs/protocols.md#keda-external-scaler, as a table: message -> {field: (number, type, label)}.
_DOUBLE, _INT64, _STRING, _BOOL, _MESSAGE = 1, 3, 9, 8, 11
SPEC_FIELDS = {
    "ScaledObjectRef": {"name": (1, _STRING), "namespace": (2, _STRING), "scalerMetadata": (3, _MESSAGE)},
    "IsActiveResponse": {"result": (1, _BOOL)},
    "GetMetricSpecResponse": {"metricSpecs": (1, _MESSAGE)},
    "MetricSpec": {"metricName": (1, _STRING), "targetSize": (2, _INT64), "targetSizeFloat": (3, _DOUBLE)},
    "GetMetricsRequest": {"scaledObjectRef": (1, _MESSAGE), "metricName": (2, _STRING)},
    "GetMetricsResponse": {"metricValues": (1, _MESSAGE)},
    "MetricValue": {"metricName": (1, _STRING), "metricValue": (2, _INT64), "metricValueFloat": (3, _DOUBLE)},
}
SPEC_METHODS = {
    "IsActive": ("ScaledObjectRef", "IsActiveResponse", False),
    "StreamIsActive": ("ScaledObjectRef", "IsActiveResponse", True),
    "GetMetricSpec": ("ScaledObjectRef", "GetMetricSpecResponse", False),
    "GetMetrics": ("GetMetricsRequest", "GetMetricsResponse", False),
    "StreamMetricSpec": ("ScaledObjectRef", "GetMetricSpecResponse", True),
}


def test_messages_match_spec_6() -> None:
    assert pb.DESCRIPTOR.package == "externalscaler"
    for message, fields in SPEC_FIELDS.items():
        descriptor = pb.DESCRIPTOR.message_types_by_name[message]
        got = {f.name: (f.number, f.type) for f in descriptor.fields}
        assert got == fields, message
    metadata = pb.ScaledObjectRef.DESCRIPTOR.fields_by_name["scalerMetadata"].message_type
    assert metadata.GetOptions().map_entry
    assert [f.type for f in metadata.fields] == [_STRING, _STRING]
    repeated = {("GetMetricSpecResponse", "metricSpecs"), ("GetMetricsResponse", "metricValues")}
    for message, field in repeated:
        assert pb.DESCRIPTOR.message_types_by_name[message].fields_by_name[field].is_repeated


def test_service_and_method_paths_match_spec_6() -> None:
    service = pb.DESCRIPTOR.services_by_name["ExternalScaler"]
    assert service.full_name == "externalscaler.ExternalScaler"
    got = {m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in service.methods}
    assert got == SPEC_METHODS
    assert not any(m.client_streaming for m in service.methods)
