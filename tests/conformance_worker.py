"""One trainer rank of the backend conformance test (run as a script, never collected).

    python conformance_worker.py SPEC_JSON     with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set

The spec names the backend, the model folder, config overrides and the steps (lists of sample
dicts). Through the ``telescope.trainers`` entry point, exactly as ``telescope train``: create the
trainer, train, save checkpoints with the orchestrator's layout
(``telescope_orchestrator.run.checkpoints``: begin → ``save_checkpoint`` → commit → prune), load them into a
fresh trainer, convert one with the backend's ``convert_checkpoint``. Writes ``out`` (torch.save) with what
the test compares.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from importlib.metadata import entry_points
from pathlib import Path

warnings.simplefilter("ignore")

import torch  # noqa: E402

import telescope_config  # noqa: E402
from telescope_algos import TOKEN_FIELDS, TrainingSample, pack_samples, sample_tokens  # noqa: E402
from telescope_algos.backend import FROZEN_TOKEN_FIELDS, TrainerBackend  # noqa: E402
from telescope_orchestrator.run import checkpoints as ck  # noqa: E402


def _config(spec: dict) -> telescope_config.TelescopeConfig:
    data = {
        **telescope_config.defaults(),
        "environments": [{"name": "countdown"}],
        "model": spec["model_dir"],
        "train_backend": spec["backend"],
        "trainer_num_workers": int(os.environ["WORLD_SIZE"]),
        **spec["overrides"],
    }
    return telescope_config.TelescopeConfig.model_validate(data)


def _micro_batches(trainer, spec: dict, i: int, seq_len: int):
    samples = [TrainingSample(**s) for s in spec["steps"][i]]
    shards = pack_samples(
        samples,
        seq_len=seq_len,
        pad_to_multiple_of=trainer.row_multiple,
        num_ranks=1,
        share_prompts=trainer.shares_prompts,  # as `telescope train` packs
    )
    return shards[trainer.dp_rank]


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {n: t.detach().cpu().clone() for n, t in trainer.hf_weights()}


def _save(trainer, root: Path, step: int, *, training_state: bool = True, keep_last=None) -> Path:
    tmp = ck.begin(root, step)
    facts = trainer.save_checkpoint(tmp, training_state=training_state)
    path = ck.commit(tmp, step, {**facts, "training_state": training_state})
    ck.prune(root, current=step, keep_last=keep_last, keep_every=None)
    return path


def _tokens(trainer, mbs, samples: list[dict], fields=TOKEN_FIELDS) -> list[dict[str, list[float]]]:
    """The last step's ``step_tokens`` read back by sample (``sample_tokens``), whole sequences."""
    rows = trainer.step_tokens()
    lengths = [len(s["prompt_ids"]) + len(s["completion_ids"]) for s in samples]
    by_field = {f: sample_tokens(mbs, [r[f] for r in rows], lengths) for f in fields}
    return [{f: by_field[f][k].tolist() for f in fields} for k in range(len(samples))]


def _hf_logprobs(model, samples: list[dict]) -> list[list[float]]:
    """transformers' own logprob of each completion token (float32, no dropout)."""
    out = []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s["prompt_ids"] + s["completion_ids"]])
            logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
            n = len(s["prompt_ids"])
            out.append([float(logprobs[n + j - 1, t]) for j, t in enumerate(s["completion_ids"])])
    return out


def _nll(model, samples: list[dict]) -> float:
    """transformers' own token-mean negative log-likelihood of the completion tokens whose mask is 1."""
    total, count = 0.0, 0
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s["prompt_ids"] + s["completion_ids"]])
            logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
            for j, (token, keep) in enumerate(zip(s["completion_ids"], s["completion_mask"], strict=True)):
                if keep:
                    position = len(s["prompt_ids"]) + j  # predicted from the logits one before it
                    total -= float(logprobs[position - 1, token])
                    count += 1
    return total / count


def main(spec: dict) -> None:
    backend = {ep.name: ep for ep in entry_points(group="telescope.trainers")}[spec["backend"]].load()
    config = _config(spec)
    out: dict = {}
    trainer = backend.create_trainer(config, model_path=spec["model_dir"], seed=config.seed)
    out["initial_seed"] = torch.initial_seed()
    out["is_protocol"] = isinstance(trainer, TrainerBackend)
    out["row_multiple"] = trainer.row_multiple
    out["adapter_config"] = trainer.adapter_config()  # lora_rank 0: no adapter, and none to stream
    try:
        next(iter(trainer.adapter_weights()))
        out["adapter_weights_error"] = None
    except ValueError as exc:
        out["adapter_weights_error"] = str(exc)
    out["shares_prompts"] = trainer.shares_prompts
    root = Path(spec["dir"]) / "checkpoints"
    metrics = []
    for i in range(len(spec["steps"])):  # short rows: several micro-batches per step
        mbs = _micro_batches(trainer, spec, i, spec["seq_len"])
        out.setdefault("micro_batch_counts", []).append(len(mbs))
        metrics.append(trainer.train_step(mbs, step=i + 1))
        if i == 0:
            out["tokens_1"] = _tokens(trainer, mbs, spec["steps"][0])
            out["weights_1"] = _weights(trainer)
            out["facts"] = trainer.save_checkpoint(ck.begin(root, 99))  # a bare folder, for its facts
            _save(trainer, root, 1)
    out["metrics"] = metrics
    out["weights_end"] = _weights(trainer)
    _save(trainer, root, 2)
    out["meta_2"] = ck.read_meta(root / "step_2")
    trainer.close()

    # a fresh trainer (another seed) resumed from step_1 redoes step 2 exactly
    trainer = backend.create_trainer(config, model_path=spec["model_dir"], seed=config.seed + 1)
    trainer.load_checkpoint(root / "step_1")
    out["resumed_metrics"] = trainer.train_step(_micro_batches(trainer, spec, 1, spec["seq_len"]), step=2)
    out["resumed_end"] = _weights(trainer)
    _save(trainer, root, 3, training_state=False, keep_last=2)  # retention: step_1 goes
    out["listed"] = [s for s, _ in ck.list_checkpoints(root)]
    out["root"] = sorted(p.name for p in root.iterdir())
    try:
        trainer.save_checkpoint(root / "missing")
        out["missing_folder_error"] = None
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        out["missing_folder_error"] = str(exc)
    trainer.load_checkpoint(root / "step_2")
    out["loaded_end"] = _weights(trainer)
    trainer.load_checkpoint(root / "step_3", weights_only=True)  # ...and the weights-only one
    out["loaded_weights_only"] = _weights(trainer)
    try:
        trainer.load_checkpoint(root / "step_3")
        out["weights_only_error"] = None
    except ValueError as exc:
        out["weights_only_error"] = str(exc)
    trainer.close()

    # the first step's samples in one long row: the same loss, however the step is split
    trainer = backend.create_trainer(config, model_path=spec["model_dir"], seed=config.seed)
    big = _micro_batches(trainer, spec, 0, spec["one_row_seq_len"])
    out["one_row_count"] = len(big)
    out["one_row"] = trainer.train_step(big, step=1)
    trainer.close()

    # on-policy distillation with a reference KL: per-token advantages from the teacher's logprobs
    opd = {
        **spec,
        "overrides": {**spec["overrides"], **spec["opd"]["overrides"]},
        "steps": [spec["opd"]["samples"]],
    }
    trainer = backend.create_trainer(_config(opd), model_path=spec["model_dir"], seed=config.seed)
    mbs = _micro_batches(trainer, opd, 0, spec["seq_len"])
    out["opd"] = trainer.train_step(mbs, step=1)
    out["opd_tokens"] = _tokens(trainer, mbs, opd["steps"][0])
    trainer.close()

    # frozen models in the trainer: a teacher of another size, and the reference model (the starting
    # weights); the samples carry neither's logprobs
    held = spec["frozen"]
    frozen = {**spec, "overrides": {**spec["overrides"], **held["overrides"]}, "steps": [spec["steps"][0]]}
    trainer = backend.create_trainer(
        _config(frozen),
        model_path=spec["model_dir"],
        seed=config.seed,
        frozen_models={"teacher": held["teacher_dir"], "ref": spec["model_dir"]},
    )
    mbs = _micro_batches(trainer, frozen, 0, spec["seq_len"])
    out["frozen"] = trainer.train_step(mbs, step=1)
    fields = (*TOKEN_FIELDS, *FROZEN_TOKEN_FIELDS.values())
    out["frozen_tokens"] = _tokens(trainer, mbs, frozen["steps"][0], fields)
    trainer.close()

    # a supervised step, from the starting weights
    sft = {**spec, "steps": [spec["sft"]]}
    trainer = backend.create_trainer(config, model_path=spec["model_dir"], seed=config.seed)
    out["sft"] = trainer.train_step(_micro_batches(trainer, sft, 0, spec["seq_len"]), step=1, objective="sft")
    out["sft_tokens"] = trainer.step_tokens()
    trainer.close()

    converted = backend.convert_checkpoint(root / "step_2", Path(spec["dir"]) / "hf")
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    out["sft_nll"] = _nll(start, spec["sft"])
    out["hf_logprobs_1"] = _hf_logprobs(start, spec["steps"][0])
    teacher = AutoModelForCausalLM.from_pretrained(held["teacher_dir"], dtype=torch.float32)
    out["hf_teacher_logprobs_1"] = _hf_logprobs(teacher, spec["steps"][0])

    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
    out["converted"] = {n: t.detach().clone() for n, t in model.state_dict().items()}
    torch.save(out, spec["out"])


if __name__ == "__main__":
    assert "RANK" in os.environ, "run with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT"
    main(json.loads(Path(sys.argv[1]).read_text()))
