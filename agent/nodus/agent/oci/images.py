"""The node's image store: pull by digest, verify, cache content-addressed, unpack once, collect.

On disk, under the cache directory the agent owns:

    blobs/sha256/<hex>           every blob of every image, once (also skopeo's shared blob dir)
    images/<hex>/layout/         the image's OCI layout (index.json; its blobs/ links to the shared one)
    images/<hex>/rootfs          the image unpacked by umoci, shared read-only by the image's attempts
    images/<hex>/image.json      written last: an image is in the cache once this file exists
    images/.<hex>.<random>/      a pull in flight (renamed to images/<hex> when complete)

<hex> is the image manifest's digest. One agent owns the directory; pulls of different images run
in parallel, two pulls of one digest share the first one's work. An OCI image's blobs are fetched here
(distribution.py, ADR 0092); what that path defers goes through `skopeo copy` (ADR 0019). `pull` blocks
(blocking HTTP, umoci is a process): the agent calls it in a worker thread, as it does the inputs.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import secrets
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection

import orjson

from ..clock import Clock
from .bundle import ImageConfig
from .distribution import OCI_MANIFEST, Blob, Deferred, Distribution
from .pull_errors import DigestMismatch, DiskFull, Fault, ImagePullError, NotFound, Unreachable
from .skopeo import ImageReference, RegistryCredentials, Skopeo
from .usage import Footprint, disk_usage, evictions

log = logging.getLogger(__name__)

TAG = "image"
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
PROGRESS_INTERVAL = 0.2
"""Seconds between progress reports while blobs stream in."""


@dataclass(frozen=True, slots=True)
class PullProgress:
    """Bytes of the image's blobs (config and layers, compressed, as the manifest sizes them) on disk."""

    done: int
    total: int


ProgressCallback = Callable[[PullProgress], None]
"""Called from the pull's progress thread while blobs stream in, and once more at the total."""


@dataclass(frozen=True, slots=True)
class PulledImage:
    """An image ready for a bundle."""

    digest: str
    """The image manifest's digest: the cache key and what the attempt reports it ran."""
    rootfs: Path
    """The unpacked tree; never written (containers get a writable layer over it)."""
    config: ImageConfig
    cached: bool
    """True when the cache already held it (no registry traffic)."""


@dataclass(frozen=True, slots=True)
class Descriptor:
    digest: str
    size: int


@dataclass(frozen=True, slots=True)
class Platform:
    """The platform an index (manifest list) is resolved for: the node's."""

    os: str = "linux"
    architecture: str = "amd64"


class ImageStore:
    """Images this node has pulled. `in_use` answers which manifest digests the node's attempts need (the
    agent derives it from its attempts, so it holds across a restart): an attempt counts from before its
    pull until it ends, so an image pulled for it is not collected before its container starts."""

    def __init__(self, cache_dir: Path, disk_budget: int, clock: Clock, in_use: Callable[[], Collection[str]],
                 skopeo: Skopeo | None = None, platform: Platform = Platform(), umoci: str = "umoci",
                 stall_timeout: float = 120.0, distribution: Distribution | None = None,
                 direct: bool = True) -> None:
        self.root = cache_dir
        self.budget = disk_budget
        self.clock = clock
        self.in_use = in_use
        self.skopeo = skopeo or Skopeo()
        self.distribution = distribution or Distribution(insecure=self.skopeo.insecure)
        self.direct = direct
        """Fetch blobs in the agent (distribution.py) where it can; False: every pull through skopeo."""
        self.platform = platform
        self.umoci = umoci
        self.stall_timeout = stall_timeout
        """Seconds (of `clock`) a copy may go without a new byte before it counts as Unreachable: a large
        image on a slow link may take an hour, a stuck connection should not."""
        self.blobs = cache_dir / "blobs"
        self.images = cache_dir / "images"
        (self.blobs / "sha256").mkdir(parents=True, exist_ok=True)
        self.images.mkdir(parents=True, exist_ok=True)
        # images hold root-owned setuid files: no host user may reach them (the pod's overlay mounts the
        # tree with the agent's credentials, so containers do not need the path)
        os.chmod(cache_dir, 0o700)
        self._lock = threading.Lock()
        self._digest_locks: dict[str, threading.Lock] = {}
        self._pulling: dict[str, frozenset[str]] = {}
        """Manifest digest -> the blobs its pull needs: kept by collection while the pull runs."""
        self._started: dict[str, float] = {}
        """Manifest digest -> when its pull began (wall clock, as blob mtimes): collection keeps every blob
        written since the oldest running pull began, which may be that pull's own though it is in no manifest
        read yet (skopeo's OCI manifest of a Docker image it converts, written into the shared blobs)."""
        for leftover in self.images.glob(".*"):
            shutil.rmtree(leftover, ignore_errors=True)  # a pull a crash interrupted

    def pull(self, reference: str, credentials: RegistryCredentials | None = None,
             progress: ProgressCallback | None = None) -> PulledImage:
        """The image `reference` (registry/repo@sha256:...) unpacked, from the cache when it is there."""
        ref = ImageReference.parse(reference)
        ref.pinned()  # refuses a reference without a digest before anything else
        with self._digest_lock(ref.digest):
            hit = self._cached(ref.digest)
            if hit is not None:
                image, size = hit
                if progress:
                    progress(PullProgress(size, size))
                return image
            platform = self._fetch(ref, credentials, progress)
            if isinstance(platform, PulledImage):
                return platform
        # an index (manifest list): the node's platform's manifest, pulled as any other
        return self.pull(str(ref.with_digest(platform)), credentials, progress)

    def collect(self, room: int = 0, keep: Collection[str] = ()) -> int:
        """Removes images no attempt uses, least recently used first, until `room` more bytes fit under the
        budget; returns the bytes freed. Blobs no remaining image needs go with them."""
        with self._lock:
            protected = {*self.in_use(), *keep, *self._pulling}
            needed = set().union(*self._pulling.values()) if self._pulling else set()
            footprints = [f for f in (self._footprint(p) for p in self.images.iterdir()
                                      if not p.name.startswith(".")) if f is not None]
            blob_bytes = {f"sha256:{b.name}": b.stat().st_blocks * 512 for b in (self.blobs / "sha256").iterdir()}
            used = sum(blob_bytes.values()) + sum(f.rootfs_bytes for f in footprints)
            freed = 0
            for victim in evictions(footprints, protected, used + room - self.budget, blob_bytes):
                shutil.rmtree(self.images / victim.digest.removeprefix("sha256:"), ignore_errors=True)
                freed += victim.rootfs_bytes
            kept = [f for f in footprints if (self.images / f.digest.removeprefix("sha256:")).exists()]
            referenced = needed.union(*(f.blobs for f in kept))
            since = min(self._started.values(), default=None)
            for name, size in blob_bytes.items():
                if name not in referenced and not (since is not None and _written_since(self._blob(name), since)):
                    freed += size
                    self._blob(name).unlink(missing_ok=True)
            return freed

    def usage(self) -> int:
        """Bytes the cache holds now (blobs plus unpacked trees)."""
        footprints = [self._footprint(p) for p in self.images.iterdir() if not p.name.startswith(".")]
        return disk_usage(self.blobs) + sum(f.rootfs_bytes for f in footprints if f is not None)

    def _fetch(self, ref: ImageReference, credentials: RegistryCredentials | None,
               progress: ProgressCallback | None) -> PulledImage | str:
        """The image pulled, verified and unpacked; or, for an index, the digest of the platform's manifest."""
        hexd = ref.digest.removeprefix("sha256:")
        with self._lock:
            self._started[ref.digest] = time.time()
        staging = self.images / f".{hexd}.{secrets.token_hex(4)}"
        layout = staging / "layout"
        layout.mkdir(parents=True)
        present = set(os.listdir(self.blobs / "sha256"))
        try:
            fetched: tuple[list[Descriptor], int] | str | None = None
            if self.direct:
                try:
                    fetched = self._fetch_direct(ref, layout, present, credentials, progress)
                except Deferred as why:  # skopeo pulls it and, when it fails too, names why
                    log.info("%s: pulling through skopeo: %s", ref, why)
                    shutil.rmtree(layout)
                    layout.mkdir()
            if fetched is None:
                fetched = self._fetch_copy(ref, layout, present, credentials, progress)
            if isinstance(fetched, str):
                return fetched
            wanted, total = fetched
            if progress:
                progress(PullProgress(total, total))
            rootfs = staging / "rootfs"
            self._unpack(layout, rootfs, str(ref))
            image_config = orjson.loads(self._blob(wanted[0].digest).read_bytes())
            record = {"digest": ref.digest, "reference": str(ref), "blobs": sorted(self._pulling[ref.digest]),
                      "bytes": total, "rootfsBytes": disk_usage(rootfs), "lastUsed": self.clock.now(),
                      "config": image_config}
            _write_atomic(staging / "image.json", orjson.dumps(record))
            final = self.images / hexd
            try:
                staging.rename(final)
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)  # the same digest landed meanwhile: use that one
            self.collect(keep=(ref.digest,))
            return PulledImage(ref.digest, final / "rootfs", ImageConfig.from_oci(image_config), False)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(f"{ref}: the image cache's disk is full ({e})") from e
            raise ImagePullError(f"{ref}: {e}") from e
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            with self._lock:
                self._started.pop(ref.digest, None)
                failed = self._pulling.pop(ref.digest, None) is not None and not (self.images / hexd).exists()
            if failed:
                self.collect()  # what the failed copy fetched before it stopped

    def _fetch_copy(self, ref: ImageReference, layout: Path, present: set[str],
                    credentials: RegistryCredentials | None,
                    progress: ProgressCallback | None) -> tuple[list[Descriptor], int] | str:
        """Through `skopeo copy`, the manifest read meanwhile (ADR 0019); an index's platform digest."""
        with self.skopeo.copying(ref, layout, TAG, self.blobs, credentials) as running:
            # read while skopeo already fetches: the sizes matter only for the budget and the total
            raw = self.skopeo.manifest(ref, credentials)
            _verify_bytes(raw, ref.digest, str(ref))
            manifest = orjson.loads(raw)
            if manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
                return self._platform_manifest(manifest, str(ref))
            wanted = _descriptors(manifest, str(ref))
            total = sum(d.size for d in wanted)
            with self._lock:
                self._pulling[ref.digest] = frozenset({ref.digest, *(d.digest for d in wanted)})
            self._fit(ref, sum(d.size for d in wanted if d.digest.removeprefix("sha256:") not in present))
            self._wait_watching(ref, running.wait, lambda: self._copied(layout, wanted, total), running.kill,
                                total, progress)
        self._verify_reused(ref, layout, [d for d in wanted if d.digest.removeprefix("sha256:") in present],
                            wanted, credentials)
        return wanted, total

    def _fetch_direct(self, ref: ImageReference, layout: Path, present: set[str],
                      credentials: RegistryCredentials | None,
                      progress: ProgressCallback | None) -> tuple[list[Descriptor], int] | str:
        """The manifest and the blobs fetched here (ADR 0092), `workers` blobs at a time, each hashed as
        it streams; an OCI layout written for umoci. Deferred where skopeo must do it."""
        with self.distribution.session(ref, credentials) as session:
            raw, kind = session.manifest()
            _verify_bytes(raw, ref.digest, str(ref))
            manifest = orjson.loads(raw)
            if kind in INDEX_TYPES or "manifests" in manifest:
                return self._platform_manifest(manifest, str(ref))
            if kind != OCI_MANIFEST:
                raise Deferred(f"a {kind or 'schema 1'} manifest, which skopeo converts to OCI for umoci")
            wanted = _descriptors(manifest, str(ref))
            total = sum(d.size for d in wanted)
            with self._lock:
                self._pulling[ref.digest] = frozenset({ref.digest, *(d.digest for d in wanted)})
            # a blob already here is hashed before it is used; one that went bad is fetched again
            reused = [d for d in wanted if d.digest.removeprefix("sha256:") in present and
                      _blob_matches(self._blob(d.digest), d)]
            missing = [Blob(d.digest, d.size) for d in dict.fromkeys(wanted) if d not in reused]
            self._fit(ref, sum(d.size for d in missing))
            counted, count_lock = [sum(d.size for d in reused)], threading.Lock()

            def add(n: int) -> None:
                with count_lock:
                    counted[0] += n

            self._wait_watching(ref, lambda: session.fetch(missing, layout, lambda b: self._blob(b.digest), add),
                                lambda: min(counted[0], total), session.abort, total, progress)
        (layout / "manifest.part").write_bytes(raw)  # umoci reads the manifest from the blobs, as skopeo leaves it
        os.replace(layout / "manifest.part", self._blob(ref.digest))
        (layout / "oci-layout").write_bytes(b'{"imageLayoutVersion":"1.0.0"}')
        (layout / "index.json").write_bytes(orjson.dumps({"schemaVersion": 2, "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": ref.digest, "size": len(raw),
             "annotations": {"org.opencontainers.image.ref.name": TAG}}]}))
        return wanted, total

    def _fit(self, ref: ImageReference, missing: int) -> None:
        """Room for `missing` bytes, collecting unused images; DiskFull when even that is not enough."""
        self.collect(room=missing)
        if self.usage() + missing > self.budget:
            raise DiskFull(f"{ref}: {missing} bytes to fetch do not fit the image cache's budget of "
                           f"{self.budget} bytes beside the images attempts use")
        free = shutil.disk_usage(self.root).free
        if missing > free:
            raise DiskFull(f"{ref}: {missing} bytes to fetch, {free} free on the image cache's disk")

    def _wait_watching(self, ref: ImageReference, wait: Callable[[], None], measure: Callable[[], int],
                       kill: Callable[[], None], total: int, progress: ProgressCallback | None) -> None:
        """Runs `wait` while a thread reports `measure` (bytes so far) and calls `kill` when they stall."""
        stop, stalled = threading.Event(), threading.Event()
        watcher = threading.Thread(target=self._watch, args=(measure, kill, progress, total, stop, stalled),
                                   name="nodus-pull-progress", daemon=True)
        watcher.start()
        try:
            wait()
        except (ImagePullError, Deferred):
            if stalled.is_set():
                raise Unreachable(f"{ref}: no bytes arrived for {self.stall_timeout:.0f}s; the registry or the "
                                  "node's network stalled") from None
            raise
        finally:
            stop.set()
            watcher.join()

    def _verify_reused(self, ref: ImageReference, layout: Path, reused: list[Descriptor], wanted: list[Descriptor],
                       credentials: RegistryCredentials | None) -> None:
        """skopeo checks what it fetches as it streams but reuses a blob it finds without reading it, so
        the reused ones are hashed here; one that went bad is dropped and fetched again, once."""
        bad = [d for d in reused if not _blob_matches(self._blob(d.digest), d)]
        bad += [d for d in wanted if d not in reused and not self._blob(d.digest).exists()]  # collected meanwhile
        if not bad:
            return
        for d in bad:
            self._blob(d.digest).unlink(missing_ok=True)
        self.skopeo.copy(ref, layout, TAG, self.blobs, credentials)
        still = [d for d in bad if not _blob_matches(self._blob(d.digest), d)]
        if still:
            raise DigestMismatch(f"{ref}: blob {still[0].digest} does not match its digest after a fresh fetch; "
                                 "the node's cache disk is failing", Fault.NODE)

    def _watch(self, measure: Callable[[], int], kill: Callable[[], None], progress: ProgressCallback | None,
               total: int, stop: threading.Event, stalled: threading.Event) -> None:
        last, advanced = -1, self.clock.monotonic()
        while True:
            done = measure()
            if done > last:
                if progress:
                    progress(PullProgress(done, total))
                last, advanced = done, self.clock.monotonic()
            elif self.clock.monotonic() - advanced > self.stall_timeout:
                stalled.set()
                kill()
                return
            if stop.wait(PROGRESS_INTERVAL):
                return

    def _copied(self, layout: Path, wanted: list[Descriptor], total: int) -> int:
        """skopeo's bytes on disk: finished blobs plus its partial files in the layout (oci-put-blob*)."""
        done = sum(d.size for d in wanted if self._blob(d.digest).exists())
        for partial in layout.glob("oci-put-blob*"):
            try:
                done += partial.stat().st_size
            except FileNotFoundError:
                pass  # renamed into the blob directory between the glob and the stat
        return min(done, total)

    def _unpack(self, layout: Path, rootfs: Path, what: str) -> None:
        """umoci unpack through a layout whose blobs/ is the shared directory (umoci checks digests as it
        reads). `raw unpack`: the tree only; the runtime spec is bundle.py's and umoci's mtree (a second
        hash of every file, half the unpack time) is not needed for an image that is never repacked."""
        blobs = layout / "blobs"
        if blobs.is_dir() and not blobs.is_symlink():
            shutil.rmtree(blobs)
        blobs.symlink_to(Path("..") / ".." / ".." / "blobs")
        try:
            done = subprocess.run([self.umoci, "raw", "unpack", "--image", f"{layout}:{TAG}", str(rootfs)],
                                  capture_output=True, timeout=1800)
        except FileNotFoundError:
            raise ImagePullError(f"{what}: {self.umoci} is not installed on this node (scripts/setup)") from None
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip()
            if "no space left" in err.lower():
                raise DiskFull(f"{what}: unpacking: {err}")
            raise ImagePullError(f"{what}: unpacking failed: {err}")

    def _cached(self, digest: str) -> tuple[PulledImage, int] | None:
        """The cached image for `digest` and its blobs' bytes (its last use moved to now), or None."""
        path = self.images / digest.removeprefix("sha256:")
        try:
            record = orjson.loads((path / "image.json").read_bytes())
        except FileNotFoundError:
            return None
        record["lastUsed"] = self.clock.now()
        # not fsynced: the time only orders evictions; a host crash that loses it makes the image look older
        _write_atomic(path / "image.json", orjson.dumps(record), durable=False)
        image = PulledImage(digest, path / "rootfs", ImageConfig.from_oci(record["config"]), True)
        return image, int(record["bytes"])

    def _footprint(self, path: Path) -> Footprint | None:
        try:
            record = orjson.loads((path / "image.json").read_bytes())
        except (FileNotFoundError, NotADirectoryError):
            return None
        return Footprint(record["digest"], frozenset(record["blobs"]), int(record["rootfsBytes"]),
                         float(record["lastUsed"]))

    def _platform_manifest(self, index: dict[str, Any], what: str) -> str:
        for entry in index.get("manifests") or ():
            platform = entry.get("platform") or {}
            if platform.get("os") == self.platform.os and platform.get("architecture") == self.platform.architecture:
                return str(entry["digest"])
        raise NotFound(f"{what}: the image has no {self.platform.os}/{self.platform.architecture} manifest")

    def _blob(self, digest: str) -> Path:
        return self.blobs / "sha256" / digest.removeprefix("sha256:")

    def _digest_lock(self, digest: str) -> threading.Lock:
        with self._lock:
            return self._digest_locks.setdefault(digest, threading.Lock())


def _descriptors(manifest: dict[str, Any], what: str) -> list[Descriptor]:
    """The config, then the layers."""
    try:
        return [Descriptor(d["digest"], int(d["size"])) for d in [manifest["config"], *manifest["layers"]]]
    except (KeyError, TypeError, ValueError):
        raise NotFound(f"{what}: the registry served a manifest without config and layers") from None


def _verify_bytes(data: bytes, digest: str, what: str) -> None:
    got = "sha256:" + hashlib.sha256(data).hexdigest()
    if got != digest:
        raise DigestMismatch(f"{what}: the registry served a manifest whose digest is {got}")


def _written_since(path: Path, since: float) -> bool:
    """The file was written at or after `since` (less a second of timestamp granularity), or is gone."""
    try:
        return path.stat().st_mtime >= since - 1.0
    except FileNotFoundError:
        return True


def _blob_matches(path: Path, d: Descriptor) -> bool:
    h = hashlib.sha256()
    try:
        if path.stat().st_size != d.size:
            return False
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except FileNotFoundError:
        return False
    return "sha256:" + h.hexdigest() == d.digest


def _write_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    tmp.replace(path)
