"""The external.metrics.k8s.io HTTPS API server: discovery, the list call, errors, health, authn/authz."""
