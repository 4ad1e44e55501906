"""Benchmark telescope_algos' chunked log-prob + entropy + loss against a naive unchunked version.

What is timed: one training-style pass over a ``[1, tokens, vocab]`` float32 logits tensor (as a
model's output, with gradient): log-probabilities of the taken tokens and the full-vocabulary
entropy at temperature 0.7, ``compute_loss`` (GRPO with TIS, a k3 KL penalty and an entropy bonus,
so both outputs need gradients), and the backward pass to the logits. ``naive`` is the textbook
version (``log_softmax`` over the whole ``tokens × vocab`` slice, ``exp``, product, gather, each a
``tokens × vocab`` tensor kept for backward); ``chunked`` is
``telescope_algos.token_logprobs_and_entropy``. The loss part is the same function in both.

How memory is measured: torch's CPU allocator has no peak statistics, and tracemalloc does not see
torch's buffers, so each variant runs in a **fresh subprocess** and reads the process's resident-set
high-water mark (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, Linux: KiB). The reported peak is
that high-water mark after the first pass minus the mark right after the inputs were allocated, i.e.
the extra memory the pass needed (the gradient of the logits, ``tokens × vocab × 4`` bytes, is part
of it in both variants: it is unavoidable). Large CPU tensors are mmap-backed and returned to the
OS when freed, so the high-water mark is the true peak of live tensors plus small overhead.

Time: the best of ``--repeats`` passes after the first (warm-up) one.

Usage: ``python tools/bench_algos.py [--tokens 16384] [--vocab 32768] [--chunk-size 1024]``. The last
line is ``RESULT speedup_vs_naive=<naive time / chunked time> memory_vs_naive=<chunked peak / naive peak>``.
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

TEMPERATURE = 0.7


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _naive_logprobs_and_entropy(logits, input_ids, temperature):
    import torch

    logp = (logits[:, :-1] / temperature).log_softmax(-1)
    lp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    pad = lp.new_zeros(lp.shape[0], 1)
    return torch.cat([pad, lp], 1), torch.cat([pad, ent], 1)


def _child(variant: str, tokens: int, vocab: int, chunk_size: int, repeats: int) -> dict:
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
        if variant == "chunked":
            lp, ent = ta.token_logprobs_and_entropy(
                logits, input_ids, temperature=TEMPERATURE, chunk_size=chunk_size
            )
        else:
            lp, ent = _naive_logprobs_and_entropy(logits, input_ids, TEMPERATURE)
        inputs = ta.LossInputs(
            lp, advantages=advantages, loss_mask=mask, rollout_logprobs=rollout, entropy=ent
        )
        loss, _ = ta.compute_loss(inputs, options)
        loss.backward()
        return time.perf_counter() - start

    first = one_pass()
    peak = _maxrss_bytes() - baseline
    times = [one_pass() for _ in range(repeats)] or [first]
    checksum = float(logits.grad.double().abs().sum())
    return {"variant": variant, "seconds": min(times), "peak_bytes": peak, "checksum": checksum}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variant", choices=["chunked", "naive"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(_child(args.variant, args.tokens, args.vocab, args.chunk_size, args.repeats)))
        return

    import torch

    machine = f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPU cores"
    print(f"machine: {machine}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    gib = args.tokens * args.vocab * 4 / 2**30
    print(f"size: {args.tokens} tokens x {args.vocab} vocab float32 (logits {gib:.2f} GiB)")
    results = {}
    for variant in ("naive", "chunked"):
        cmd = [
            sys.executable,
            __file__,
            "--variant",
            variant,
            "--tokens",
            str(args.tokens),
            "--vocab",
            str(args.vocab),
        ]
        cmd += ["--chunk-size", str(args.chunk_size), "--repeats", str(args.repeats)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[variant]
        print(f"{variant:8s} time {r['seconds']:.3f} s   peak extra memory {r['peak_bytes'] / 2**30:.2f} GiB")
    naive, chunked = results["naive"], results["chunked"]
    rel = abs(naive["checksum"] - chunked["checksum"]) / max(abs(naive["checksum"]), 1e-30)
    print(f"gradient checksum relative difference: {rel:.2e}")
    speedup = naive["seconds"] / chunked["seconds"]
    memory = chunked["peak_bytes"] / max(naive["peak_bytes"], 1)
    print(f"RESULT speedup_vs_naive={speedup:.2f} memory_vs_naive={memory:.2f}")


if __name__ == "__main__":
    main()
