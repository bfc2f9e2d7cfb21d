"""Every Prometheus metric Zeroscale exports, defined once, one module per part.

Names carry their unit (`_seconds`, `_bytes`) and counters end in `_total`, per
Prometheus conventions. All live in the default registry, served on the metrics port.
"""
