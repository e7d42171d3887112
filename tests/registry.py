"""A real OCI registry on loopback (Debian's `docker-registry`, the CNCF distribution server) and test
images built offline.

Images are OCI layouts written here byte for byte (tar layers gzipped with mtime 0), so the same
content always has the same digests: two images built from the same base layer share that blob,
which the cache tests rely on. `push` copies a layout into the registry with skopeo over plain HTTP.
The runc tests use `build_busybox_layout` and `push` too; keep their signatures. The session fixtures
`oci_registry` and `private_oci_registry` (alice / s3cret, htpasswd) are registered in conftest.py.
"""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import random
import re
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import pytest
import orjson
import requests

from agent_double import free_port

BUSYBOX = Path("/usr/bin/busybox")
"""busybox-static: one static binary, so the image needs no libraries."""
APPLETS = ("sh", "echo", "cat", "ls", "sleep", "true", "false", "id", "env", "wget", "httpd")
TAG = "latest"
"""The ref name every layout built here carries (skopeo reads `oci:DIR:latest`)."""
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG = "application/vnd.oci.image.config.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
ACCESS_LINE = re.compile(r'^\S+ - \S+ \[[^]]+\] "(?:GET|HEAD|PUT|POST|PATCH|DELETE) ', re.M)
"""A line of the registry's access log (Apache combined format)."""


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class Layer:
    """One gzipped tar layer: its blob and the digest of the tar inside (the config's diff_id)."""

    blob: bytes
    diff_id: str

    @property
    def digest(self) -> str:
        return _sha(self.blob)


def layer(files: Mapping[str, bytes | str], modes: Mapping[str, int] | None = None) -> Layer:
    """A layer of `files` (path -> content; a str content is a symlink target), deterministic."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in files if str(Path(p).parent) != "."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path in sorted(files):
            content = files[path]
            info = tarfile.TarInfo(path)
            if isinstance(content, str):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, content, 0o777
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), (modes or {}).get(path, 0o644)
                tar.addfile(info, io.BytesIO(content))
    tar_bytes = raw.getvalue()
    return Layer(gzip.compress(tar_bytes, compresslevel=1, mtime=0), _sha(tar_bytes))


def busybox_layer() -> Layer:
    files: dict[str, bytes | str] = {"bin/busybox": BUSYBOX.read_bytes()}
    files.update({f"bin/{a}": "busybox" for a in APPLETS})
    files["etc/passwd"] = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
    files["etc/group"] = b"root:x:0:\nnobody:x:65534:\n"
    return layer(files, {"bin/busybox": 0o755})


def write_layout(dest: Path, layers: list[Layer], config: Mapping[str, object] | None = None,
                 architecture: str = "amd64") -> Path:
    """An OCI image layout at `dest` holding one linux image of `layers`, tagged `latest`."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        digest = _sha(data)
        (blobs / digest.removeprefix("sha256:")).write_bytes(data)
        return digest

    image_config = {"architecture": architecture, "os": "linux",
                    "config": dict(config or {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"], "WorkingDir": "/"}),
                    "rootfs": {"type": "layers", "diff_ids": [lay.diff_id for lay in layers]}}
    config_bytes = orjson.dumps(image_config)
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST,
                "config": {"mediaType": CONFIG, "digest": put(config_bytes), "size": len(config_bytes)},
                "layers": [{"mediaType": LAYER, "digest": put(lay.blob), "size": len(lay.blob)} for lay in layers]}
    manifest_bytes = orjson.dumps(manifest)
    index = {"schemaVersion": 2, "manifests": [
        {"mediaType": MANIFEST, "digest": put(manifest_bytes), "size": len(manifest_bytes),
         "annotations": {"org.opencontainers.image.ref.name": TAG}}]}
    (dest / "oci-layout").write_bytes(b'{"imageLayoutVersion":"1.0.0"}')
    (dest / "index.json").write_bytes(orjson.dumps(index))
    return dest


def write_index_layout(dest: Path, images: Mapping[str, tuple[list[Layer], Mapping[str, object]]]) -> Path:
    """A layout whose `latest` is an image index (manifest list): one linux image per architecture."""
    entries = []
    for architecture, (layers, config) in images.items():
        write_layout(dest, layers, config, architecture)
        entry = orjson.loads((dest / "index.json").read_bytes())["manifests"][0]
        entry.pop("annotations")
        entries.append({**entry, "platform": {"os": "linux", "architecture": architecture}})
    index_bytes = orjson.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries})
    (dest / "blobs" / "sha256" / _sha(index_bytes).removeprefix("sha256:")).write_bytes(index_bytes)
    (dest / "index.json").write_bytes(orjson.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": INDEX, "digest": _sha(index_bytes), "size": len(index_bytes),
         "annotations": {"org.opencontainers.image.ref.name": TAG}}]}))
    return dest


def host_layer(paths: Iterable[Path], links: Mapping[str, str] | None = None) -> Layer:
    """A layer of host files (directories recursively, symlinks as symlinks), each under its parent's real
    path, with the host's symlinked directories on the way (merged /usr's /lib -> usr/lib) as symlinks,
    plus `links` (path -> target); owners and times zeroed so the same files give the same digest."""
    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if "__pycache__" in info.name.split("/"):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    wanted = sorted({Path(p) for p in paths})
    placed = {p: Path(os.path.realpath(p.parent)) / p.name for p in wanted}
    symlinked = sorted({a for p in wanted for a in p.parents if a != Path("/") and a.is_symlink()})
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for parent in sorted({str(q) for p in placed.values() for q in p.parents if str(q) != "/"}):
            _add_dir(tar, parent.lstrip("/"))  # the parents first, so no directory is implied
        for path in wanted:
            tar.add(str(path), arcname=str(placed[path]).lstrip("/"), recursive=True, filter=clean)
        all_links = {str(a): os.readlink(a) for a in symlinked if str(a) not in (links or {})}
        all_links.update(links or {})
        for path, target in sorted(all_links.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            tar.addfile(info)
    tar_bytes = raw.getvalue()
    return Layer(gzip.compress(tar_bytes, compresslevel=1, mtime=0), _sha(tar_bytes))


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    tar.addfile(info)


PYTHON_SKIP = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__pycache__"}
"""Parts of the standard library no test program imports (about 870 of its 940 MB here)."""


def build_python_layout(dest: Path) -> Path:
    """busybox plus the interpreter running these tests, its standard library and the shared libraries
    it and its extension modules load, at their host paths; /usr/bin/python3 points at it."""
    exe = Path(os.path.realpath(sys.executable))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [exe, *(p for p in stdlib.iterdir() if p.name not in PYTHON_SKIP and not p.name.startswith("config-"))]
    loaded = {exe, *(p for p in (stdlib / "lib-dynload").glob("*.so") if not p.name.startswith("_tkinter"))}
    libs: set[Path] = set()
    for binary in sorted(loaded):
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        for lib in re.findall(r"(/\S+) \(0x", out):
            libs.update({Path(lib), Path(os.path.realpath(lib))})
    python = host_layer([*files, *sorted(libs - set(files))], {"usr/bin/python3": str(exe)})
    return write_layout(dest, [busybox_layer(), python],
                        {"Env": ["PATH=/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1"], "Cmd": ["/usr/bin/python3"]})


def build_busybox_layout(dest: Path, config: Mapping[str, object] | None = None) -> Path:
    """A busybox image (sh and a few applets on /bin, /etc/passwd with root and nobody) as an OCI layout."""
    return write_layout(dest, [busybox_layer()], config)


def build_sized_layout(dest: Path, megabytes: int, seed: int = 0, layers: int = 4) -> Path:
    """busybox plus `megabytes` MB of incompressible files spread over `layers` layers (a pull bench's image)."""
    rng = random.Random(seed)
    size = megabytes * 1024 * 1024 // layers
    extra = [layer({f"data/part{i}.bin": rng.randbytes(size)}) for i in range(layers)]
    return write_layout(dest, [busybox_layer(), *extra])


def manifest_digest(layout: Path) -> str:
    """The digest of the layout's `latest` manifest (what the registry serves after a push)."""
    index = orjson.loads((layout / "index.json").read_bytes())
    return str(index["manifests"][0]["digest"])


def layout_blobs(layout: Path) -> dict[str, int]:
    """The layout's image blobs (config and layers) and their sizes, from its manifest."""
    hexd = manifest_digest(layout).removeprefix("sha256:")
    manifest = orjson.loads((layout / "blobs" / "sha256" / hexd).read_bytes())
    return {d["digest"]: d["size"] for d in [manifest["config"], *manifest["layers"]]}


@dataclass
class Registry:
    """A running registry: `host` is what image references start with (127.0.0.1:PORT)."""

    root: Path
    username: str = ""
    password: str = ""
    host: str = ""
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=Path)

    @property
    def storage(self) -> Path:
        return self.root / "storage"

    def start(self, timeout: float = 20) -> Registry:
        self.root.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.host = f"127.0.0.1:{port}"
        config = {"version": 0.1, "log": {"level": "info", "accesslog": {"disabled": False}},
                  "storage": {"filesystem": {"rootdirectory": str(self.storage)}, "delete": {"enabled": True}},
                  "http": {"addr": self.host}}
        if self.username:
            import bcrypt  # here, not at the top: conftest imports this module for every test

            htpasswd = self.root / "htpasswd"
            hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=4)).decode()
            htpasswd.write_text(f"{self.username}:{hashed}\n")
            config["auth"] = {"htpasswd": {"realm": "nodus-tests", "path": str(htpasswd)}}
        (self.root / "config.yml").write_bytes(orjson.dumps(config))  # JSON is YAML
        self.log = self.root / "registry.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(["docker-registry", "serve", str(self.root / "config.yml")],
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                requests.get(f"http://{self.host}/v2/", timeout=1)
                return self
            except requests.RequestException:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"docker-registry did not start:\n{self.log.read_text(errors='replace')}") \
                        from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def requests_served(self) -> int:
        """How many HTTP requests the access log shows so far (a cache hit must add none)."""
        return len(ACCESS_LINE.findall(self.log.read_text(errors="replace")))

    def blob_data(self, digest: str) -> Path:
        """Where the registry stores a blob's bytes."""
        hexd = digest.removeprefix("sha256:")
        return self.storage / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"

    def corrupt_blob(self, digest: str) -> None:
        """Flips one byte of a stored blob, same size, so the registry serves content whose digest differs."""
        path = self.blob_data(digest)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))


def push(layout: Path, registry: Registry, repo: str, tag: str) -> str:
    """Copies the layout's `latest` image (or index) to registry/repo:tag; returns the digest it serves."""
    digest_file = layout.parent / f".{layout.name}.{repo.replace('/', '_')}.{tag}.digest"
    creds = ["--dest-creds", f"{registry.username}:{registry.password}"] if registry.username else []
    top = orjson.loads((layout / "index.json").read_bytes())["manifests"][0]
    every = ["--all"] if top["mediaType"] == INDEX else []  # an index as it is, not the host's image of it
    subprocess.run(["skopeo", "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false", *creds, *every,
                    "--digestfile", str(digest_file), f"oci:{layout}:{TAG}",
                    f"docker://{registry.host}/{repo}:{tag}"], check=True, capture_output=True, timeout=120)
    return digest_file.read_text().strip()


@contextlib.contextmanager
def serve_registry(root: Path, username: str = "", password: str = "") -> Iterator[Registry]:
    """A registry for the block (with htpasswd auth when a username is given), stopped after."""
    reg = Registry(root, username, password).start()
    try:
        yield reg
    finally:
        reg.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """One registry without auth for the whole session (each test pushes to its own repository)."""
    with serve_registry(tmp_path_factory.mktemp("oci-registry")) as reg:
        yield reg


@pytest.fixture(scope="session")
def private_oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """One registry that refuses anonymous pulls and pushes: user alice, password s3cret."""
    with serve_registry(tmp_path_factory.mktemp("oci-private-registry"), "alice", "s3cret") as reg:
        yield reg
