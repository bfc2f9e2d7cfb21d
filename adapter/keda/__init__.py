"""KEDA's external scaler: the gRPC service KEDA calls (`externalscaler.ExternalScaler`), answered from
the metric cache. It stands on adapter/rpc/ (the gRPC server machinery and the generated stubs)."""
