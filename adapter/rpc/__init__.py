"""gRPC server machinery shared by both processes (TLS, guards, connection limits) and the generated stubs."""
