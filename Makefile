# Two commands a newcomer needs: `make demo` runs Zeroscale, `make test` runs the tests.
# Each sets up everything it needs first (Debian packages, a virtual environment, Kafka's jars, Helm built from its
# pinned Go module into ~/.cache/zeroscale-helm: the chart tests run it); `make test` also builds Jaeger the same way
# (~/.cache/zeroscale-jaeger: the tracing tests read traces back from it).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo serve test e2e lint perf setup system-packages clean

$(STAMP): pyproject.toml
	./scripts/setup-system.sh
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)
	./scripts/kafka/fetch.sh >/dev/null
	./scripts/helm/build >/dev/null

# Redis, the adapter, the proxy and two sample workloads on loopback, scaled from zero and back by
# the v1.37 HPA algorithm; ends with a summary and the HTML report's path. DEMO_ARGS="--with-kafka" etc.
demo: setup
	$(VENV)/bin/zeroscale demo $(DEMO_ARGS)

# The adapter alone on the local example config (loopback, no auth).
serve: setup
	$(VENV)/bin/zeroscale serve --config deploy/local/zeroscale.yaml

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Jaeger (tests/fixtures/jaeger.py reads traces back from it) is built here, not in setup: the demo needs it only
# with --with-jaeger, and builds it then.
test: setup lint
	./scripts/jaeger/build >/dev/null
	$(VENV)/bin/pytest -q -p no:cacheprovider

# End-to-end tests in a real Kubernetes control plane the repository builds itself (scripts/k8s: v1.37.2 from
# its pinned Go modules, built once into ~/.cache/zeroscale-k8s); K8S_VERSION=x.y.z tries another v1.33+.
# `make test` skips tests/e2e (they run only with ZEROSCALE_E2E=1, which this sets).
e2e: setup
	K8S_VERSION=$(K8S_VERSION) ./scripts/e2e.sh

clean:
	rm -rf $(VENV) build *.egg-info
