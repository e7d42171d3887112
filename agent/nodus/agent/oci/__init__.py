"""The OCI runtime: an attempt's steps as runc containers in one pod.

`bundle` turns a step's request and its image's config into the OCI runtime spec (pure), `runc`
wraps the runc CLI with typed failures, `pod` holds the pod's namespaces, id range and writable
layers and runs the steps (docs/adr/0020-oci-pods.md). `images` (pull, verify, unpack) is beside them.
"""
