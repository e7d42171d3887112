"""Images against a real registry on loopback: the agent's store (pull by digest, verify, cache, GC) and
the coordinator's resolution of spec.image at admission."""
from __future__ import annotations

import asyncio
import base64
from concurrent.futures import Future, ThreadPoolExecutor, wait
import os
from typing import Any
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import orjson
import pytest

from nodus.agent.cgroups import DEFAULT_FS
from nodus.agent.oci.bundle import ContainerRequest
from nodus.agent.oci.images import ImageStore, PulledImage, PullProgress
from nodus.agent.oci.pod import Pod
from nodus.agent.oci.slots import IdSlots
from nodus.agent.oci.pull_errors import DigestMismatch, DiskFull, Fault, ImagePullError, InvalidReference, NotFound, \
    Unauthorized, Unreachable, classify
from nodus.agent.oci.runc import Runc, become_subreaper
from nodus.agent.oci.skopeo import RegistryCredentials, Skopeo
from nodus.coordinator.images import BadImageReference, BadPullSecret, ImageNotFound, ImageResolver, \
    ImageUnauthorized, RegistryUnreachable, ResolvedImage, refusal
from nodus.coordinator.images import RegistryCredentials as CoordinatorCredentials
from agent_double import free_port
from registry_front import Front
from registry import Registry, build_busybox_layout, build_python_layout, busybox_layer, layer, layout_blobs, push, \
    write_index_layout, write_layout

GIB = 1 << 30


class ManualClock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t


@pytest.fixture
def registry(oci_registry: Registry) -> Registry:
    return oci_registry


@pytest.fixture
def private_registry(private_oci_registry: Registry) -> Registry:
    return private_oci_registry


@pytest.fixture(scope="module")
def busybox(oci_registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    layout = build_busybox_layout(tmp_path_factory.mktemp("images") / "busybox",
                                  {"Env": ["PATH=/bin", "GREETING=hi"], "Cmd": ["/bin/sh"], "WorkingDir": "/work",
                                   "User": "65534"})
    return layout, push(layout, oci_registry, "tests/busybox", "v1")


def store(tmp_path: Path, reg: Registry, budget: int = GIB, in_use: tuple[str, ...] = (),
          clock: ManualClock | None = None) -> ImageStore:
    return ImageStore(tmp_path / "cache", budget, clock or ManualClock(), lambda: in_use,
                      Skopeo(insecure=frozenset({reg.host}), timeout=60))


def image_with(tmp: Path, name: str, payload: bytes) -> Path:
    """busybox plus one layer of its own (so images share the busybox layer and differ in one)."""
    return write_layout(tmp / name, [busybox_layer(), layer({f"data/{name}.bin": payload})])


def test_pull_by_digest_unpacks_busybox_and_reports_progress_to_total(
        tmp_path: Path, registry: Registry, busybox: tuple[Path, str]) -> None:
    layout, digest = busybox
    seen: list[PullProgress] = []
    pulled = store(tmp_path, registry).pull(f"{registry.host}/tests/busybox@{digest}", progress=seen.append)
    assert pulled.digest == digest and not pulled.cached
    assert (pulled.rootfs / "bin" / "busybox").read_bytes() == Path("/usr/bin/busybox").read_bytes()
    assert os.readlink(pulled.rootfs / "bin" / "sh") == "busybox"
    assert pulled.config.cmd == ("/bin/sh",) and pulled.config.user == "65534"
    assert pulled.config.env == ("PATH=/bin", "GREETING=hi") and pulled.config.working_dir == "/work"
    total = sum(layout_blobs(layout).values())
    assert seen[-1] == PullProgress(total, total)
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700  # setuid files in images stay out of reach
    assert all(p.total == total for p in seen)
    assert [p.done for p in seen] == sorted(p.done for p in seen)


def test_second_pull_of_a_digest_is_a_cache_hit_without_registry_traffic(
        tmp_path: Path, registry: Registry, busybox: tuple[Path, str]) -> None:
    _, digest = busybox
    ref = f"{registry.host}/tests/busybox@{digest}"
    first = store(tmp_path, registry).pull(ref)
    served = registry.requests_served()
    seen: list[PullProgress] = []
    again = store(tmp_path, registry).pull(ref, progress=seen.append)  # a restarted agent, same cache
    assert again.cached and again.rootfs == first.rootfs and again.config == first.config
    assert registry.requests_served() == served
    assert seen and seen[-1].done == seen[-1].total > 0


def test_an_image_sharing_a_layer_fetches_only_its_own(tmp_path: Path, registry: Registry,
                                                       busybox: tuple[Path, str]) -> None:
    images = store(tmp_path, registry)
    images.pull(f"{registry.host}/tests/busybox@{busybox[1]}")
    other = image_with(tmp_path, "shares", b"only in this image\n")
    digest = push(other, registry, "tests/shares", "v1")
    shared_layer = busybox_layer().digest
    before = registry.log.read_text().count(f"/blobs/{shared_layer}")
    pulled = images.pull(f"{registry.host}/tests/shares@{digest}")
    assert (pulled.rootfs / "data" / "shares.bin").read_bytes() == b"only in this image\n"
    assert (pulled.rootfs / "bin" / "busybox").exists()
    assert registry.log.read_text().count(f"/blobs/{shared_layer}") == before


def test_a_private_repository_refuses_without_credentials_and_pulls_with_them(
        tmp_path: Path, private_registry: Registry) -> None:
    layout = build_busybox_layout(tmp_path / "private")
    digest = push(layout, private_registry, "team/private", "v1")
    ref = f"{private_registry.host}/team/private@{digest}"
    images = store(tmp_path, private_registry)
    before = set(Path(tempfile.gettempdir()).glob("nodus-pull-*"))
    with pytest.raises(Unauthorized) as refused:
        images.pull(ref)
    assert refused.value.fault is Fault.CUSTOMER and not refused.value.lost_capacity
    assert "imagePullSecrets" in str(refused.value)
    with pytest.raises(Unauthorized):
        images.pull(ref, RegistryCredentials(username="alice", password="wrong"))
    pulled = images.pull(ref, RegistryCredentials(username="alice", password="s3cret"))
    assert (pulled.rootfs / "bin" / "busybox").exists()
    # a docker config JSON (what a .dockerconfigjson Secret holds) works the same, in a fresh cache
    auth = base64.b64encode(b"alice:s3cret").decode()
    config = orjson.dumps({"auths": {private_registry.host: {"auth": auth}}})
    again = store(tmp_path / "second", private_registry).pull(ref, RegistryCredentials(docker_config=config))
    assert not again.cached
    # the 0600 authfiles handed to skopeo are gone
    assert set(Path(tempfile.gettempdir()).glob("nodus-pull-*")) == before


def test_a_corrupted_layer_is_refused_and_nothing_is_unpacked(tmp_path: Path, registry: Registry) -> None:
    layout = image_with(tmp_path, "corrupt", os.urandom(64 * 1024))
    digest = push(layout, registry, "tests/corrupt", "v1")
    own = [d for d, size in layout_blobs(layout).items() if d != busybox_layer().digest and size > 64 * 1024]
    registry.corrupt_blob(own[0])
    images = store(tmp_path, registry)
    with pytest.raises(DigestMismatch) as refused:
        images.pull(f"{registry.host}/tests/corrupt@{digest}")
    assert refused.value.fault is Fault.CUSTOMER and refused.value.reason == "ImageDigestMismatch"
    assert [p for p in images.images.iterdir()] == []
    assert not (images.blobs / "sha256" / own[0].removeprefix("sha256:")).exists()


def test_unknown_digest_is_not_found_and_a_dead_registry_is_the_nodes_fault(
        tmp_path: Path, registry: Registry) -> None:
    images = store(tmp_path, registry)
    with pytest.raises(NotFound) as missing:
        images.pull(f"{registry.host}/tests/busybox@sha256:{'1' * 64}")
    assert not missing.value.lost_capacity and "spec.image" in str(missing.value)
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(Unreachable) as unreachable:
        ImageStore(tmp_path / "c2", GIB, ManualClock(), lambda: (), Skopeo(insecure=frozenset({dead}))).pull(
            f"{dead}/tests/busybox@sha256:{'1' * 64}")
    assert unreachable.value.lost_capacity


def test_a_tag_is_refused_before_any_traffic(tmp_path: Path, registry: Registry) -> None:
    served = registry.requests_served()
    with pytest.raises(InvalidReference, match="only by digest"):
        store(tmp_path, registry).pull(f"{registry.host}/tests/busybox:v1")
    assert registry.requests_served() == served


def test_collection_removes_least_recently_used_images_no_attempt_runs(tmp_path: Path, registry: Registry) -> None:
    clock = ManualClock()
    digests = {}
    for name in ("a", "b", "c"):
        digests[name] = push(image_with(tmp_path, name, os.urandom(512 * 1024)), registry, f"tests/gc-{name}", "v1")
    images = store(tmp_path, registry, clock=clock)
    for name in ("a", "b", "c"):  # a is the oldest, then b, then c
        images.pull(f"{registry.host}/tests/gc-{name}@{digests[name]}")
        clock.t += 60
    full = images.usage()
    # a is in use; b is the least recently used of the others; freeing b alone fits the budget
    smaller = store(tmp_path, registry, budget=full - 256 * 1024, in_use=(digests["a"],), clock=clock)
    assert smaller.collect() > 0
    left = {p.name for p in smaller.images.iterdir()}
    assert left == {digests["a"].removeprefix("sha256:"), digests["c"].removeprefix("sha256:")}
    assert (smaller.blobs / "sha256" / busybox_layer().digest.removeprefix("sha256:")).exists()
    assert smaller.usage() <= full - 256 * 1024
    # nothing fits when every image is in use and the budget is below what they hold
    tight = store(tmp_path, registry, budget=1024, in_use=(digests["a"], digests["c"]), clock=clock)
    assert tight.collect() == 0
    with pytest.raises(DiskFull) as full_disk:
        tight.pull(f"{registry.host}/tests/gc-b@{digests['b']}")
    assert full_disk.value.lost_capacity
    assert {p.name for p in tight.images.iterdir()} == left


def test_a_cached_blob_that_went_bad_is_fetched_again_before_use(tmp_path: Path, registry: Registry,
                                                                  busybox: tuple[Path, str]) -> None:
    images = store(tmp_path, registry)
    images.pull(f"{registry.host}/tests/busybox@{busybox[1]}")
    cached = images.blobs / "sha256" / busybox_layer().digest.removeprefix("sha256:")
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cached.write_bytes(bytes(data))
    digest = push(image_with(tmp_path, "after-rot", b"x\n"), registry, "tests/after-rot", "v1")
    pulled = images.pull(f"{registry.host}/tests/after-rot@{digest}")
    assert cached.read_bytes() == busybox_layer().blob
    assert (pulled.rootfs / "bin" / "busybox").read_bytes() == Path("/usr/bin/busybox").read_bytes()


def test_concurrent_pulls_of_one_digest_unpack_it_once(tmp_path: Path, registry: Registry,
                                                       busybox: tuple[Path, str]) -> None:
    images = store(tmp_path, registry)
    ref = f"{registry.host}/tests/busybox@{busybox[1]}"
    with ThreadPoolExecutor(4) as pool:
        pulled = list(pool.map(lambda _: images.pull(ref), range(4)))
    assert sorted(p.cached for p in pulled) == [False, True, True, True]
    assert {p.rootfs for p in pulled} == {pulled[0].rootfs}
    assert [p.name for p in images.images.iterdir()] == [busybox[1].removeprefix("sha256:")]


# -- the coordinator's side: admission resolves spec.image to the digest every attempt runs ----------

def resolve(resolver: ImageResolver, image: str, credentials: CoordinatorCredentials | None = None) -> ResolvedImage:
    return asyncio.run(resolver.resolve(image, credentials))


def test_a_tag_resolves_to_the_digest_the_registry_serves_and_the_config_user(
        tmp_path: Path, registry: Registry, busybox: tuple[Path, str]) -> None:
    resolver = ImageResolver(insecure=frozenset({registry.host}))
    got = resolve(resolver, f"{registry.host}/tests/busybox:v1")
    assert got.digest == busybox[1] and got.user == "65534"
    assert got.pinned == f"{registry.host}/tests/busybox@{busybox[1]}"
    assert resolve(resolver, got.pinned).digest == busybox[1]
    rootless = push(build_busybox_layout(tmp_path / "no-user"), registry, "tests/no-user", "v1")
    assert resolve(resolver, f"{registry.host}/tests/no-user:v1").as_status() == {
        "reference": f"{registry.host}/tests/no-user:v1", "digest": rootless, "user": "root"}


def test_a_manifest_list_resolves_to_the_nodes_platform(tmp_path: Path, registry: Registry) -> None:
    layout = write_index_layout(tmp_path / "multi", {
        "amd64": ([busybox_layer()], {"User": "1000", "Cmd": ["/bin/sh"]}),
        "arm64": ([layer({"bin/sh": b"not for this node"})], {"User": "2000"})})
    index_digest = push(layout, registry, "tests/multi", "v1")
    got = resolve(ImageResolver(insecure=frozenset({registry.host})), f"{registry.host}/tests/multi:v1")
    assert got.digest != index_digest and got.user == "1000"
    # the agent pulls the pinned platform manifest, which is the amd64 image
    pulled = store(tmp_path, registry).pull(got.pinned)
    assert (pulled.rootfs / "bin" / "busybox").exists()
    with pytest.raises(ImageNotFound, match="linux/s390x"):
        resolve(ImageResolver(insecure=frozenset({registry.host}), architecture="s390x"),
                f"{registry.host}/tests/multi:v1")


def test_a_moved_tag_resolves_anew_while_the_pinned_digest_still_pulls(
        tmp_path: Path, registry: Registry) -> None:
    resolver = ImageResolver(insecure=frozenset({registry.host}))
    first = push(image_with(tmp_path, "moving-1", b"one\n"), registry, "tests/moving", "stable")
    pinned = resolve(resolver, f"{registry.host}/tests/moving:stable")
    push(image_with(tmp_path, "moving-2", b"two\n"), registry, "tests/moving", "stable")
    assert resolve(resolver, f"{registry.host}/tests/moving:stable").digest != first == pinned.digest
    pulled = store(tmp_path, registry).pull(pinned.pinned)  # a replacement attempt after the move
    assert (pulled.rootfs / "data" / "moving-1.bin").read_bytes() == b"one\n"


def test_unknown_images_are_refused_naming_spec_image_and_the_fix(registry: Registry) -> None:
    resolver = ImageResolver(insecure=frozenset({registry.host}))
    for image in (f"{registry.host}/tests/busybox:no-such-tag", f"{registry.host}/tests/nothing-here:v1"):
        with pytest.raises(ImageNotFound) as refused:
            resolve(resolver, image)
        error = refusal(refused.value, "Job", "train")
        status = error.to_status("req_1")
        assert status["code"] == 422 and status["details"]["causes"][0]["field"] == "spec.image"
        assert image in status["message"] and "ImageNotFound" in status["message"] and "tag" in status["fix"]
    with pytest.raises(BadImageReference):
        resolve(resolver, "Not A Reference")
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(RegistryUnreachable) as unreachable:
        resolve(ImageResolver(insecure=frozenset({dead}), timeout=20), f"{dead}/x:v1")
    assert refusal(unreachable.value, "Job", "train").to_status("req_2")["code"] == 503


def test_a_private_image_resolves_only_with_its_pull_secret(tmp_path: Path, private_registry: Registry) -> None:
    digest = push(build_busybox_layout(tmp_path / "private"), private_registry, "team/resolve", "v1")
    resolver = ImageResolver(insecure=frozenset({private_registry.host}))
    image = f"{private_registry.host}/team/resolve:v1"
    with pytest.raises(ImageUnauthorized) as refused:
        resolve(resolver, image)
    assert "imagePullSecrets" in refusal(refused.value, "Job", "train").to_status("req_3")["fix"]
    basic = CoordinatorCredentials.from_secret("registry", {"username": b"alice", "password": b"s3cret"})
    assert resolve(resolver, image, basic).digest == digest
    auth = base64.b64encode(b"alice:s3cret").decode()
    config = orjson.dumps({"auths": {private_registry.host: {"auth": auth}}})
    docker = CoordinatorCredentials.from_secret("registry", {".dockerconfigjson": config})
    assert resolve(resolver, image, docker).digest == digest
    assert "s3cret" not in repr(basic)
    with pytest.raises(BadPullSecret) as bad:
        CoordinatorCredentials.from_secret("registry", {"token": b"x"})
    cause = refusal(bad.value, "Job", "train").to_status("req_4")["details"]["causes"][0]
    assert cause["field"] == "spec.imagePullSecrets" and '"registry"' in cause["message"]


@pytest.mark.parametrize("stderr, kind, fault", [
    ('level=fatal msg="reading manifest v1 in r/x: manifest unknown: manifest unknown"', NotFound, Fault.CUSTOMER),
    ('level=fatal msg="reading manifest: denied: requested access to the resource is denied"', Unauthorized,
     Fault.CUSTOMER),
    ('level=fatal msg="writing blob: happened during read: Digest did not match, expected sha256:a, got sha256:b"',
     DigestMismatch, Fault.CUSTOMER),
    ('level=fatal msg="writing blob: write /cache/blobs/x: no space left on device"', DiskFull, Fault.NODE),
    ('level=fatal msg="pinging container registry r: Get \\"https://r/v2/\\": dial tcp: lookup r: no such host"',
     Unreachable, Fault.NODE),
    # a port with 404 in it is not a 404 (a CI run's free port 40441 made this NotFound)
    ('level=fatal msg="Error parsing image name \\"docker://127.0.0.1:40441/t/b@sha256:1\\": pinging container '
     'registry 127.0.0.1:40441: Get \\"http://127.0.0.1:40441/v2/\\": dial tcp 127.0.0.1:40441: connect: connection '
     'refused"', Unreachable, Fault.NODE),
    ('level=fatal msg="reading manifest sha256:1 in r/x: StatusCode: 404, 404 page not found"', NotFound, Fault.CUSTOMER),
    # the cache's own permission error is the node's, not a registry's "denied"
    ('level=fatal msg="creating temp file: open /cache/images/x: permission denied"', ImagePullError, Fault.NODE),
])
def test_skopeo_failures_are_typed_with_whose_fault_they_are(stderr: str, kind: type[ImagePullError],
                                                             fault: Fault) -> None:
    error = classify(stderr, "r/x@sha256:...")
    assert type(error) is kind and error.fault is fault and error.lost_capacity == (fault is Fault.NODE)
    assert error.message.startswith("r/x@sha256:...: ")


def test_a_python_image_built_from_the_host_interpreter_pulls_and_runs(tmp_path: Path, registry: Registry) -> None:
    digest = push(build_python_layout(tmp_path / "python"), registry, "tests/python", "v1")
    pulled = store(tmp_path, registry).pull(f"{registry.host}/tests/python@{digest}")
    assert pulled.config.cmd == ("/usr/bin/python3",)
    # chroot is enough to show the tree is complete (interpreter, stdlib, shared libraries); the
    # runtime's own tests run it in a container
    program = "import json, sqlite3, ssl, sys; print(json.dumps({'v': sys.version_info[:2]}))"
    done = subprocess.run([shutil.which("chroot") or "chroot", str(pulled.rootfs), "/usr/bin/python3", "-c", program], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout) == {"v": list(sys.version_info[:2])}


def test_pull_secrets_travel_as_per_registry_logins_and_pull_on_the_agent(
        tmp_path: Path, private_registry: Registry) -> None:
    digest = push(build_busybox_layout(tmp_path / "logins"), private_registry, "team/logins", "v1")
    auth = base64.b64encode(b"alice:s3cret").decode()
    config = orjson.dumps({"auths": {private_registry.host: {"auth": auth},
                                     "https://index.docker.io/v1/": {"username": "bob", "password": "hub"}}})
    docker = CoordinatorCredentials.from_secret("registry", {".dockerconfigjson": config})
    logins = docker.logins(private_registry.host)
    assert sorted(logins) == sorted([(private_registry.host, "alice", "s3cret"), ("docker.io", "bob", "hub")])
    basic = CoordinatorCredentials.from_secret("basic", {"username": b"alice", "password": b"s3cret"})
    assert basic.logins(private_registry.host) == [(private_registry.host, "alice", "s3cret")]
    # what the agent gets in the Assignment pulls the private image
    pulled = store(tmp_path, private_registry).pull(f"{private_registry.host}/team/logins@{digest}",
                                                    RegistryCredentials.from_logins(logins))
    assert (pulled.rootfs / "bin" / "busybox").exists()


def test_parallel_pulls_of_images_sharing_a_layer_both_land(tmp_path: Path, registry: Registry) -> None:
    digests = [push(image_with(tmp_path, f"par{i}", os.urandom(256 * 1024)), registry, f"tests/par{i}", "v1")
               for i in range(3)]
    images = store(tmp_path, registry)
    with ThreadPoolExecutor(3) as pool:
        pulled = list(pool.map(lambda i: images.pull(f"{registry.host}/tests/par{i}@{digests[i]}"), range(3)))
    for i, image in enumerate(pulled):
        assert image.digest == digests[i] and (image.rootfs / "data" / f"par{i}.bin").stat().st_size == 256 * 1024
        assert (image.rootfs / "bin" / "busybox").exists()


def test_a_pull_a_crash_interrupted_leaves_nothing_behind(tmp_path: Path, registry: Registry,
                                                           busybox: tuple[Path, str]) -> None:
    images = store(tmp_path, registry)
    images.pull(f"{registry.host}/tests/busybox@{busybox[1]}")
    # what a kill -9 mid-pull leaves: a staging directory and a blob no image names
    staging = images.images / f".{'a' * 64}.0000"
    (staging / "layout").mkdir(parents=True)
    orphan = images.blobs / "sha256" / ("b" * 64)
    orphan.write_bytes(b"half a layer")
    restarted = store(tmp_path, registry)
    assert not staging.exists()
    restarted.collect()
    assert not orphan.exists()
    assert restarted.pull(f"{registry.host}/tests/busybox@{busybox[1]}").cached


@pytest.mark.skipif(shutil.which("runc") is None or os.geteuid() != 0, reason="needs runc and root")
@pytest.mark.timeout(120)
def test_a_pulled_image_runs_in_a_pod_with_its_config(tmp_path: Path, registry: Registry,
                                                      busybox: tuple[Path, str]) -> None:
    """The two halves of issue 11 fit: the store's tree and config are what the pod runs (its overlay
    reads the tree through the 0700 cache), and a container cannot change the shared tree."""
    pulled = store(tmp_path, registry).pull(f"{registry.host}/tests/busybox@{busybox[1]}")
    become_subreaper()
    top = Path(tempfile.mkdtemp(prefix="nodus-oci-images-pod-"))
    top.chmod(0o711)  # the pod's root (a host id of its range) walks to its writable layer
    runc = Runc(top / "runc")
    # a cgroup parent of this test's own: a shared one ("nodus-test") races with other runs' cleanup
    pod = Pod(f"img-{uuid.uuid4().hex[:6]}", top / "pod", runc, IdSlots(top / "ids"),
              f"nodus-test-images-{uuid.uuid4().hex[:8]}")
    try:
        log = os.open(top / "main.log", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            script = 'echo "$GREETING $(id -u) $(pwd)"; echo x > /bin/busybox || echo image file not writable'
            request = ContainerRequest("main", command=("sh", "-c", script))
            proc = pod.start("main", request, pulled.config, pulled.rootfs, log)
        finally:
            os.close(log)
        assert proc.wait(60) == 0, (top / "main.log").read_text()
        lines = (top / "main.log").read_text().splitlines()
        assert lines[0] == "hi 65534 /work" and lines[-1] == "image file not writable"
        assert (pulled.rootfs / "bin" / "busybox").read_bytes() == Path("/usr/bin/busybox").read_bytes()
    finally:
        for state in runc.list():
            runc.delete(state.id, force=True)
        pod.close()  # its cgroup parent included
        assert not [c for c in DEFAULT_FS.iterdir() if (c / pod.cgroup_parent).exists()], "a cgroup was left"
        shutil.rmtree(top, ignore_errors=True)


def test_a_copy_that_stops_receiving_bytes_is_stopped_as_unreachable(tmp_path: Path, registry: Registry) -> None:
    """A large image may take long; a copy whose bytes stop moving for stall_timeout (of the injected
    clock) is killed and reported as the node's failure, leaving nothing behind. (skopeo's path; the
    agent's own fetch is the next test.)"""
    digest = push(image_with(tmp_path, "stalls", b"never arrives\n"), registry, "tests/stalls", "v1")
    hanging = tmp_path / "skopeo"
    hanging.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = copy ] && exec sleep 600; done\n'
                       f'exec {shutil.which("skopeo")} "$@"\n')
    hanging.chmod(0o755)
    clock = ManualClock()
    images = ImageStore(tmp_path / "cache", GIB, clock, lambda: (),
                        Skopeo(insecure=frozenset({registry.host}), binary=str(hanging)), stall_timeout=30,
                        direct=False)
    with ThreadPoolExecutor(1) as pool:
        pulling = pool.submit(images.pull, f"{registry.host}/tests/stalls@{digest}")
        for _ in range(1200):  # move the clock until the store gives up; at most a minute of polling
            if pulling.done():
                break
            clock.t += 10
            wait([pulling], timeout=0.05)
        with pytest.raises(Unreachable, match="no bytes arrived for 30s") as stalled:
            pulling.result(timeout=0)
    assert stalled.value.lost_capacity
    assert [p for p in images.images.iterdir()] == []


def no_skopeo(tmp_path: Path, *hosts: str) -> Skopeo:
    """A Skopeo whose binary does not exist: a pull that reaches it fails saying so."""
    return Skopeo(insecure=frozenset(hosts), binary=str(tmp_path / "no-skopeo"))


def moving(clock: ManualClock, pulling: Future[PulledImage]) -> None:
    for _ in range(1200):  # move the clock until the store gives up; at most a minute of polling
        if pulling.done():
            return
        clock.t += 10
        wait([pulling], timeout=0.05)


def test_the_agent_fetches_an_oci_image_itself_without_skopeo(tmp_path: Path, registry: Registry,
                                                              private_registry: Registry) -> None:
    """ADR 0092: the common pull (an OCI manifest; anonymous or a username and password) never starts
    skopeo, reports its bytes up to the total and unpacks the same tree."""
    digest = push(image_with(tmp_path, "direct", os.urandom(300 * 1024)), registry, "tests/direct", "v1")
    seen: list[PullProgress] = []
    images = ImageStore(tmp_path / "cache", GIB, ManualClock(), lambda: (), no_skopeo(tmp_path, registry.host))
    pulled = images.pull(f"{registry.host}/tests/direct@{digest}", progress=seen.append)
    assert (pulled.rootfs / "data" / "direct.bin").stat().st_size == 300 * 1024 and not pulled.cached
    assert seen[-1].done == seen[-1].total > 300 * 1024
    # a private registry's Basic challenge, answered with the pull secret's login
    layout = build_busybox_layout(tmp_path / "private-direct")
    private = push(layout, private_registry, "team/direct", "v1")
    other = ImageStore(tmp_path / "c2", GIB, ManualClock(), lambda: (), no_skopeo(tmp_path, private_registry.host))
    got = other.pull(f"{private_registry.host}/team/direct@{private}", RegistryCredentials(username="alice",
                                                                                        password="s3cret"))
    assert (got.rootfs / "bin" / "busybox").exists()


def test_a_bearer_token_registry_is_fetched_with_the_pull_secrets_token(tmp_path: Path, registry: Registry) -> None:
    """The token flow hosted registries use: the challenge's realm gives a token for the pull secret's
    login; without the login the pull goes to skopeo, which names the refusal."""
    digest = push(image_with(tmp_path, "bearer", b"token\n"), registry, "tests/bearer", "v1")
    with Front(registry, bearer=("bob", "pw")) as front:
        ref = f"{front.host}/tests/bearer@{digest}"
        images = ImageStore(tmp_path / "cache", GIB, ManualClock(), lambda: (), no_skopeo(tmp_path, front.host))
        pulled = images.pull(ref, RegistryCredentials(username="bob", password="pw"))
        assert (pulled.rootfs / "data" / "bearer.bin").read_bytes() == b"token\n" and front.tokens_issued >= 1
        refusing = ImageStore(tmp_path / "c2", GIB, ManualClock(), lambda: (),
                              Skopeo(insecure=frozenset({front.host}), timeout=60))
        with pytest.raises(Unauthorized):
            refusing.pull(ref)
        assert list(refusing.images.iterdir()) == []


def push_docker(tmp_path: Path, registry: Registry, name: str, payload: bytes) -> str:
    """`image_with(name, payload)` pushed as tests/NAME:v1 in Docker's schema 2 (skopeo converts it); its digest."""
    digest_file = tmp_path / f"{name}.digest"
    subprocess.run(["skopeo", "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false", "--format", "v2s2",
                    "--digestfile", str(digest_file), f"oci:{image_with(tmp_path, name, payload)}:latest",
                    f"docker://{registry.host}/tests/{name}:v1"], check=True, capture_output=True, timeout=120)
    return digest_file.read_text().strip()


def test_a_docker_schema_2_image_is_pulled_through_skopeo(tmp_path: Path, registry: Registry) -> None:
    """skopeo converts a Docker manifest to OCI for umoci; the agent defers it there, pinned to the same digest."""
    digest = push_docker(tmp_path, registry, "docker", b"v2s2\n")
    pulled = store(tmp_path, registry).pull(f"{registry.host}/tests/docker@{digest}")
    assert pulled.digest == digest and (pulled.rootfs / "data" / "docker.bin").read_bytes() == b"v2s2\n"


def test_a_collection_during_a_converted_pull_keeps_the_manifest_skopeo_wrote(tmp_path: Path, registry: Registry) -> None:
    """skopeo writes the OCI manifest it converts a Docker one to into the shared blobs, under a digest no
    manifest read names: a collection while that pull runs (another pull's, an attempt's end) used to delete it,
    and umoci then found no manifest (a CI failure of 2026-12-07). A blob written since a running pull began is
    kept; an unreferenced one from before it still goes."""
    digest = push_docker(tmp_path, registry, "docker-gc", b"kept\n")
    images = store(tmp_path, registry)
    stale = images.blobs / "sha256" / ("0" * 64)
    stale.write_bytes(b"left by an image long gone")
    os.utime(stale, (1, 1))
    unpack = images._unpack

    def collected_first(*args: Any) -> None:
        images.collect()  # the moment skopeo is done and umoci not yet started
        unpack(*args)
    images._unpack = collected_first  # type: ignore[method-assign]
    pulled = images.pull(f"{registry.host}/tests/docker-gc@{digest}")
    assert (pulled.rootfs / "data" / "docker-gc.bin").read_bytes() == b"kept\n"
    assert not stale.exists()


def test_a_fetch_that_stops_receiving_bytes_is_stopped_as_unreachable(tmp_path: Path, registry: Registry) -> None:
    """The agent's own fetch has the same stall watch: a blob answer that stops sending is cut after
    stall_timeout of the injected clock, reported as the node's failure (not handed to skopeo), and
    leaves nothing behind."""
    digest = push(image_with(tmp_path, "stalls-direct", b"never arrives\n"), registry, "tests/stalls-direct", "v1")
    clock = ManualClock()
    with Front(registry, stall_blobs=True) as front:
        images = ImageStore(tmp_path / "cache", GIB, clock, lambda: (), no_skopeo(tmp_path, front.host),
                            stall_timeout=30)
        with ThreadPoolExecutor(1) as pool:
            pulling = pool.submit(images.pull, f"{front.host}/tests/stalls-direct@{digest}")
            moving(clock, pulling)
            with pytest.raises(Unreachable, match="no bytes arrived for 30s") as stalled:
                pulling.result(timeout=0)
        assert front.blobs_started >= 1
    assert stalled.value.lost_capacity
    assert [p for p in images.images.iterdir()] == []
    assert [p for p in (images.blobs / "sha256").iterdir()] == []
