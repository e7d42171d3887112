"""The REST gateway: a thin Kubernetes-style HTTP layer over the resource service (no storage here)."""
