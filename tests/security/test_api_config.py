"""Issue 12 items 7 and 10: no credential in a URL of the config, in any part; a credential file that
cannot be read is a configuration error at load, named by its key path, for every source."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from adapter.config.kube import KubeAPIConfig
from adapter.config.redis import RedisSource


@pytest.mark.parametrize(
    "url",
    [
        "redis://a:6379/0?password=hunter2",
        "redis://a:6379/0?db=1&PASSWORD=hunter2",
        "rediss://a:6379?username=u&password=hunter2",
        "redis://a:6379?pass%77ord=hunter2",
        "redis://a:6379#password=hunter2",
        "redis://user:hunter2@a:6379",
        "redis://:hunter2@a:6379",
    ],
)
def test_a_redis_url_with_a_password_in_any_part_is_refused(url: str) -> None:
    with pytest.raises(ValidationError, match="url must not hold a password") as refused:
        RedisSource(type="redis", name="q", url=url)
    assert "hunter2" not in str(refused.value.errors()[0]["msg"])


@pytest.mark.parametrize(
    "url", ["https://k:6443?token=abc", "https://admin:pw@k:6443", "https://k:6443/?access_token=x"]
)
def test_a_kubernetes_url_with_a_credential_is_refused(url: str) -> None:
    with pytest.raises(ValidationError, match="url must not hold a credential"):
        KubeAPIConfig(url=url)


def test_a_plain_url_is_accepted() -> None:
    assert RedisSource(type="redis", name="q", url="redis://a:6379/0?protocol=3").url is not None


def _check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapter", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("source", "key"),
    [
        (
            "{name: jobs, type: redis, url: 'redis://127.0.0.1:1', password: {file: MISSING}}",
            "sources[0].password.file",
        ),
        (
            "{name: jobs, type: redis, url: 'redis://127.0.0.1:1', tls: {ca_file: MISSING}}",
            "sources[0].tls.ca_file",
        ),
        (
            "{name: jobs, type: kafka, bootstrap_servers: ['127.0.0.1:1'], "
            "sasl: {mechanism: PLAIN, username: u, password: {file: MISSING}}}",
            "sources[0].sasl.password.file",
        ),
    ],
)
def test_a_missing_secret_file_is_a_config_error_named_by_its_key(tmp_path: Path, source: str, key: str) -> None:
    missing = tmp_path / "no-such-secret"
    config = tmp_path / "zeroscale.yaml"
    config.write_text(f"sources:\n  - {source.replace('MISSING', str(missing))}\n")
    result = _check(config)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"config error: {config}: {key}: cannot read {missing}: No such file or directory" in result.stderr


def test_a_secret_path_that_is_a_directory_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "zeroscale.yaml"
    auth = f"{{enabled: true, kubernetes: {{url: 'https://127.0.0.1:1', token_file: {tmp_path}}}}}"
    config.write_text(f"server:\n  auth: {auth}\n")
    result = _check(config)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "server.auth.kubernetes.token_file: cannot read" in result.stderr


def test_a_yaml_error_does_not_repeat_a_credential_on_its_line(tmp_path: Path) -> None:
    config = tmp_path / "zeroscale.yaml"
    # "mapping values are not allowed here", quoting the line around the column.
    config.write_text("sources:\n  - name: q\n    url: redis://u:hunter2@h/0?password=hunter3 x: y\n")
    result = _check(config)
    assert result.returncode == 2
    assert "not valid YAML" in result.stderr
    assert "password=[redacted]" in result.stderr
    assert "hunter3" not in result.stderr
