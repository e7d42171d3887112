"""The control plane: API types and admission, store, resource service, REST gateway, gRPC services."""
