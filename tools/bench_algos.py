"""Benchmark telescope_algos' chunked log-prob + entropy + loss against two unchunked baselines.

What is timed: one training-style pass over a ``[1, tokens, vocab]`` float32 logits tensor (as a
model's output, with gradient): log-probabilities of the taken tokens and the full-vocabulary
entropy at temperature 0.7, ``compute_loss`` (GRPO with TIS, a k3 KL penalty and an entropy bonus,
so both outputs need gradients), and the backward pass to the logits. Three variants:

- ``naive``: the textbook version (``log_softmax`` over the whole ``tokens × vocab`` slice, ``exp``,
  product, gather, each a ``tokens × vocab`` tensor kept for backward);
- ``unchunked``: ``telescope_algos.token_logprobs_and_entropy`` with ``chunk_size = tokens`` (one
  chunk): the custom autograd function (softmax recomputed in backward) without the chunking;
- ``chunked``: the same function with ``--chunk-size`` positions per chunk.

``*_vs_naive`` is what the package buys over the textbook version, ``*_vs_unchunked`` what chunking
alone buys. The loss part is the same function in every variant.

Correctness check, before any result is printed: each variant's gradient of the logits is reduced
to a per-position fingerprint (in float64: the sum of ``|grad|`` over the vocabulary and the
projection of the gradient on a fixed random vector), and ``unchunked`` and ``chunked`` must match
``naive``: ``torch.allclose(rtol=1e-4, atol=1e-5)`` on the fingerprints divided by the largest
absolute value of each naive fingerprint column. A mismatch exits with status 1 and no RESULT line.

How memory is measured: torch's CPU allocator has no peak statistics, and tracemalloc does not see
torch's buffers, so each variant runs in a **fresh subprocess** and reads the process's resident-set
high-water mark (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, Linux: KiB). The reported peak is
that high-water mark after the first pass minus the mark right after the inputs were allocated, i.e.
the extra memory the pass needed (the gradient of the logits, ``tokens × vocab × 4`` bytes, is part
of it in every variant: it is unavoidable). Large CPU tensors are mmap-backed and returned to the
OS when freed, so the high-water mark is the true peak of live tensors plus small overhead.

Time: the best of ``--repeats`` passes after the first (warm-up) one.

Usage: ``python tools/bench_algos.py [--tokens 16384] [--vocab 32768] [--chunk-size 1024]``. The last
line is ``RESULT speedup_vs_naive=<naive time / chunked time> memory_vs_naive=<chunked peak / naive
peak> speedup_vs_unchunked=<unchunked time / chunked time> memory_vs_unchunked=<chunked peak /
unchunked peak>`` followed by each variant's seconds and peak GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from typing import Any

TEMPERATURE = 0.7
VARIANTS = ("naive", "unchunked", "chunked")
RTOL = 1e-4
"""Relative tolerance of the gradient check (float32 sums over the vocabulary in another order)."""
ATOL = 1e-5
"""Absolute tolerance of the gradient check, as a fraction of the largest naive fingerprint value."""


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _naive_logprobs_and_entropy(logits, input_ids, temperature):
    import torch

    logp = (logits[:, :-1] / temperature).log_softmax(-1)
    lp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    pad = lp.new_zeros(lp.shape[0], 1)
    return torch.cat([pad, lp], 1), torch.cat([pad, ent], 1)


def _logprobs_and_entropy(variant: str, logits, input_ids, chunk_size: int):
    """The variant's ``(logprobs, entropy)``; ``unchunked`` runs the package's function as one chunk."""
    import telescope_algos as ta

    if variant == "naive":
        return _naive_logprobs_and_entropy(logits, input_ids, TEMPERATURE)
    chunk = chunk_size if variant == "chunked" else logits.shape[0] * logits.shape[1]
    return ta.token_logprobs_and_entropy(logits, input_ids, temperature=TEMPERATURE, chunk_size=chunk)


def _grad_fingerprint(grad, rows: int = 1024) -> list[list[float]]:
    """Per position of ``grad [1, tokens, vocab]``: ``[sum |g|, g · w]`` in float64 for a fixed random
    ``w``, computed ``rows`` positions at a time (a small buffer, not a float64 copy of the gradient)."""
    import torch

    flat = grad.reshape(-1, grad.shape[-1])
    w = torch.randn(flat.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    parts = []
    for s in range(0, flat.shape[0], rows):
        g = flat[s : s + rows].double()
        parts.append(torch.stack([g.abs().sum(-1), g @ w], dim=1))
    return torch.cat(parts).tolist()


def _child(variant: str, tokens: int, vocab: int, chunk_size: int, repeats: int) -> dict[str, Any]:
    import torch

    import telescope_algos as ta

    torch.manual_seed(0)
    logits = torch.randn(1, tokens, vocab).requires_grad_()
    input_ids = torch.randint(0, vocab, (1, tokens))
    mask = torch.ones(1, tokens, dtype=torch.bool)
    mask[:, :64] = False
    advantages = torch.randn(1, tokens)
    rollout = -torch.rand(1, tokens) * 3
    options = ta.LossOptions(use_tis=True, kl_penalty_tau=0.01, kl_estimator="k3", entropy_coef=0.01)
    baseline = _maxrss_bytes()

    def one_pass() -> float:
        logits.grad = None
        start = time.perf_counter()
        lp, ent = _logprobs_and_entropy(variant, logits, input_ids, chunk_size)
        inputs = ta.LossInputs(
            lp, advantages=advantages, loss_mask=mask, rollout_logprobs=rollout, entropy=ent
        )
        loss, _ = ta.compute_loss(inputs, options)
        loss.backward()
        return time.perf_counter() - start

    first = one_pass()
    peak = _maxrss_bytes() - baseline
    times = [one_pass() for _ in range(repeats)] or [first]
    grad = logits.grad
    assert grad is not None
    checksum = float(grad.double().abs().sum())
    return {
        "variant": variant,
        "seconds": min(times),
        "peak_bytes": peak,
        "checksum": checksum,
        "fingerprint": _grad_fingerprint(logits.grad),
    }


def _run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one variant in a fresh interpreter (its own memory high-water mark); return its JSON."""
    cmd = [sys.executable, __file__, "--variant", variant, "--tokens", str(args.tokens)]
    cmd += ["--vocab", str(args.vocab), "--chunk-size", str(args.chunk_size), "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"variant {variant} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _check_gradients(results: dict[str, dict[str, Any]]) -> None:
    """Exit 1 unless every variant's gradient fingerprint matches naive's (see the module docstring)."""
    import torch

    naive = results["naive"]
    ref = torch.tensor(naive["fingerprint"], dtype=torch.float64)
    scale = ref.abs().amax(dim=0).clamp_min(1e-300)
    for variant in VARIANTS[1:]:
        got = torch.tensor(results[variant]["fingerprint"], dtype=torch.float64)
        rel = abs(naive["checksum"] - results[variant]["checksum"]) / max(abs(naive["checksum"]), 1e-30)
        err = ((got - ref) / scale).abs()
        worst = int(err.amax(dim=1).argmax())
        print(
            f"gradient check {variant} vs naive: checksum relative difference {rel:.2e}, "
            f"largest scaled fingerprint difference {float(err.max()):.2e} (position {worst})"
        )
        if not torch.allclose(got / scale, ref / scale, rtol=RTOL, atol=ATOL):
            sys.exit(
                f"GRADIENT MISMATCH: {variant} vs naive differ beyond rtol={RTOL:g}, atol={ATOL:g} "
                f"(position {worst}: {got[worst].tolist()} vs {ref[worst].tolist()}); no RESULT"
            )


def _result_line(results: dict[str, dict[str, Any]]) -> str:
    naive, unchunked, chunked = (results[v] for v in VARIANTS)
    fields = {
        "speedup_vs_naive": naive["seconds"] / chunked["seconds"],
        "memory_vs_naive": chunked["peak_bytes"] / max(naive["peak_bytes"], 1),
        "speedup_vs_unchunked": unchunked["seconds"] / chunked["seconds"],
        "memory_vs_unchunked": chunked["peak_bytes"] / max(unchunked["peak_bytes"], 1),
    }
    text = " ".join(f"{k}={v:.2f}" for k, v in fields.items())
    text += "".join(f" {v}_s={results[v]['seconds']:.3f}" for v in VARIANTS)
    text += "".join(f" {v}_peak_gib={results[v]['peak_bytes'] / 2**30:.3f}" for v in VARIANTS)
    return "RESULT " + text


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(_child(args.variant, args.tokens, args.vocab, args.chunk_size, args.repeats)))
        return

    import torch

    machine = f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPU cores"
    print(f"machine: {machine}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    gib = args.tokens * args.vocab * 4 / 2**30
    print(
        f"size: {args.tokens} tokens x {args.vocab} vocab float32 (logits {gib:.2f} GiB), "
        f"chunk size {args.chunk_size}"
    )
    results = {}
    for variant in VARIANTS:
        r = results[variant] = _run_variant(variant, args)
        print(f"{variant:9s} time {r['seconds']:.3f} s   peak extra memory {r['peak_bytes'] / 2**30:.2f} GiB")
    _check_gradients(results)
    print(_result_line(results))


if __name__ == "__main__":
    main()
