"""Helm post-renderer of the Helm scenario (tests/e2e/test_10_helm.py): what a cluster without kube-proxy forces.

Reads the chart's rendered manifests on stdin and writes them back with one change: the adapter's Service
becomes an ExternalName to `localhost` on PORT (argument 1), and the APIService names that port, because the
aggregator dials a ClusterIP no kube-proxy routes here but dials an ExternalName's name. Everything else (RBAC,
Secrets, ConfigMap, Deployments, the APIService's caBundle) is the chart's, unchanged. Helm's documented
mechanism for local changes to a chart's output; install.py does the same for the kustomize manifests.
"""

from __future__ import annotations

import sys

import yaml


def main() -> None:
    port = int(sys.argv[1])
    documents = [doc for doc in yaml.safe_load_all(sys.stdin) if doc]
    (apiservice,) = [doc for doc in documents if doc["kind"] == "APIService"]
    service_name = apiservice["spec"]["service"]["name"]
    for doc in documents:
        if doc["kind"] == "Service" and doc["metadata"]["name"] == service_name:
            doc["spec"] = {
                "type": "ExternalName",
                "externalName": "localhost",
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            }
    apiservice["spec"]["service"]["port"] = port
    yaml.safe_dump_all(documents, sys.stdout)


if __name__ == "__main__":
    main()
