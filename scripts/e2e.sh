#!/usr/bin/env bash
# `make e2e`: the end-to-end tests against a real Kubernetes control plane that this repository builds
# itself (scripts/k8s: kube-apiserver with its aggregator, kube-controller-manager with its HPA controller,
# etcd; v1.37.2 as pinned in scripts/k8s/kubernetes/go.mod, or K8S_VERSION=x.y.z for another v1.33+).
# Builds it, and KEDA v2.21 (scripts/keda), unless cached in ~/.cache/zeroscale-k8s (about 20-40 min and
# 15 min on a fresh 2-core machine, then nothing), brings it up, runs tests/e2e, and brings it down whatever
# happens. Each scenario prints its
# timeline at the end. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export ZEROSCALE_E2E=1
scripts/k8s/build >/dev/null
# KEDA's operator and metrics server for tests/e2e/test_2x_keda* (scripts/keda: ~15 min cold, cached after).
scripts/keda/build >/dev/null
trap 'scripts/k8s/down >/dev/null 2>&1 || true' EXIT
scripts/k8s/up
# A base directory of our own: pytest prunes old ones under the common default while other runs use them.
basetemp="$(mktemp -d "${TMPDIR:-/tmp}/zeroscale-e2e.XXXXXX")"
export ZEROSCALE_E2E_TIMELINES="$basetemp/timelines.txt"
status=0
.venv/bin/pytest tests/e2e -q -p no:cacheprovider --basetemp="$basetemp/pytest" "$@" || status=$?
if [ "$status" -eq 0 ]; then
  rm -rf "$basetemp"
else
  echo "e2e: failed; logs of zeroscale, Kafka and Redis are under $basetemp/pytest," \
    "the control plane's under ${ZS_K8S_HOME:-$HOME/.cache/zeroscale-k8s}/run (replaced by the next up)" >&2
fi
exit "$status"
