"""Kubernetes API machinery this project speaks on the wire: label selectors and resource quantities.

The bottom of the package graph: it imports nothing else from adapter/, and the API server, the HPA
algorithm, the metrics cache and the sources all use it (tests/core/test_layering.py checks the graph).
"""
