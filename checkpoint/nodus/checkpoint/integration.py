"""Integration HFTrainer (and Auto): the newest *complete* `checkpoint-N` of transformers' Trainer.

What Trainer writes, and in which order (transformers, src/transformers/trainer.py,
`Trainer._save_checkpoint`, 4.4x): `save_model` (config.json and the weights: model.safetensors,
or sharded `*.safetensors` with `model.safetensors.index.json`, or pytorch_model.bin, or
adapter_model.* for PEFT), then optimizer.pt / scheduler.pt / scaler.pt / rng_state*.pth
(unless save_only_model), then `trainer_state.json` (TRAINER_STATE_NAME) — the last file, written
with a plain open/json.dump, not atomically. So a directory is complete when trainer_state.json
parses and the weights it saved before are all there. transformers' own `get_last_checkpoint`
(trainer_utils.py) takes the highest N with no such check, which is how a run killed mid-save
fails to resume; this one skips the torn directory and returns the one before it.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
WEIGHTS = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin",
           "tf_model.h5", "flax_model.msgpack")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
OTHER_WEIGHTS = re.compile(r"^(global_step\d+|pytorch_model_fsdp.*)$")
"""DeepSpeed (`global_stepN/`) and FSDP sharded states, saved in place of a weights file."""


@dataclass(frozen=True, slots=True)
class TrainerCheckpoint:
    path: str
    """The `checkpoint-N` directory: what `trainer.train(resume_from_checkpoint=…)` takes."""
    step: int
    """N, Trainer's global_step when it saved."""


def _nonempty(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


def _weights_complete(path: str) -> bool:
    for name in WEIGHTS:
        if _nonempty(os.path.join(path, name)):
            return True
    for name in WEIGHT_INDEXES:
        index = os.path.join(path, name)
        if not os.path.exists(index):
            continue
        try:
            with open(index, "rb") as f:
                shards = set(json.load(f)["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False
        return bool(shards) and all(_nonempty(os.path.join(path, s)) for s in shards)
    try:
        return any(OTHER_WEIGHTS.match(n) for n in os.listdir(path))
    except OSError:
        return False


def is_complete(path: str | os.PathLike[str]) -> bool:
    """trainer_state.json parses (it is written last) and the weights saved before it are present."""
    p = os.fspath(path)
    try:
        with open(os.path.join(p, TRAINER_STATE), "rb") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and "global_step" in state and _weights_complete(p)


def find_trainer_checkpoint(root: str | os.PathLike[str]) -> TrainerCheckpoint | None:
    """The complete `checkpoint-N` with the highest N anywhere under `root` (Trainer's output_dir may
    sit at any depth of the state path), or None. Checkpoint directories are not searched inside."""
    found: list[TrainerCheckpoint] = []
    for dirpath, dirnames, _ in os.walk(os.fspath(root)):
        keep = []
        for d in dirnames:
            m = CHECKPOINT_DIR.match(d)
            if m is None:
                keep.append(d)
            elif is_complete(os.path.join(dirpath, d)):
                found.append(TrainerCheckpoint(os.path.join(dirpath, d), int(m.group(1))))
        dirnames[:] = sorted(keep)
    if not found:
        return None
    return max(found, key=lambda c: (c.step, os.path.getmtime(os.path.join(c.path, TRAINER_STATE))))
