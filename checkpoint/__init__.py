"""Snapshot and restore of paths as tar.zst with manifests; a library with no knowledge of jobs."""
