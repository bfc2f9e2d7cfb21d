"""`zeroscale demo`: Redis, the adapter, the proxy and two sample workloads on loopback, scaled by adapter/hpa.

Development only: the workloads are local processes (a `Local` scale target), not Kubernetes objects.
"""
