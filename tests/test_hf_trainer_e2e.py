"""integration HFTrainer with a real transformers Trainer, through the daemons: a tiny GPT-2 trains on
CPU with `nodus.hf.NodusCheckpointCallback`; a suspend asks for a checkpoint, the Trainer saves
`checkpoint-N` at its next step end and holds until the agent's copy is done; the resume restores it,
passes it as $NODUS_RESUME_FROM, and `trainer.train(resume_from_checkpoint=…)` continues from step N
to the end instead of starting over."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import Coordinator
from e2e import attempts_of, create, patch_state, start_agent, suspend, units, wait_job
from agent_double import AgentProcess

pytestmark = pytest.mark.slow

STEPS = 120
TRAIN = r"""
import json, os, sys, time
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from nodus import progress
from nodus.hf import NodusCheckpointCallback, resume_from_checkpoint

marker, steps = sys.argv[1], int(sys.argv[2])


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        ids = torch.tensor([(i + k) % 64 for k in range(16)])
        return {"input_ids": ids, "labels": ids}


class Report(TrainerCallback):
    def on_train_begin(self, args, state, control, **kw):
        with open(marker, "a") as f:
            f.write(json.dumps({"resume": resume_from_checkpoint(), "first_step": state.global_step}) + "\n")

    def on_step_end(self, args, state, control, **kw):
        progress.report(stage="train", completed=state.global_step, total=steps)
        time.sleep(0.05)


torch.manual_seed(0)
config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16, bos_token_id=0, eos_token_id=0)
args = TrainingArguments(output_dir=os.path.join(os.environ["NODUS_STATE_DIR"], "out"), max_steps=steps,
                         per_device_train_batch_size=4, save_strategy="no", logging_strategy="no", report_to=[],
                         use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Data(),
                  callbacks=[NodusCheckpointCallback(), Report()])
trainer.train(resume_from_checkpoint=resume_from_checkpoint())
with open(marker, "a") as f:
    f.write(json.dumps({"done": trainer.state.global_step}) + "\n")
"""


@pytest.fixture
def agent(coordinator: Coordinator, tmp_path: Path) -> Iterator[AgentProcess]:
    with start_agent(coordinator, tmp_path / "agent", node="hf-node") as a:
        yield a


def lines(marker: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in marker.read_text().splitlines()]


def test_a_suspended_trainer_resumes_from_the_checkpoint_it_saved(coordinator: Coordinator, agent: AgentProcess,
                                                                  tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    create(coordinator, "gpt", command=[sys.executable, "-c", TRAIN, str(marker), str(STEPS)],
           recovery={"checkpoint": {"integration": "HFTrainer"}})
    wait_job(coordinator, "gpt", lambda j: units(j) >= 10, timeout=120, what="the Trainer to pass step 10")

    suspend(coordinator, "gpt")
    first = attempts_of(coordinator, "gpt")[0]
    [record] = first["status"]["checkpoints"]
    assert record["reason"] == "Suspend", record

    patch_state(coordinator, "gpt", "Running")
    j = wait_job(coordinator, "gpt", lambda j: j["status"].get("phase") in ("Succeeded", "Failed"), timeout=180,
                 what="the resumed Trainer to finish")
    assert j["status"]["phase"] == "Succeeded", j["status"]
    assert j["status"]["checkpoint"]["restoredFromSeq"] == record["seq"]

    begin, resumed, done = lines(marker)
    assert begin == {"resume": None, "first_step": 0}
    # The Trainer saved at the step end after the request and was held there for the copy: the resume
    # names that checkpoint and training continues from its step, not from 0.
    saved = Path(resumed["resume"])
    assert saved.name.startswith("checkpoint-") and saved.parent.name == "out", resumed
    step = int(saved.name.removeprefix("checkpoint-"))
    assert 10 <= step < STEPS and resumed["first_step"] == step, resumed
    assert done == {"done": STEPS}
