"""Blobs and attempt logs: the interface (base.py), the embedded store in the data dir (files.py), and
the S3-compatible store every replica reaches (s3.py, s3_logs.py; docs/adr/0044-blobs-on-s3.md)."""
from .base import Blobs, Logs
from .files import CHUNK, URI_PREFIX, BlobRef, BlobStore, BlobUpload, LogState, LogStore, check_digest, digest_of_uri

__all__ = ["CHUNK", "URI_PREFIX", "BlobRef", "BlobStore", "Blobs", "Logs", "BlobUpload", "LogState", "LogStore", "check_digest",
           "digest_of_uri"]
