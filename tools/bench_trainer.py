"""Benchmark the FSDP trainer: a train step on packed micro-batches against two padded baselines.

Every variant trains the same samples, drawn with the same seed, with lengths from a long-tailed
distribution like RL completions (prompt lengths uniform in [seq_len/64, seq_len/16), completion
lengths log-normal around seq_len/8, cut so that prompt + completion ≤ ``--seq-len``). Every variant
gives a micro-batch the same token budget, ``--seq-len`` tokens (rows × row length ≤ ``--seq-len``,
at least one row):

* ``packed``: ``telescope_algos.pack_samples`` (first-fit-decreasing into rows of ``--seq-len``
  tokens, each row padded to a multiple of 64, samples isolated by the attention);
* ``sorted_padded``: the baseline real trainers use: samples sorted by length, longest first, cut
  greedily into micro-batches (the next sample joins while rows × the micro-batch's longest stays
  within the budget), each micro-batch right-padded to its own longest sample;
* ``padded``: the naive baseline: every sample padded to the longest of the step, in input order,
  ``seq_len // longest`` rows per micro-batch;
* ``packed_shared``, only with ``--group-size G`` > 1 (the samples then come in groups of G that
  share their prompt, as a GRPO step's do): ``pack_samples(..., share_prompts=True)``, each group's
  prompt packed and computed once (docs/algorithms.md#shared-prompts), on the trainer's per-sample
  SDPA (``telescope_packed_sdpa``, the CPU default; on a GPU it replaces flash-attn for this
  variant only). Its real tokens per computed token exceed 1: a sample's real tokens count its
  whole prompt.
* ``packed_lora``, only with ``--lora-rank R`` > 0: ``packed``'s micro-batches on a trainer with
  LoRA adapters of rank R on the attention and MLP projections (``lora_rank``, PEFT; the base
  frozen, optimizer state for the adapters only), against ``packed`` as full fine-tuning.

Each variant runs in a fresh child process (the script re-executed with ``--only VARIANT --json``):
one model load, ``--warmup`` untimed steps (at least one: it creates the optimizer state), then
``--steps`` timed steps; the clock is read after ``torch.cuda.synchronize()`` on CUDA, and the
trainer's timeline is drained after each step outside the clock, as the training loop does.
``--repeats`` rounds run every variant once, the order alternating (packed, sorted_padded, padded,
then reversed, ...). Per variant the report gives the fastest round (noise only slows a run down)
and the median peak memory over rounds, and every round besides.

* ``tokens_per_s``: real tokens (prompt + completion, no padding) per second of a train step, so the
  ratios are speed-ups in useful tokens;
* ``real_per_computed``: real tokens / tokens the model computes (Σ rows × padded length over the
  micro-batches);
* ``peak_extra_mb``: the extra memory a train step needs on top of the model and optimizer: on CUDA
  the allocator's peak (``torch.cuda.max_memory_allocated``, reset after the untimed steps) minus the
  memory allocated then; on CPU the resident-set high-water mark (``VmHWM``, reset through
  ``/proc/self/clear_refs`` after glibc's ``malloc_trim``) minus the resident set then.
* ``trainer_mb``: the whole trainer's peak: on CUDA the allocator's peak; on CPU the resident-set
  high-water mark minus the resident set before the model was loaded (torch and the libraries left
  out). Model, gradients, optimizer state and activations: what LoRA saves shows here.

On a GPU the model is a random ~0.5B Llama shaped like Qwen2.5-0.5B (hidden 896, 24 layers, 14 heads,
2 KV heads, vocab 151936, tied), trained in bf16 mixed precision, and MFU = 6·params·(packed real
tokens/s) / peak bf16 dense FLOP/s (989e12 for H100/H200; the recomputation of gradient checkpointing
is not counted, as usual). On CPU it is a 2-layer Llama of 3.6M parameters in float32.

Usage: ``python tools/bench_trainer.py [--samples 24] [--seq-len 512] [--steps 3] [--repeats 2]
[--size cpu|0.5b|smollm2] [--group-size 1] [--lora-rank 0]``. The last line is ``RESULT
[lora_memory_vs_full=<trainer_mb ratio> lora_speed_vs_full=<tokens/s ratio>]
[shared_vs_packed=<tokens/s ratio> shared_vs_sorted=<tokens/s ratio>] packed_vs_sorted=<tokens/s
ratio> packed_vs_padded=<tokens/s ratio> memory_vs_sorted=<peak ratio> memory_vs_padded=<peak ratio>
[mfu=<x>]`` (the first over the second: above 1 is faster, below 1 is less memory).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = {
    # layers, hidden, heads, kv_heads, intermediate, vocab, tied
    "cpu": (2, 256, 4, 2, 704, 4096, False),
    "0.5b": (24, 896, 14, 2, 4864, 151936, True),
    "smollm2": (30, 576, 9, 3, 1536, 49152, True),  # SmolLM2-135M's shape, random weights
}
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
VARIANTS = ("packed", "sorted_padded", "padded")
SHARED = "packed_shared"
LORA = "packed_lora"
CHILD_MARKER = "BENCH_TRAINER_VARIANT "


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


def draw_samples(n: int, *, max_len: int, vocab: int, seed: int, group_size: int = 1):
    """Long-tailed lengths: prompt ~ U(max_len/64, max_len/16), completion ~ LogNormal, capped; every
    ``group_size`` consecutive samples share one prompt."""
    import numpy as np

    from telescope_algos import TrainingSample

    rng = np.random.default_rng(seed)
    out: list = []
    prompt: list[int] = []
    p = 0
    for i in range(n):
        new_prompt = i % group_size == 0
        if new_prompt:
            p = int(rng.integers(max(2, max_len // 64), max(3, max_len // 16)))
        median = max_len / 8
        c = int(np.clip(rng.lognormal(math.log(median), 1.0), 4, max_len - p))
        if new_prompt:  # drawn here: with group_size 1 the draws are those of every earlier run
            prompt = rng.integers(3, vocab, p).tolist()
        out.append(
            TrainingSample(
                prompt_ids=prompt,
                completion_ids=rng.integers(3, vocab, c).tolist(),
                advantage=float(rng.standard_normal()),
                rollout_logprobs=(-rng.random(c) * 3).tolist(),
            )
        )
    return out


def sample_length(sample) -> int:
    return len(sample.prompt_ids) + len(sample.completion_ids)


# -- the micro-batches of each variant -------------------------------------------------------------


def rows_micro_batch(chunk, length: int):
    """One ``MicroBatch`` of ``len(chunk)`` rows, each sample right-padded to ``length``; the loss
    tokens are the completions, positions run 0…length-1 in every row."""
    import torch

    from telescope_algos import MicroBatch

    rows = len(chunk)
    ids = torch.zeros(rows, length, dtype=torch.long)
    mask = torch.zeros(rows, length, dtype=torch.bool)
    adv = torch.zeros(rows, length)
    lps = torch.zeros(rows, length)
    for r, s in enumerate(chunk):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        ids[r, : p + c] = torch.tensor([*s.prompt_ids, *s.completion_ids])
        mask[r, p : p + c] = True
        adv[r, : p + c] = s.advantage
        lps[r, p : p + c] = torch.tensor(s.rollout_logprobs)
    return MicroBatch(
        input_ids=ids,
        position_ids=torch.arange(length).expand(rows, -1).contiguous(),
        loss_mask=mask,
        advantages=adv,
        rollout_logprobs=lps,
        num_samples=rows,
        num_tokens=int(mask.sum()),
    )


def padded_micro_batches(samples, seq_len: int):
    """Every sample right-padded to the longest of the step; ``seq_len // longest`` rows per micro-batch."""
    longest = max(sample_length(s) for s in samples)
    rows = max(1, seq_len // longest)
    return [rows_micro_batch(samples[i : i + rows], longest) for i in range(0, len(samples), rows)]


def length_sorted_groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices by decreasing length, cut greedily: a group takes the next one while (its rows + 1) × its
    longest (its first) stays within ``budget``; every group has at least one."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def sorted_padded_micro_batches(samples, seq_len: int):
    """Samples sorted by length into micro-batches of at most ``seq_len`` tokens (rows × own longest),
    each padded to its own longest sample."""
    lengths = [sample_length(s) for s in samples]
    groups = length_sorted_groups(lengths, seq_len)
    return [rows_micro_batch([samples[i] for i in g], lengths[g[0]]) for g in groups]


def micro_batches_for(variant: str, samples, seq_len: int):
    """The micro-batches ``variant`` trains on (module docstring)."""
    if variant in ("packed", SHARED):
        from telescope_algos import pack_samples

        (packed,) = pack_samples(
            samples, seq_len=seq_len, pad_to_multiple_of=64, share_prompts=variant == SHARED
        )
        return packed
    if variant == "sorted_padded":
        return sorted_padded_micro_batches(samples, seq_len)
    if variant == "padded":
        return padded_micro_batches(samples, seq_len)
    raise ValueError(f"unknown variant {variant!r}; known: {', '.join((*VARIANTS, SHARED))}")


# -- measurement (in one process) -------------------------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _trim_heap() -> None:
    """Hand freed heap pages back to the OS (glibc), so the resident set counts what is in use."""
    name = ctypes.util.find_library("c")
    if name:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(name).malloc_trim(0)


def _memory_base(cuda: bool) -> int:
    """Reset the peak tracker and return the memory held now, in bytes (module docstring)."""
    import torch

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    _trim_heap()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current resident set
    return _status_kib("VmRSS") * 1024


def _memory_peak(cuda: bool) -> int:
    import torch

    if cuda:
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return _status_kib("VmHWM") * 1024


def _clock(cuda: bool) -> float:
    """``time.perf_counter()`` once the device has finished the work queued so far."""
    import torch

    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter()


def measure(trainer, micro_batches, *, real_tokens: int, warmup: int, steps: int) -> dict:
    """``warmup`` untimed then ``steps`` timed train steps; the memory base is read on entry (call it
    after the first step: optimizer state). Also used by ``bench_context_parallel.py``."""
    cuda = trainer.device.type == "cuda"
    base = _memory_base(cuda)
    for s in range(warmup):
        trainer.train_step(micro_batches, step=s)
        trainer.timeline.drain()
    elapsed, metrics = 0.0, {}
    for s in range(steps):
        t0 = _clock(cuda)
        metrics = trainer.train_step(micro_batches, step=warmup + s)
        elapsed += _clock(cuda) - t0
        trainer.timeline.drain()
    peak = _memory_peak(cuda)
    shape = micro_batches[0].input_ids.shape
    return {
        "micro_batches": len(micro_batches),
        "rows_x_len": f"{shape[0]}x{shape[1]}",
        "step_s": elapsed / steps,
        "tokens_per_s": real_tokens * steps / elapsed,
        "peak_extra_mb": (peak - base) / 2**20,
        "peak_mb": peak / 2**20,
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


# -- one variant (the child process) ----------------------------------------------------------------


def _config(model: str, seq_len: int, gpu: bool, lora_rank: int = 0):
    import telescope_config

    values = {
        **telescope_config.defaults(),
        "lora_rank": lora_rank,
        "model": model,
        "environments": [{"name": "countdown"}],
        "trainer_num_workers": 1,
        "mixed_precision_dtype": "bfloat16" if gpu else None,
        "learning_rate": 1e-6,
        "max_tokens": seq_len // 2,
        "seq_len": seq_len,
        "max_model_len": seq_len,
    }
    return telescope_config.TelescopeConfig.model_validate(values)


def _device_name(gpu: bool) -> str:
    import torch

    return torch.cuda.get_device_name() if gpu else f"{platform.processor() or 'cpu'} x{os.cpu_count()}"


def _train(trainer, micro_batches, args: argparse.Namespace, real_tokens: int) -> dict:
    """The untimed steps, then :func:`measure` (or, with ``--profile``, one profiled step)."""
    for s in range(max(1, args.warmup)):  # the first: optimizer state, allocator caches
        trainer.train_step(micro_batches, step=s)
        trainer.timeline.drain()
    if args.profile:
        _profile(trainer, micro_batches)
        return {"profiled": True}
    return measure(trainer, micro_batches, real_tokens=real_tokens, warmup=0, steps=args.steps)


def run_variant(args: argparse.Namespace) -> dict:
    """Train ``args.only``'s micro-batches on a fresh trainer in this process; its numbers."""
    import torch

    from telescope_trainer_fsdp import create_trainer

    gpu = torch.cuda.is_available()
    samples = draw_samples(
        args.samples,
        max_len=args.seq_len,
        vocab=SIZES[args.size][5],
        seed=args.seed,
        group_size=args.group_size,
    )
    lora_rank = args.lora_rank if args.only == LORA else 0
    mbs = micro_batches_for("packed" if args.only == LORA else args.only, samples, args.seq_len)
    attention = "telescope_packed_sdpa" if args.only == SHARED else None
    lengths = sorted(sample_length(s) for s in samples)
    real, computed = sum(lengths), sum(mb.input_ids.numel() for mb in mbs)
    with tempfile.TemporaryDirectory(prefix="bench_trainer_") as tmp:
        n_params = build_model(Path(tmp), args.size)
        _trim_heap()
        before = 0 if gpu else _status_kib("VmRSS") * 1024  # the libraries, before the trainer's model
        trainer = create_trainer(_config(tmp, args.seq_len, gpu, lora_rank), attn_implementation=attention)
        if args.only == SHARED and not trainer.shares_prompts:
            raise SystemExit("bench_trainer: this trainer's attention does not share prompts")
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        if (args.only == LORA) != (trainable < n_params):
            raise SystemExit(f"bench_trainer: {args.only} trains {trainable} of {n_params} parameters")
        try:
            res = _train(trainer, mbs, args, real)
        finally:
            trainer.close()
    if "peak_mb" in res:
        res["trainer_mb"] = res["peak_mb"] - before / 2**20
    return {
        "variant": args.only,
        "device": _device_name(gpu),
        "cuda": gpu,
        "params": n_params,
        "real_tokens": real,
        "length_p50_p90_max": [lengths[len(lengths) // 2], lengths[int(len(lengths) * 0.9)], lengths[-1]],
        "computed_tokens": computed,
        "real_per_computed": real / computed,
        **res,
    }


# -- the comparison (the parent process) ------------------------------------------------------------


def run_child(args: argparse.Namespace, variant: str, *, profile: bool = False) -> dict:
    """Run ``variant`` in a fresh interpreter; its JSON (its other output goes to stderr)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--only", variant, "--json", "--size", args.size,
           "--samples", str(args.samples), "--seq-len", str(args.seq_len), "--warmup", str(args.warmup),
           "--steps", str(args.steps), "--seed", str(args.seed),
           "--group-size", str(args.group_size), "--lora-rank", str(args.lora_rank)]  # fmt: skip
    if profile:
        cmd.append("--profile")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    lines = proc.stdout.splitlines()
    found = [line for line in lines if line.startswith(CHILD_MARKER)]
    for line in lines:
        if not line.startswith(CHILD_MARKER):
            print(line, file=sys.stderr)
    if proc.returncode != 0 or not found:
        raise SystemExit(f"bench_trainer: the {variant} run exited with {proc.returncode} and no result")
    return json.loads(found[-1][len(CHILD_MARKER) :])


def variants(group_size: int, lora_rank: int = 0) -> tuple[str, ...]:
    """The variants a run compares: ``packed_shared`` too when samples come in groups, ``packed_lora``
    with a LoRA rank."""
    extra = ((SHARED,) if group_size > 1 else ()) + ((LORA,) if lora_rank > 0 else ())
    return (*extra, *VARIANTS)


def variant_order(round_index: int, group_size: int = 1, lora_rank: int = 0) -> tuple[str, ...]:
    """Even rounds in :func:`variants` order, odd rounds reversed."""
    order = variants(group_size, lora_rank)
    return order if round_index % 2 == 0 else order[::-1]


def run_rounds(args: argparse.Namespace) -> dict[str, list[dict]]:
    """``args.repeats`` rounds of every variant, each run in its own process; the runs per variant."""
    runs: dict[str, list[dict]] = {v: [] for v in variants(args.group_size, args.lora_rank)}
    for r in range(args.repeats):
        for variant in variant_order(r, args.group_size, args.lora_rank):
            print(f"bench_trainer: round {r + 1}/{args.repeats}: {variant}", file=sys.stderr, flush=True)
            runs[variant].append(run_child(args, variant))
    return runs


def summarise(runs: list[dict]) -> dict:
    """The fastest run of a variant, with the median peak memory over its runs and every run's numbers."""
    fastest = min(runs, key=lambda r: r["step_s"])
    keep = ("micro_batches", "rows_x_len", "computed_tokens", "real_per_computed", "tokens_per_s", "step_s")
    return {
        **{k: fastest[k] for k in keep},
        "peak_extra_mb": statistics.median(r["peak_extra_mb"] for r in runs),
        "peak_mb": statistics.median(r["peak_mb"] for r in runs),
        "trainer_mb": statistics.median(r["trainer_mb"] for r in runs),
        "loss": fastest["loss"],
        "rounds": [{k: r[k] for k in ("step_s", "tokens_per_s", "peak_extra_mb")} for r in runs],
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def result_line(res: dict[str, dict], first: dict) -> str:
    """``RESULT [shared_vs_packed=… shared_vs_sorted=…] packed_vs_sorted=… packed_vs_padded=…
    memory_vs_sorted=… memory_vs_padded=… [mfu=…]``."""
    packed, ratios = res["packed"], []
    if LORA in res:
        ratios.append(f"lora_memory_vs_full={_ratio(res[LORA]['trainer_mb'], packed['trainer_mb']):.2f}")
        ratios.append(f"lora_speed_vs_full={_ratio(res[LORA]['tokens_per_s'], packed['tokens_per_s']):.2f}")
    if SHARED in res:
        for short, variant in (("packed", "packed"), ("sorted", "sorted_padded")):
            ratios.append(
                f"shared_vs_{short}={_ratio(res[SHARED]['tokens_per_s'], res[variant]['tokens_per_s']):.2f}"
            )
    for key, field in (("packed_vs", "tokens_per_s"), ("memory_vs", "peak_extra_mb")):
        for short, variant in (("sorted", "sorted_padded"), ("padded", "padded")):
            ratios.append(f"{key}_{short}={_ratio(packed[field], res[variant][field]):.2f}")
    line = "RESULT " + " ".join(ratios)
    peak = next((v for k, v in PEAK_FLOPS.items() if k in first["device"]), None) if first["cuda"] else None
    if peak is not None:
        line += f" mfu={6 * first['params'] * packed['tokens_per_s'] / peak:.3f}"
    return line


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default=None, help="0.5b on GPU, else cpu")
    parser.add_argument("--samples", type=int, default=None, help="default 24 (cpu) / 64 (0.5b)")
    parser.add_argument("--seq-len", type=int, default=None, help="default 512 (cpu) / 4096 (0.5b)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per run (at least 1 is run)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over the variants, order alternating")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--group-size", type=int, default=1, help="samples per prompt (>1 adds packed_shared)"
    )
    parser.add_argument(
        "--lora-rank", type=int, default=0, help="> 0 adds packed_lora: LoRA adapters of this rank"
    )
    parser.add_argument("--profile", action="store_true", help="print the top ops of one packed step")
    parser.add_argument("--only", choices=(*VARIANTS, SHARED, LORA), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1 or args.repeats < 1 or args.group_size < 1:
        parser.error("--steps, --repeats and --group-size must be at least 1")
    if not 0 <= args.lora_rank <= 512:
        parser.error("--lora-rank must be in [0, 512]")
    if args.size is None:
        import torch

        args.size = "0.5b" if torch.cuda.is_available() else "cpu"
    args.samples = args.samples or (64 if args.size == "0.5b" else 24)
    args.seq_len = args.seq_len or (4096 if args.size == "0.5b" else 512)
    return args


def main() -> None:
    args = parse_args()
    if args.only:
        res = run_variant(args)
        print(f"{CHILD_MARKER}{json.dumps(res)}" if args.json else json.dumps(res, indent=1), flush=True)
        return
    if args.profile:
        run_child(args, "packed", profile=True)
    runs = run_rounds(args)
    res = {v: summarise(runs[v]) for v in variants(args.group_size, args.lora_rank)}
    first = runs["packed"][0]
    keys = ("device", "params", "real_tokens", "length_p50_p90_max")
    summary = {**{k: first[k] for k in keys}, "model": args.size, "samples": args.samples}
    summary.update(
        seq_len=args.seq_len,
        steps=args.steps,
        repeats=args.repeats,
        group_size=args.group_size,
        lora_rank=args.lora_rank,
        **res,
    )
    print(json.dumps(summary, indent=1))
    print(result_line(res, first))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
