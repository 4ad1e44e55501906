"""Benchmark the FSDP trainer: a train step on packed micro-batches against the same samples padded.

Both variants train the same samples, drawn once, with lengths from a long-tailed distribution like
RL completions (prompt lengths uniform, completion lengths log-normal, cut at the generation budget):

* ``packed``: ``telescope_algos.pack_samples`` (first-fit-decreasing into rows of ``--seq-len``
  tokens, samples isolated by the attention);
* ``padded``: every sample padded to the longest of the step, ``seq_len // longest`` rows per
  micro-batch (the same token budget per micro-batch as packing; at least one row).

After one untimed step (optimizer state, allocator caches), each variant runs ``--warmup`` untimed
steps, then ``--steps`` timed ones, in the same process on the same trainer (one model load).
Throughput counts real tokens only (prompt + completion, no padding), so ``packed_vs_padded`` is
the speed-up in useful tokens per second. Peak memory: on CUDA the allocator's peak
(``torch.cuda.max_memory_allocated``, reset per variant) minus the memory held before the
variant's first step; on CPU the resident-set high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs``) minus the resident set before the variant's first step. Both are the extra
memory a train step needs on top of the model and optimizer. On a GPU the model is a random ~0.5B
Llama shaped like Qwen2.5-0.5B (hidden 896, 24 layers, 14 heads, 2 KV heads, vocab 151936, tied),
trained in bf16 mixed precision, and MFU = 6·params·(tokens/s) / peak bf16 dense FLOP/s (989e12 for
H100/H200; the recomputation of gradient checkpointing is not counted, as usual).

Usage: ``python tools/bench_trainer.py [--samples 24] [--seq-len 512] [--steps 3] [--size cpu|0.5b]``.
The last line is ``RESULT packed_vs_padded=<tokens/s ratio> memory_vs_padded=<peak ratio> [mfu=<x>]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

SIZES = {
    # layers, hidden, heads, kv_heads, intermediate, vocab, tied
    "cpu": (2, 256, 4, 2, 704, 4096, False),
    "0.5b": (24, 896, 14, 2, 4864, 151936, True),
}
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def build_model(out: Path, size: str) -> int:
    """A random Llama of ``size`` saved in ``out`` (config + safetensors); returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    layers, hidden, heads, kv, inter, vocab, tied = SIZES[size]
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=32768,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def draw_samples(n: int, *, max_len: int, vocab: int, seed: int):
    """Long-tailed lengths: prompt ~ U(max_len/64, max_len/16), completion ~ LogNormal, capped."""
    import numpy as np

    from telescope_algos import TrainingSample

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        p = int(rng.integers(max(2, max_len // 64), max(3, max_len // 16)))
        median = max_len / 8
        c = int(np.clip(rng.lognormal(math.log(median), 1.0), 4, max_len - p))
        out.append(
            TrainingSample(
                prompt_ids=rng.integers(3, vocab, p).tolist(),
                completion_ids=rng.integers(3, vocab, c).tolist(),
                advantage=float(rng.standard_normal()),
                rollout_logprobs=(-rng.random(c) * 3).tolist(),
            )
        )
    return out


def padded_micro_batches(samples, seq_len: int):
    """Every sample right-padded to the longest; ``seq_len // longest`` rows per micro-batch."""
    import torch

    from telescope_algos import MicroBatch

    longest = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    rows = max(1, seq_len // longest)
    out = []
    for i in range(0, len(samples), rows):
        chunk = samples[i : i + rows]
        ids = torch.zeros(len(chunk), longest, dtype=torch.long)
        mask = torch.zeros(len(chunk), longest, dtype=torch.bool)
        adv = torch.zeros(len(chunk), longest)
        lps = torch.zeros(len(chunk), longest)
        for r, s in enumerate(chunk):
            p, c = len(s.prompt_ids), len(s.completion_ids)
            ids[r, : p + c] = torch.tensor([*s.prompt_ids, *s.completion_ids])
            mask[r, p : p + c] = True
            adv[r, : p + c] = s.advantage
            lps[r, p : p + c] = torch.tensor(s.rollout_logprobs)
        out.append(
            MicroBatch(
                input_ids=ids,
                position_ids=torch.arange(longest).expand(len(chunk), -1).contiguous(),
                loss_mask=mask,
                advantages=adv,
                rollout_logprobs=lps,
                num_samples=len(chunk),
                num_tokens=int(mask.sum()),
            )
        )
    return out


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure(trainer, micro_batches, *, real_tokens: int, warmup: int, steps: int) -> dict:
    import torch

    cuda = trainer.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset VmHWM to the current resident set
        base = _status_kib("VmRSS") * 1024
    for s in range(warmup):
        trainer.train_step(micro_batches, step=s)
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for s in range(steps):
        metrics = trainer.train_step(micro_batches, step=warmup + s)
    if cuda:
        torch.cuda.synchronize()
    elapsed = (time.perf_counter() - t0) / steps
    peak = torch.cuda.max_memory_allocated() if cuda else _status_kib("VmHWM") * 1024
    return {
        "micro_batches": len(micro_batches),
        "rows_x_len": f"{micro_batches[0].input_ids.shape[0]}x{micro_batches[0].input_ids.shape[1]}",
        "step_s": elapsed,
        "tokens_per_s": real_tokens / elapsed,
        "peak_extra_mb": (peak - base) / 2**20,
        "loss": metrics["loss"],
    }


def _profile(trainer, micro_batches) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if trainer.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        trainer.train_step(micro_batches, step=0)
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if trainer.device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25), file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default=None, help="0.5b on GPU, else cpu")
    parser.add_argument("--samples", type=int, default=None, help="default 24 (cpu) / 64 (0.5b)")
    parser.add_argument("--seq-len", type=int, default=None, help="default 512 (cpu) / 4096 (0.5b)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="print the top ops of one packed step")
    args = parser.parse_args()

    import torch

    import telescope_config
    from telescope_algos import pack_samples
    from telescope_trainer_fsdp import create_trainer

    gpu = torch.cuda.is_available()
    size = args.size or ("0.5b" if gpu else "cpu")
    n_samples = args.samples or (64 if size == "0.5b" else 24)
    seq_len = args.seq_len or (4096 if size == "0.5b" else 512)
    vocab = SIZES[size][5]
    samples = draw_samples(n_samples, max_len=seq_len, vocab=vocab, seed=args.seed)
    lengths = sorted(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    real_tokens = sum(lengths)

    with tempfile.TemporaryDirectory(prefix="bench_trainer_") as tmp:
        n_params = build_model(Path(tmp), size)
        values = {
            **telescope_config.defaults(),
            "model": tmp,
            "environments": [{"name": "countdown"}],
            "trainer_num_workers": 1,
            "mixed_precision_dtype": "bfloat16" if gpu else None,
            "learning_rate": 1e-6,
            "max_tokens": seq_len // 2,
            "seq_len": seq_len,
            "max_model_len": seq_len,
        }
        cfg = telescope_config.TelescopeConfig.model_validate(values)
        trainer = create_trainer(cfg)
        try:
            (packed,) = pack_samples(samples, seq_len=seq_len, pad_to_multiple_of=64)
            padded = padded_micro_batches(samples, seq_len)
            trainer.train_step(packed, step=0)  # first step: optimizer state, allocator caches
            if args.profile:
                _profile(trainer, packed)
            res = {}
            for name, mbs in (("padded", padded), ("packed", packed)):
                res[name] = measure(
                    trainer, mbs, real_tokens=real_tokens, warmup=args.warmup, steps=args.steps
                )
        finally:
            trainer.close()

    device = torch.cuda.get_device_name() if gpu else f"{platform.processor() or 'cpu'} x{os.cpu_count()}"
    print(
        json.dumps(
            {
                "device": device,
                "model": size,
                "params": n_params,
                "samples": n_samples,
                "seq_len": seq_len,
                "real_tokens": real_tokens,
                "length_p50_p90_max": [
                    lengths[len(lengths) // 2],
                    lengths[int(len(lengths) * 0.9)],
                    lengths[-1],
                ],
                **res,
            },
            indent=1,
        )
    )
    speed = res["packed"]["tokens_per_s"] / res["padded"]["tokens_per_s"]
    memory = res["packed"]["peak_extra_mb"] / res["padded"]["peak_extra_mb"]
    line = f"RESULT packed_vs_padded={speed:.2f} memory_vs_padded={memory:.2f}"
    if gpu:
        peak = next((v for k, v in PEAK_FLOPS.items() if k in device), None)
        if peak is not None:
            line += f" mfu={6 * n_params * res['packed']['tokens_per_s'] / peak:.3f}"
    print(line)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
