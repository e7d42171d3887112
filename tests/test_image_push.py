"""Unit tests of `nodus image push`'s pure parts: which archive a push is (CLI and coordinator), image names
by the OCI grammar, the operator registry's flags and whose namespace an image is in, and the logins an
Assignment carries for it."""
from __future__ import annotations

import base64
import io
import tarfile
from pathlib import Path

import orjson
import pytest

from nodus.cli.client import CliError
from nodus.cli.images import kind_of, pack_layout
from nodus.coordinator.controllers.assignment import operator_logins
from nodus.coordinator.errors import NodusError
from nodus.coordinator.image_push import ArchiveKind, _inspect_tar, choose_name, detect, source_of
from nodus.coordinator.operator_registry import NameRefused, OperatorRegistry, split_name
from registry import build_busybox_layout, manifest_digest


def tar_of(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


# -- which archive -------------------------------------------------------------------------------------

def test_detect_tells_a_layout_from_a_docker_archive_and_refuses_the_rest_naming_the_argument() -> None:
    assert detect(["oci-layout", "index.json", "blobs/sha256/ab"]) is ArchiveKind.OCI_LAYOUT
    assert detect(["./oci-layout", "./index.json", "./blobs/"]) is ArchiveKind.OCI_LAYOUT
    assert detect(["manifest.json", "abc/layer.tar", "abc.json"]) is ArchiveKind.DOCKER_ARCHIVE
    # docker save of Docker 25+ writes both: docker load reads manifest.json, so do we
    assert detect(["manifest.json", "oci-layout", "index.json"]) is ArchiveKind.DOCKER_ARCHIVE
    with pytest.raises(NodusError) as e:
        detect(["hello.txt"])
    assert e.value.reason == "BadRequest" and e.value.message.startswith("DIR|FILE: the archive is not an image")
    assert "docker save" in e.value.effective_fix
    with pytest.raises(NodusError, match="index.json is missing"):
        detect(["oci-layout", "blobs/sha256/ab"])
    with pytest.raises(NodusError, match="oci-layout is missing"):
        detect(["index.json"])


def test_the_cli_refuses_what_is_not_an_image_before_sending(tmp_path: Path) -> None:
    layout = build_busybox_layout(tmp_path / "layout")
    assert kind_of(layout) == "oci"
    assert kind_of(tar_of(tmp_path / "saved.tar", {"manifest.json": b"[]"})) == "docker-archive"
    with pytest.raises(CliError, match="a tar without manifest.json is not a `docker save` archive"):
        kind_of(tar_of(tmp_path / "plain.tar", {"hello.txt": b"hi"}))
    (tmp_path / "text").write_text("not a tar")
    with pytest.raises(CliError, match="not a tar archive"):
        kind_of(tmp_path / "text")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CliError, match=r"not an OCI image layout \(oci-layout and index.json missing\)"):
        kind_of(tmp_path / "empty")
    with pytest.raises(CliError, match="no such file or directory"):
        kind_of(tmp_path / "missing")


def test_a_packed_layout_is_extracted_whole_and_copied_from_as_oci(tmp_path: Path) -> None:
    layout = build_busybox_layout(tmp_path / "layout")
    with open(tmp_path / "sent.tar", "wb") as f:
        pack_layout(layout, f)
    assert _inspect_tar(tmp_path / "sent.tar", tmp_path / "got") is ArchiveKind.OCI_LAYOUT
    assert manifest_digest(tmp_path / "got") == manifest_digest(layout)
    for blob in (layout / "blobs" / "sha256").iterdir():
        assert (tmp_path / "got" / "blobs" / "sha256" / blob.name).read_bytes() == blob.read_bytes()
    source = source_of(ArchiveKind.OCI_LAYOUT, tmp_path / "got", tmp_path / "sent.tar")
    assert source.transport == f"oci:{tmp_path / 'got'}" and not source.all_platforms and source.suggested == ""


def test_an_extracted_layout_never_leaves_its_directory(tmp_path: Path) -> None:
    evil = tar_of(tmp_path / "evil.tar", {"oci-layout": b"{}", "index.json": b"{}", "../escaped": b"x"})
    with pytest.raises(NodusError, match="DIR|FILE"):
        _inspect_tar(evil, tmp_path / "got")
    assert not (tmp_path / "escaped").exists()


def test_a_docker_archive_is_named_by_its_repo_tag_and_must_hold_one_image(tmp_path: Path) -> None:
    one = [{"Config": "c.json", "RepoTags": ["example.com/team/trainer:v3"], "Layers": ["l/layer.tar"]}]
    archive = tar_of(tmp_path / "one.tar", {"manifest.json": orjson.dumps(one)})
    source = source_of(ArchiveKind.DOCKER_ARCHIVE, tmp_path / "unused", archive)
    assert source.transport == f"docker-archive:{archive}" and source.suggested == "trainer:v3"
    two = tar_of(tmp_path / "two.tar", {"manifest.json": orjson.dumps(one * 2)})
    with pytest.raises(NodusError, match="holds 2 images; push one at a time"):
        source_of(ArchiveKind.DOCKER_ARCHIVE, tmp_path / "unused", two)


# -- names ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("trainer", ("trainer", "latest")), ("team/trainer:v1", ("team/trainer", "v1")),
    ("a.b_c__d--e:V_1.2-rc", ("a.b_c__d--e", "V_1.2-rc")), ("x" * 10 + ":" + "t" * 128, ("x" * 10, "t" * 128)),
])
def test_names_that_follow_the_oci_grammar_are_taken(text: str, expected: tuple[str, str]) -> None:
    assert split_name(text) == expected


@pytest.mark.parametrize("text,why", [
    ("Trainer", "is not an image name"), ("team//x", "is not an image name"), ("-x", "is not an image name"),
    ("x_", "is not an image name"), ("a___b", "is not an image name"), ("x:.v1", "is not a tag"),
    ("x:" + "t" * 129, "is not a tag"), ("x:", "is not a tag"), ("", "is not an image name"),
])
def test_names_outside_the_grammar_are_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(NameRefused, match=why):
        split_name(text)


def test_choose_name_prefers_the_flag_then_the_archive_and_names_the_flag_when_refusing() -> None:
    assert choose_name("mine:v2", "saved:v7") == ("mine", "v2")
    assert choose_name("", "saved:v7") == ("saved", "v7")
    with pytest.raises(NodusError, match="--name is required"):
        choose_name("", "")
    with pytest.raises(NodusError, match="--name: 'UP' is not an image name") as e:
        choose_name("UP", "")
    assert "--name NAME[:TAG]" in e.value.effective_fix


# -- the operator's registry ---------------------------------------------------------------------------

def test_the_registry_flags_parse_and_a_bad_one_says_which(tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    auth.write_bytes(orjson.dumps({"auths": {"reg.example:5000": {"auth": base64.b64encode(b"op:pw").decode()}}}))
    registry = OperatorRegistry.parse("reg.example:5000/nodus", str(auth), frozenset({"reg.example:5000"}))
    assert (registry.host, registry.prefix, registry.insecure) == ("reg.example:5000", "nodus", True)
    assert registry.logins() == [("reg.example:5000", "op", "pw")]
    assert "pw" not in repr(registry)
    with pytest.raises(ValueError, match="holds no login for other:1"):
        OperatorRegistry.parse("other:1", str(auth))
    (tmp_path / "bad.json").write_text("op:pw")
    with pytest.raises(ValueError, match="not a docker config JSON"):
        OperatorRegistry.parse("reg.example:5000", str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="write it as HOST:PORT"):
        OperatorRegistry.parse("http://reg.example")
    with pytest.raises(ValueError, match="is not a repository path"):
        OperatorRegistry.parse("reg.example/Bad")
    with pytest.raises(ValueError, match="--image-registry-auth-file .*missing.json"):
        OperatorRegistry.parse("reg.example", str(tmp_path / "missing.json"))


def test_an_image_belongs_to_the_project_whose_namespace_it_is_in() -> None:
    registry = OperatorRegistry("reg.example:5000", "nodus")
    assert registry.repository("team-a", "tools/x") == "nodus/team-a/tools/x"
    assert registry.project_of("reg.example:5000/nodus/team-a/tools/x@sha256:" + "a" * 64) == "team-a"
    assert registry.project_of("reg.example:5000/nodus/team-b/x:v1") == "team-b"
    assert registry.project_of("reg.example:5000/nodus/x") == ""  # no project's namespace
    assert registry.project_of("reg.example:5000/elsewhere/team-a/x") == ""  # not under the prefix
    assert registry.project_of("other.example/nodus/team-a/x") == ""
    assert not registry.holds("not a reference")
    top = OperatorRegistry("reg.example:5000")
    assert top.project_of("reg.example:5000/team-a/x") == "team-a" and top.project_prefix("team-a") == "team-a/"
    with pytest.raises(NameRefused, match="longer than 255"):
        registry.repository("team-a", "x" * 250)


def test_an_assignment_carries_the_operators_login_only_for_the_projects_own_images() -> None:
    from nodus.coordinator.images import RegistryCredentials
    registry = OperatorRegistry("reg.example:5000", "nodus", RegistryCredentials(username="op", password="pw"))
    own = {"image": "reg.example:5000/nodus/team-a/x@sha256:" + "a" * 64}
    [login] = operator_logins(own, "team-a", registry)
    assert (login.registry, login.username, login.password) == ("reg.example:5000", "op", "pw")
    sidecar = {"image": "busybox", "sidecars": [{"name": "s", "image": own["image"]}]}
    assert len(operator_logins(sidecar, "team-a", registry)) == 1
    assert operator_logins(own, "team-b", registry) == []
    assert operator_logins({"image": "docker.io/library/busybox"}, "team-a", registry) == []
    assert operator_logins(own, "team-a", None) == []


def test_admission_refuses_another_projects_image_before_asking_the_registry() -> None:
    import asyncio

    from nodus.coordinator.images import ImageOfAnotherProject, ImageResolver
    registry = OperatorRegistry("reg.example:5000", "nodus")
    resolver = ImageResolver(operator=registry, binary="/nonexistent/skopeo")  # a registry call would fail otherwise
    with pytest.raises(ImageOfAnotherProject) as e:
        asyncio.run(resolver.resolve("reg.example:5000/nodus/team-b/x:v1", project="team-a"))
    assert e.value.field == "spec.image" and "for project team-b, not team-a" in e.value.detail
    with pytest.raises(ImageOfAnotherProject, match="for project \\(none\\)"):
        asyncio.run(resolver.resolve("reg.example:5000/nodus/x:v1", project="team-a"))
