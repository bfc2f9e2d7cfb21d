"""The proxy's pending-request counts (config `type: http`, a name kept for compatibility): every proxy
replica's held and in-flight requests per route, streamed over gRPC. `source.ProxyCounts` is the entry.

Empty on purpose, like every source package. Its config models live in adapter/config/http.py.
"""
