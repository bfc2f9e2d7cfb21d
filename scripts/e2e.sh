#!/usr/bin/env bash
# `make e2e`: the end-to-end tests against a real control plane (../shared/k8s: kube-apiserver with its
# aggregator, kube-controller-manager with its HPA controller, v1.20.2). Builds it unless cached in
# ~/.cache/zeroscale-k8s (8-12 min on a fresh machine, then nothing), brings it up, runs tests/e2e, and
# brings it down whatever happens. Each scenario prints its timeline at the end. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
k8s="${ZS_K8S_SCRIPTS:-$(cd .. && pwd)/shared/k8s}"
[ -x "$k8s/up" ] || { echo "e2e: no control plane scripts in $k8s (set ZS_K8S_SCRIPTS)" >&2; exit 1; }
export ZS_K8S_SCRIPTS="$k8s" ZEROSCALE_E2E=1

"$k8s/build"
trap '"$k8s/down" >/dev/null 2>&1 || true' EXIT
"$k8s/up"
# A base directory of our own: pytest prunes old ones under the shared default while other runs use them.
basetemp="$(mktemp -d "${TMPDIR:-/tmp}/zeroscale-e2e.XXXXXX")"
export ZEROSCALE_E2E_TIMELINES="$basetemp/timelines.txt"
status=0
.venv/bin/pytest tests/e2e -q -p no:cacheprovider --basetemp="$basetemp/pytest" "$@" || status=$?
if [ "$status" -eq 0 ]; then
  rm -rf "$basetemp"
else
  echo "e2e: failed; logs of zeroscale, Kafka and Redis are under $basetemp/pytest," \
    "the control plane's under ${ZS_K8S_HOME:-$HOME/.cache/zeroscale-k8s}/run (removed by the next up)" >&2
fi
exit "$status"
