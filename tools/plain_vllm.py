"""The plain synchronous GRPO loop of ``tools/plain_grpo.py``, generating with vLLM in the same process.

What a user who knows vLLM would write before reaching for a framework: one process, no server, no
Ray, no overlap. It loads the model, tokenizer, optimizer and prompts, scores, takes the advantages
and trains exactly as ``tools/plain_grpo.py`` does (it imports ``load_loop`` and ``learn`` from
there); only generation differs. Each step:

1. vLLM's offline engine (``vllm.LLM``, float32, eager, in this process) samples ``group_size``
   completions per prompt (``SamplingParams(n=group_size, temperature, max_tokens)``; top-p 1, no
   top-k) from the prompts' token ids, tokenized as the Hugging Face side tokenizes them.
2. The completions become the same ``[left-padded prompt | completion]`` rows Hugging Face
   ``generate`` returns (each completion up to and including its end of sequence), and
   ``plain_grpo.learn`` trains one step on them.
3. The new weights go into the engine in place: ``model_runner.reload_weights`` with the trained
   model's ``named_parameters()`` (Hugging Face names), through ``LLM.collective_rpc`` with a
   function (called directly on the worker: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the engine
   core and its one worker in this process, so nothing is copied or serialized), then the tied
   lm_head's oneDNN handle is packed again (a vLLM CPU bug keeps the old weight there; see
   ``telescope_weightsync.vllm_worker``, which applies Telescope's updates the same way), and the
   prefix cache is emptied (its blocks hold keys and values computed with the old weights; Telescope
   salts each request's cache with the weight version instead). Prompt blocks are still shared
   within a step: a group's ``group_size`` samples compute their prompt once.

Settings as Telescope's CPU quickstart server: float32, eager, prefix caching with 32-token KV
blocks, ``max_model_len`` 512, 2 GiB of KV cache (``VLLM_CPU_KVCACHE_SPACE``, unless set), the
engine's seed (no per-request seed, as Telescope sends none). Threads: the in-process engine binds
no OpenMP threads (vLLM binds only the workers it starts in processes of their own), so generation
and training each use every core, one after the other; torch is left at its default (every core).

``--check-reload`` ends the run with a check that a weight push reaches what the engine serves: the
trained weights are perturbed and pushed as after a step, then the log-probabilities of vLLM's greedy
completion of the first prompt must equal those the Hugging Face model computes (float32 noise) and
differ from those of the initial weights; the run's JSON then holds ``reload_check``. Passed with a
tied and an untied tiny model (``tools/tiny_model.py``); without the lm_head repack the tied one
fails it.

    python tools/plain_vllm.py --model PATH [--steps 15] [--batch 4] [--group-size 8] [--check-reload]
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import plain_grpo  # tools/ is the script's folder, on sys.path when it runs

# Before vLLM is imported: the engine core (and its worker) in this process, 2 GiB of KV cache as
# Telescope's CPU servers get, rather than a share of the machine's memory.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

BLOCK_SIZE = 32  # telescope_orchestrator.cluster.vllm_server.CPU_BLOCK_SIZE
MAX_MODEL_LEN = 512  # the quickstart preset's max_model_len


def make_llm(cfg: dict[str, Any], seed: int) -> Any:
    """vLLM's offline engine on ``cfg["model"]``, in this process."""
    from vllm import LLM

    return LLM(
        model=cfg["model"],
        dtype="float32",
        enforce_eager=True,
        seed=seed,
        max_model_len=MAX_MODEL_LEN,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=True,
    )


def generate(llm: Any, tok: Any, prompts: list[str], cfg: dict[str, Any]) -> tuple[Any, Any, Any]:
    """``[prompt ids left-padded | completion right-padded]`` rows (``group_size`` per prompt, in prompt
    order), the prompts' attention mask repeated to match and the completions' mask (1 for every token
    vLLM returned, its end of sequence included): what ``plain_grpo`` builds from ``generate``."""
    import torch
    from vllm import SamplingParams, TokensPrompt

    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids = [row[m.bool()].tolist() for row, m in zip(enc["input_ids"], enc["attention_mask"], strict=True)]
    params = SamplingParams(
        n=cfg["group_size"],
        temperature=cfg["temperature"],
        top_p=1.0,
        top_k=0,
        max_tokens=cfg["max_tokens"],
        detokenize=False,  # the rewards decode the token ids with the Hugging Face tokenizer, as plain_grpo
    )
    answers = llm.generate([TokensPrompt(prompt_token_ids=x) for x in ids], params, use_tqdm=False)
    completions = [list(c.token_ids) for a in answers for c in sorted(a.outputs, key=lambda c: c.index)]
    longest = max(1, *(len(c) for c in completions))
    rows = torch.full((len(completions), longest), tok.pad_token_id, dtype=enc["input_ids"].dtype)
    mask = torch.zeros(len(completions), longest)
    for i, c in enumerate(completions):
        rows[i, : len(c)] = torch.tensor(c, dtype=rows.dtype)
        mask[i, : len(c)] = 1.0
    group = cfg["group_size"]
    out = torch.cat([enc["input_ids"].repeat_interleave(group, dim=0), rows], dim=1)
    return out, enc["attention_mask"].repeat_interleave(group, dim=0), mask


def _apply_weights(worker: Any, weights: list[tuple[str, Any]]) -> None:
    """Runs on the vLLM worker: reload in place, then repack a tied lm_head (CPU)."""
    worker.model_runner.reload_weights(weights_iterator=iter(weights))
    model = worker.model_runner.get_model()
    lm_head = getattr(model, "lm_head", None)
    tied = getattr(worker.vllm_config.model_config.hf_text_config, "tie_word_embeddings", False)
    if lm_head is not None and tied and hasattr(lm_head, "weight"):
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)


def push_weights(llm: Any, model: Any) -> None:
    """The trained model's parameters into the engine (Hugging Face names; vLLM fuses and copies them),
    then its prefix cache emptied: cached prompt blocks hold keys and values of the old weights."""
    weights = [(name, p.detach()) for name, p in model.named_parameters()]
    llm.collective_rpc(_apply_weights, args=(weights,))
    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM did not reset its prefix cache after the weight update")


def run_plain_vllm(
    cfg: dict[str, Any], *, env_name: str = "quickstart_add", seed: int = 0
) -> tuple[Any, Any, Any]:
    """The loop; returns the run (``plain_grpo.PlainRun``), its ``plain_grpo.Loop`` and the engine."""
    run = plain_grpo.PlainRun(started=time.time())
    loop = plain_grpo.load_loop(cfg, env_name=env_name, seed=seed)
    llm = make_llm(cfg, seed)
    for step in range(cfg["steps"]):
        batch, prompts = loop.prompts(step, cfg["batch"])
        out, prompt_mask, mask = generate(llm, loop.tok, prompts, cfg)
        plain_grpo.learn(loop, batch, out, (prompt_mask, mask), cfg, run)
        push_weights(llm, loop.model)
        run.step_ends.append(time.time())
    return run, loop, llm


def _hf_logprobs(model: Any, ids: list[int], completion: list[int]) -> Any:
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids + completion])).logits[0, len(ids) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def check_reload(llm: Any, loop: Any, cfg: dict[str, Any], tokens: int = 8) -> dict[str, float]:
    """Scale every trained parameter by ``1 + 0.1 * noise`` (seeded), push the weights as a step does,
    and compare the log-probabilities of vLLM's greedy completion of the first prompt with those the
    perturbed Hugging Face model (``new``) and the initial weights (``old``) compute: ``ok`` when
    ``new`` is float32 noise and ``old`` is not (a training step of a few tokens moves the weights too
    little to tell the two apart, and none at all when every group scored the same)."""
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams, TokensPrompt

    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in loop.model.parameters():
            p.mul_(1 + 0.1 * torch.randn(p.shape, generator=gen))
    push_weights(llm, loop.model)
    _, prompts = loop.prompts(0, 1)
    ids = loop.tok(prompts[0], add_special_tokens=False)["input_ids"]
    greedy = SamplingParams(temperature=0.0, max_tokens=tokens, logprobs=0, detokenize=False)
    answer = llm.generate([TokensPrompt(prompt_token_ids=ids)], greedy, use_tqdm=False)[0].outputs[0]
    completion = list(answer.token_ids)
    served = torch.tensor([lp[t].logprob for lp, t in zip(answer.logprobs, completion, strict=True)])
    initial = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
    new = float((served - _hf_logprobs(loop.model, ids, completion)).abs().max())
    old = float((served - _hf_logprobs(initial, ids, completion)).abs().max())
    return {"new": new, "old": old, "ok": float(new < 1e-3 < old)}


def main() -> None:
    parser = plain_grpo.arg_parser((__doc__ or "").partition("\n")[0])
    parser.add_argument(
        "--check-reload", action="store_true", help="check that vLLM serves the trained weights"
    )
    args = parser.parse_args()
    cfg = plain_grpo.config(args)
    run, loop, llm = run_plain_vllm(cfg, seed=args.seed)
    if not args.check_reload:
        plain_grpo.report(run, as_json=args.json)
        return
    check = check_reload(llm, loop, cfg)
    if args.json:
        print(json.dumps({**dataclasses.asdict(run), "reload_check": check}), flush=True)
    else:
        plain_grpo.report(run, as_json=False)
        print(f"reload check: max |logprob diff| trained {check['new']:.2e}, initial {check['old']:.2e}")
    if not check["ok"]:
        raise SystemExit(f"vLLM does not serve the trained weights: {check}")


if __name__ == "__main__":
    main()
