"""Why an image pull failed, and whose fault it is.

A pull the node could not do (its disk, its network) counts as lost capacity: the attempt is
replaced elsewhere. A pull the customer's image or credentials broke fails the attempt with a
reason naming `spec.image` and the fix; another node would fail the same way.
"""
from __future__ import annotations

import enum
import re


class Fault(enum.Enum):
    NODE = "Node"
    """The node could not pull (disk full, registry unreachable from here): lost capacity, placed elsewhere."""
    CUSTOMER = "Customer"
    """The image or its credentials are wrong: every node would fail the same way."""


class ImagePullError(Exception):
    """The root of the pull failures: `reason` is the stable code the Attempt's status carries."""

    reason = "ImagePullFailed"
    fault = Fault.NODE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def lost_capacity(self) -> bool:
        return self.fault is Fault.NODE


class NotFound(ImagePullError):
    reason = "ImageNotFound"
    fault = Fault.CUSTOMER


class Unauthorized(ImagePullError):
    reason = "ImageUnauthorized"
    fault = Fault.CUSTOMER


class DigestMismatch(ImagePullError):
    """A blob whose bytes do not hash to the digest that names it. The registry's fault (the customer's
    image as served) unless `fault` says the node's own cache went bad."""

    reason = "ImageDigestMismatch"
    fault = Fault.CUSTOMER

    def __init__(self, message: str, fault: Fault = Fault.CUSTOMER) -> None:
        super().__init__(message)
        self.fault = fault


class DiskFull(ImagePullError):
    reason = "ImageDiskFull"
    fault = Fault.NODE


class Unreachable(ImagePullError):
    reason = "ImageRegistryUnreachable"
    fault = Fault.NODE


class InvalidReference(ImagePullError):
    """A reference the agent refuses before any traffic (no digest, bad syntax)."""

    reason = "InvalidImageReference"
    fault = Fault.CUSTOMER


# skopeo's (containers/image's) messages, most specific first: a digest mismatch mentions reading,
# an unauthorized answer may mention the manifest.
_PATTERNS: tuple[tuple[re.Pattern[str], type[ImagePullError], str], ...] = (
    (re.compile(r"digest did not match|digest mismatch|digest \S+ does not match expected", re.I), DigestMismatch,
     "the registry served a blob whose sha256 differs from its digest; push the image again"),
    (re.compile(r"no space left on device|disk quota exceeded", re.I), DiskFull,
     "the node's image cache has no room"),
    # "denied" as registries say it, not the cache's own "permission denied" (the node's fault)
    (re.compile(r"unauthorized|authentication required|(?<!permission )denied|403 forbidden", re.I), Unauthorized,
     "the registry refused the credentials; name a Secret with access in spec.imagePullSecrets"),
    # 404 as a status, not inside a number: a registry on port 40441 that refused the connection is unreachable
    (re.compile(r"manifest unknown|name unknown|blob unknown|not found|(?<![\w.:])404(?!\w)", re.I), NotFound,
     "the registry has no such image; check spec.image"),
    (re.compile(r"connection refused|no such host|i/o timeout|timeout|network is unreachable|"
                r"connection reset|tls: |server gave HTTP response to HTTPS client|pinging container registry",
                re.I), Unreachable, "the registry cannot be reached from this node"),
)


def classify(stderr: str, what: str) -> ImagePullError:
    """The typed failure for skopeo's error text about `what` (an image reference)."""
    detail = _last_message(stderr)
    for pattern, kind, fix in _PATTERNS:
        if pattern.search(detail):
            return kind(f"{what}: {fix} ({detail})")
    return ImagePullError(f"{what}: {detail}")


def _last_message(stderr: str) -> str:
    """The `msg="..."` of skopeo's fatal line, else its last non-empty line."""
    found = re.findall(r'msg="((?:[^"\\]|\\.)*)"', stderr)
    if found:
        return found[-1].replace('\\"', '"')
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else "skopeo failed without a message"
