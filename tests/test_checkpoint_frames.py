"""The archive's frames (ADR 0053): independent zstd frames, stored where the data does not compress,
read back by the real `zstd -d | tar -x` byte for byte, and decoded in parallel by a restore."""
from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import zstandard

from nodus.checkpoint import CorruptArchive, DigestMismatch, restore, restore_file, save_file
from nodus.checkpoint.frames import FRAME, MAX_BLOCK, SEGMENT, Encoder, contents, stored_frame, walk

needs_zstd = pytest.mark.skipif(shutil.which("zstd") is None or shutil.which("tar") is None,
                                reason="the zstd and tar commands are the reference here: apt-get install zstd")


def _state(base: Path) -> Path:
    """Random bytes (stored), text (level 3), 16-symbol binary (level 1), small files, links: several frames."""
    rng = random.Random(17)
    state = base / "state"
    (state / "small").mkdir(parents=True)
    (state / "weights.bin").write_bytes(rng.randbytes(2 * FRAME + 12345))
    words = ["".join(rng.choices("etaoinshrdlu", k=rng.randint(2, 9))) for _ in range(3000)]
    (state / "log.txt").write_text("\n".join(" ".join(rng.choices(words, k=10)) for _ in range(120_000)))
    table = bytes(rng.choice(b"\x00\x01\x02\x03\x10\x20\x40\x7f\x80\xaa\xbb\xcc\xdd\xee\xf0\xff") for _ in range(256))
    (state / "optimizer.bin").write_bytes(rng.randbytes(FRAME + 777).translate(table))
    for i in range(40):
        (state / "small" / f"f{i:02d}").write_bytes(rng.randbytes(rng.randint(0, 3000)))
    (state / "empty").write_bytes(b"")
    (state / "latest").symlink_to("weights.bin")
    os.link(state / "log.txt", state / "log.hardlink")
    return state


def _same(a: Path, b: Path) -> None:
    r = subprocess.run(["diff", "-r", "--no-dereference", str(a), str(b)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_zstd
def test_zstd_and_tar_restore_an_archive_of_several_frames_byte_for_byte(tmp_path: Path) -> None:
    state = _state(tmp_path)
    archive = tmp_path / "c.tar.zst"
    save_file(["state"], archive, root=tmp_path)
    frames = list(walk(memoryview(archive.read_bytes())))
    stored = [f for f in frames if f.stored is not None]
    assert len(frames) >= 4, "one frame per piece of the tar stream, at least"
    assert stored and len(stored) < len(frames), "random data stored, the rest compressed"
    assert sum(n for f in stored for _, n in f.stored or ()) >= 2 * FRAME - 2 * SEGMENT, "weights not run through zstd"

    out = tmp_path / "by-zstd"
    out.mkdir()
    subprocess.run(f"zstd -q -d -c '{archive}' | tar -xf - -C '{out}'", shell=True, check=True)
    _same(state, out / "state")
    assert (out / "state" / "log.hardlink").stat().st_ino == (out / "state" / "log.txt").stat().st_ino
    subprocess.run(["zstd", "-q", "-t", str(archive)], check=True)  # every frame's checksum, where it has one

    ours = tmp_path / "by-nodus"
    restore_file(archive, ours)
    _same(state, ours / "state")


@needs_zstd
def test_an_archive_written_by_tar_and_zstd_as_one_frame_restores(tmp_path: Path) -> None:
    state = _state(tmp_path)
    archive = tmp_path / "foreign.tar.zst"
    subprocess.run(f"tar -cf - state | zstd -q -3 -o '{archive}'", shell=True, cwd=tmp_path, check=True)
    assert len(list(walk(memoryview(archive.read_bytes())))) == 1
    restore(archive, tmp_path / "out")
    _same(state, tmp_path / "out" / "state")


@pytest.mark.parametrize("size", [0, 1, MAX_BLOCK - 1, MAX_BLOCK, MAX_BLOCK + 1, 3 * MAX_BLOCK + 5])
def test_a_stored_frame_is_what_any_zstd_decoder_reads_back(size: int) -> None:
    data = os.urandom(size)
    frame = stored_frame(data)
    assert zstandard.ZstdDecompressor().decompress(frame) == data
    assert len(frame) - size <= 9 + 3 * max(1, -(-size // MAX_BLOCK))


def test_each_segment_is_encoded_by_what_its_sample_shows() -> None:
    rng = random.Random(3)
    text = " ".join(rng.choices(["alpha", "beta", "gamma", "delta", "epsilon"], k=400_000)).encode()[:SEGMENT]
    piece = rng.randbytes(SEGMENT) + text + rng.randbytes(SEGMENT)
    encoder = Encoder(3)
    blob = encoder.encode(piece)
    frames = list(walk(memoryview(blob)))
    assert [f.stored is not None for f in frames] == [True, False, True]
    assert [f.content_size for f in frames] == [SEGMENT] * 3
    assert frames[1].end - frames[1].start < SEGMENT // 2, "the text between is compressed"
    assert zstandard.ZstdDecompressor().stream_reader(blob, read_across_frames=True).readall() == piece
    assert b"".join(contents(memoryview(blob), 2)) == piece


def test_damage_in_a_compressed_frame_is_refused_and_named_as_a_digest_mismatch(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "log.txt").write_text("step loss 0.25\n" * 400_000)
    archive = tmp_path / "c.tar.zst"
    save_file(["state"], archive, root=tmp_path)
    frames = list(walk(memoryview(archive.read_bytes())))
    assert frames and all(f.stored is None for f in frames)
    blob = bytearray(archive.read_bytes())
    blob[frames[0].end - 6] ^= 0x55  # inside the first frame's last block or its checksum
    (tmp_path / "bad.tar.zst").write_bytes(bytes(blob))
    with pytest.raises(CorruptArchive):
        restore(tmp_path / "bad.tar.zst", tmp_path / "a")
    assert not (tmp_path / "a").exists()
    sidecar = Path(f"{archive}.manifest.json")
    shutil.copy(sidecar, tmp_path / "bad.tar.zst.manifest.json")
    with pytest.raises(DigestMismatch, match="nothing was extracted"):
        restore_file(tmp_path / "bad.tar.zst", tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_a_save_is_the_same_bytes_whatever_the_threads(tmp_path: Path) -> None:
    """Frames are cut by position, not by timing: an archive of the same tree is the same bytes."""
    from nodus.checkpoint import archive as archive_module

    _state(tmp_path)
    plan = archive_module.scan(["state"], root=tmp_path)
    blobs = []
    for threads in (1, 3):
        out: list[bytes] = []
        archive_module.write(plan, _Sink(out), threads=threads, owner=(0, 0))
        blobs.append(b"".join(out))
    assert blobs[0] == blobs[1]


class _Sink:
    def __init__(self, out: list[bytes]) -> None:
        self.out = out

    def write(self, data: bytes | memoryview, /) -> int:
        self.out.append(bytes(data))
        return len(data)
