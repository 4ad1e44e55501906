"""A synthetic run directory in the record format, for the inspector's tests and its benchmark.

:func:`synthetic_run` writes what ``telescope train`` writes (docs/records.md: ``config.yaml``
with user keys marked, ``metrics.jsonl``, ``records/manifest.json`` and every table) with made-up
but consistent numbers: each step lasts ``step_s`` seconds; each sample is dispatched, generates
``turns`` turns on a server lane (a tool call between turns), is rewarded and kept or discarded;
each trainer rank has a step span holding micro-batch spans. Columns are built per step and
written with the tables' own Arrow schemas, so a run of a million samples takes a minute, not an
hour. The real run in the browser tests checks the same pages against ``telescope train``'s record.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.parquet

from telescope_records import TABLES, RecordWriter

__all__ = ["chromium_path", "serve_in_thread", "synthetic_run"]

_pa: Any = pyarrow
_pq: Any = pyarrow.parquet
"""pyarrow ships no type information: it is reached through these names (only in :func:`_write`)."""

CONFIG = """\
# Resolved Telescope config. Layers, lowest first: defaults, run.yaml.
# Keys marked '# set by you' come from your run YAML or the command line.
model: tiny-model  # set by you
algorithm: grpo
learning_rate: 3.0e-05  # set by you
number_of_steps: {steps}  # set by you
environments:  # set by you
- name: countdown
- name: wordle
"""


def _write(folder: Path, table: str, name: str, columns: dict[str, list[Any]]) -> None:
    schema = TABLES[table].schema()
    n = len(next(iter(columns.values())))
    arrays = [_pa.array(columns.get(f.name, [None] * n), type=f.type) for f in schema]
    out = folder / table
    out.mkdir(parents=True, exist_ok=True)
    _pq.write_table(_pa.Table.from_arrays(arrays, schema=schema), out / name, compression="zstd")


def _cols(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    keys = dict.fromkeys(k for r in rows for k in r)
    return {k: [r.get(k) for r in rows] for k in keys}


def _sample_row(
    step: int, i: int, sid: int, group: int, text: str, args: dict[str, Any], rng: random.Random
) -> dict[str, Any]:
    status = "kept" if (i // args["group_size"]) % 4 else "discarded"
    # a kept group's first sample is wrong (a whole-number 0.0, as in real runs), the rest are partial
    reward = round(rng.random(), 3) if status == "kept" and i % args["group_size"] else 0.0
    return {
        "attempt": 0,
        "step": step,
        "status": status,
        "reason": None if status == "kept" else "zero_advantage",
        "env": "countdown" if i % 2 else "wordle",
        "group_id": group,
        "sample_id": sid,
        "sample_index": group,
        "prompt": f"<|user|>Solve problem {group} of step {step}.",
        "system_prompt": "You are careful.",
        "prompt_tokens": 12,
        "completion": text,
        "completion_tokens": 20,
        "num_turns": args["turns"],
        "stop_reason": "stop",
        "truncated": False,
        "model_tokens": 18,
        "reward": reward,
        "advantage": reward - 0.5,
        "metrics": {"correct": reward},
        "golden_answers": {"correct": str(i % 97)},
        "tags": {"difficulty": "easy" if i % 3 else "hard"},
        "info": "[]",
        "version_start": step - 1,
        "version_end": step - 1,
        "off_policy_steps": 0,
        "lane": (i // args["servers"]) % args["lanes"],
        "server": f"http://127.0.0.1:{8000 + i % args['servers']}",
        "queue_s": 0.01,
        "generation_s": 1.0,
        "reward_s": 0.001,
        "trainer_input": f"ids of {text}" if status == "kept" else None,
    }


def _tool_round(common: dict[str, Any], k: int, at: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tool call after model turn ``k`` (started at ``at``) and the environment turn with its result."""
    call = {
        **common,
        "turn_index": k,
        "call_index": k,
        "name": "echo",
        "arguments": '{"x": 1}',
        "raw_text": "<tool>echo</tool>",
        "result": f"echo {k}",
        "success": True,
        "started_at": at + 0.8,
        "duration_s": 0.05,
    }
    result = {
        **common,
        "turn_index": 2 * k + 1,
        "role": "env",
        "turn_type": "tool_result",
        "text": f"echo {k}",
        "tokens": 3,
        "started_at": at + 0.8,
        "ended_at": at + 0.85,
    }
    return call, result


def _episode(row: dict[str, Any], start: float, turns: int) -> tuple[list[dict[str, Any]], ...]:
    """The turns, tool calls and lifecycle events of one sample (a tool call between model turns)."""
    common = {"attempt": 0, "step": row["step"], "source": "train", "sample_id": row["sample_id"]}
    lane, server, text = row["lane"], row["server"], row["completion"]

    def event(kind: str, a: float, b: float, **more: Any) -> dict[str, Any]:
        base = {"group_id": row["group_id"], "lane": lane, "turn_index": -1}
        return {**common, **base, "event": kind, "started_at": a, "ended_at": b, **more}

    out_turns: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    events = [event("dispatched", start, start)]
    at = start
    for k in range(turns):
        out_turns.append(
            {
                **common,
                "turn_index": 2 * k,
                "role": "model",
                "turn_type": "generation",
                "text": text if k == 0 else f"turn {k}",
                "tokens": 9,
                "server": server,
                "started_at": at,
                "ended_at": at + 0.8,
                "stop_reason": "stop",
            }
        )
        events.append(event("generation", at, at + 0.8, server=server, turn_index=k))
        if k + 1 < turns:
            call, result = _tool_round(common, k, at)
            tools.append(call)
            out_turns.append(result)
            events.append(event("tool_execution", at + 0.8, at + 0.85, turn_index=k, detail="echo"))
        at += 0.9
    events.append(event("reward", at, at + 0.001))
    events.append(event(row["status"], at + 0.002, at + 0.002, detail=row["reason"]))
    row.update(dispatched_at=start, finished_at=at + 0.002)
    return out_turns, tools, events


def _agent_episode(
    row: dict[str, Any], turns: list[dict[str, Any]], calls: list[dict[str, Any]], text: str
) -> None:
    """Make the sample an agent's that rewrote its history before its last call (a second training
    sequence from there) and whose tool calls carry ``text`` as arguments and result."""
    row.update(sequences=2, split_reasons="history_rewritten@2")
    last = max(t["turn_index"] for t in turns)
    for t in turns:
        t["segment"] = int(t["turn_index"] == last)
    for i, c in enumerate(calls):
        c.update(arguments=json.dumps({"x": text}), result=text, call_id=f"call_{i}_0")


def _samples(
    step: int, t0: float, args: dict[str, Any], rng: random.Random
) -> tuple[list[dict[str, Any]], ...]:
    """One step's samples, turns, tool calls and rollout events."""
    samples: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    n, size = args["samples"], args["group_size"]
    for i in range(n):
        special = step == 1 and i == 0 and args["completion"]
        text = args["completion"] if special else f"step {step} sample {i}: the answer is {i % 97}"
        row = _sample_row(step, i, step * n + i, step * (n // size) + i // size, text, args, rng)
        more = _episode(row, t0 + rng.random() * args["step_s"] * 0.2, args["turns"])
        if special:
            _agent_episode(row, more[0], more[1], text)
        samples.append(row)
        turns += more[0]
        tools += more[1]
        events += more[2]
    return samples, turns, tools, events


def _spans(step: int, t0: float, args: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    a = t0 + args["step_s"] * 0.5
    for rank in range(args["ranks"]):
        rows.append(
            {
                "attempt": 0,
                "step": step,
                "rank": rank,
                "node": "node0",
                "name": "train_step",
                "parent": "",
                "depth": 0,
                "started_at": a,
                "ended_at": a + 3.0,
                "microbatch": -1,
                "minibatch": -1,
            }
        )
        for mb in range(args["microbatches"]):
            s = a + 0.1 + mb * 2.8 / args["microbatches"]
            for j, part in enumerate(("forward", "loss", "backward")):
                rows.append(
                    {
                        "attempt": 0,
                        "step": step,
                        "rank": rank,
                        "node": "node0",
                        "name": f"train_step/minibatch/microbatch/{part}",
                        "parent": "train_step",
                        "depth": 1,
                        "started_at": s + j * 0.3,
                        "ended_at": s + j * 0.3 + 0.25,
                        "microbatch": mb,
                        "minibatch": 0,
                    }
                )
    return rows


def _metrics(step: int, t0: float, samples: list[dict[str, Any]], args: dict[str, Any]) -> dict[str, Any]:
    kept = [s["reward"] for s in samples if s["status"] == "kept"]
    mean = sum(kept) / len(kept)
    std = (sum((r - mean) ** 2 for r in kept) / len(kept)) ** 0.5
    groups = args["samples"] // args["group_size"]
    return {
        "step": step,
        "time": t0 + args["step_s"],
        "loss": 1.0 / step,
        "grad_norm": 0.5,
        "learning_rate": 3e-5,
        "reward/mean": mean,
        "reward/countdown/mean": mean,
        "reward/wordle/mean": mean / 2,
        "groups/kept": groups - groups // 4,
        "groups/discarded": groups // 4,
        "groups/cancelled": 0,
        "derived/reward_mean": mean,
        "derived/reward_std": std,
        "derived/reward_min": min(kept),
        "derived/reward_max": max(kept),
        "derived/discarded/zero_advantage_count": groups // 4,
        "derived/discarded/max_async_count": 0,
        "derived/cancelled_count": 0,
        "timing/step_s": args["step_s"],
        "kl_divergence_inference": 1e-6,
    }


def _evals(folder: Path, step: int, args: dict[str, Any]) -> dict[str, Any]:
    rows = [
        {
            "attempt": 0,
            "step": step,
            "eval": "digits",
            "env": "countdown",
            "sample_index": i,
            "completion_idx": c,
            "sample_id": 10_000_000 + step * 100 + i * 2 + c,
            "prompt": f"eval prompt {i}",
            "completion": f"eval answer {i}.{c}",
            "metrics": {"correct": float((i + c) % 2)},
            "num_turns": 1,
        }
        for i in range(args["eval_items"])
        for c in range(2)
    ]
    _write(folder, "eval_samples", f"step_{step:06d}-digits.parquet", _cols(rows))
    return {"step": step, "eval/step": step, "eval/digits/correct": 0.5, "eval/digits/pass@2/correct": 1.0}


def _tokens(samples: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """The token table of the kept samples: each word of the completion a token; the trainer's logprob
    near the sampler's, a few far off (the mismatch the inspector shows), one token clipped."""
    rows: list[dict[str, Any]] = []
    for row in samples:
        if row["status"] != "kept":
            continue
        words = [w + " " for w in str(row["completion"]).split(" ")]
        sampler = [-rng.random() * 3 for _ in words]
        trainer = [x + (rng.gauss(0, 0.02) if k % 5 else rng.gauss(0, 1.0)) for k, x in enumerate(sampler)]
        v = row["version_start"]
        rows.append(
            {
                "attempt": 0,
                "step": row["step"],
                "env": row["env"],
                "group_id": row["group_id"],
                "sample_id": row["sample_id"],
                "sequence": 0,
                "token_ids": list(range(len(words))),
                "token_text": words,
                "sampler_logprob": sampler,
                "trainer_logprob": trainer,
                "teacher_logprob": None,
                "ref_logprob": None,
                "advantage": [row["advantage"]] * len(words),
                "loss_mask": [1.0] * len(words),
                "is_weight": [1.0] * len(words),
                "clipped": [1.0 if k == 1 else 0.0 for k in range(len(words))],
                "version_start": [v] * len(words),
                "version_end": [v] * len(words),
            }
        )
    return rows


def _step(folder: Path, step: int, t0: float, args: dict[str, Any]) -> dict[str, Any]:
    """Write one step's files; returns its metrics line (a random stream of its own per step)."""
    rows = _samples(step, t0, args, random.Random(args["seed"] * 1_000_003 + step))
    name = f"step_{step:06d}.parquet"
    for table, part in zip(("samples", "turns", "tool_calls", "rollout_events"), rows, strict=True):
        if part:
            _write(folder, table, name, _cols(part))
    tokens = _tokens(rows[0], random.Random(args["seed"] * 7 + step))
    if tokens:
        _write(folder, "tokens", name, _cols(tokens))
    _write(folder, "trainer_spans", name, _cols(_spans(step, t0, args)))
    orch = [
        {
            "attempt": 0,
            "step": step,
            "time": t0 + args["step_s"] * f,
            "event": e,
            "duration_s": d,
            "detail": "{}",
        }
        for f, e, d in ((0.5, "train_step", 3.0), (0.9, "weights_published", 0.2))
    ]
    _write(folder, "orchestrator_events", name, _cols(orch))
    return _metrics(step, t0, rows[0], args)


def synthetic_run(
    path: str | Path,
    *,
    steps: int = 4,
    samples: int = 16,
    group_size: int = 4,
    turns: int = 2,
    servers: int = 2,
    lanes: int = 4,
    ranks: int = 2,
    microbatches: int = 2,
    step_s: float = 10.0,
    completion: str = "",
    finished: bool = True,
    eval_items: int = 3,
    infra_points: int = 50,
    seed: int = 0,
    started: float | None = None,
    step_range: tuple[int, int] | None = None,
) -> Path:
    """Write a synthetic run at ``path`` (see the module docstring) and return it.

    ``started``: the run's first second (default: long enough ago for its steps to be over).
    ``step_range=(a, b)`` writes only steps a..b (their metrics lines into a part file), so that
    processes can write a long run together; ``(0, 0)`` then writes the rest and joins the parts.
    """
    args = dict(locals())
    run, folder = Path(path), Path(path) / "records"
    run.mkdir(parents=True, exist_ok=True)
    start = started if started is not None else time.time() - steps * step_s - 60
    first, last = step_range or (1, steps)
    lines = [_step(folder, s, start + (s - 1) * step_s, args) for s in range(max(first, 1), last + 1)]
    if step_range not in (None, (0, 0)):
        (run / f".metrics-{first:06d}.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
        return run
    for part in sorted(run.glob(".metrics-*.jsonl")):
        lines += [json.loads(line) for line in part.read_text().splitlines()]
        part.unlink()
    lines.sort(key=lambda m: m["step"])
    if eval_items:
        lines.append(_evals(folder, steps, args))
    _run_files(run, args, start)
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines), encoding="utf-8")
    return run


def _run_files(run: Path, args: dict[str, Any], start: float) -> None:
    """What a run writes besides its steps: config, log, manifest, attempt tables, infra, its end."""
    steps, folder = args["steps"], run / "records"
    (run / "config.yaml").write_text(CONFIG.format(steps=steps), encoding="utf-8")
    (run / "logs").mkdir(exist_ok=True)
    levels = ("warning", "info")
    log = [{"event": f"step {s}", "level": levels[s % 2], "timestamp": f"t{s}"} for s in range(1, steps + 1)]
    (run / "logs" / "telescope.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in log), encoding="utf-8"
    )
    RecordWriter(run).close()  # the manifest, as a run's start writes it
    _attempt_tables(folder, args)
    _infra(folder, start, steps * args["step_s"], args["infra_points"])
    if args["finished"]:
        end = {"attempt": 0, "step": steps, "time": start + steps * args["step_s"], "event": "stop"}
        stop = [{**end, "detail": json.dumps({"reason": "finished"})}]
        _write(folder, "orchestrator_events", f"step_{steps:06d}-end-a000-1.parquet", _cols(stop))


def _attempt_tables(folder: Path, args: dict[str, Any]) -> None:
    ranges = json.dumps({"correct": {"min": 0.0, "max": 1.0, "invert": False}})
    envs = [
        {
            "attempt": 0,
            "role": "train",
            "name": n,
            "class_name": f"{n.title()}Env",
            "multi_turn": n == "wordle",
            "dataset_size": 100,
            "max_turns": args["turns"],
            "reward_min": 0.0,
            "reward_max": 1.0,
            "metrics_ranges": ranges,
            "tags_options": json.dumps({"difficulty": ["easy", "hard"]}),
        }
        for n in ("countdown", "wordle")
    ]
    _write(folder, "environments", "attempt_000.parquet", _cols(envs))
    setup = [
        {
            "attempt": 0,
            "role": "driver",
            "node": "node0",
            "node_id": "",
            "cpu_model": "Test CPU",
            "cpu_cores": 2,
            "cpu_physical_cores": 1,
            "memory_gb": 24.0,
            "gpus": "[]",
            "python": "3.11",
            "platform": "linux",
            "versions": {"torch": "2.13"},
            "git_commit": "abc1234",
        }
    ]
    _write(folder, "setup", "attempt_000.parquet", _cols(setup))
    model = [
        {
            "attempt": 0,
            "model": "tiny-model",
            "parameters": 1234,
            "trainable_parameters": 1234,
            "dtype": "float32",
            "num_layers": 2,
            "layer_types": '{"LlamaDecoderLayer": 2}',
            "architecture": "LlamaForCausalLM(\n  (model): ...\n)",
        }
    ]
    _write(folder, "model", "attempt_000.parquet", _cols(model))


def _infra(folder: Path, start: float, span: float, points: int) -> None:
    rows: list[dict[str, Any]] = []
    for i in range(points):
        t = start + span * i / max(points - 1, 1)
        rows.append(
            {
                "time": t,
                "attempt": 0,
                "node": "node0",
                "node_id": "",
                "source": "system",
                "target": "",
                "metric": "cpu_utilization_percent",
                "value": 50.0 + 40 * ((i % 10) / 10),
            }
        )
        rows.append(
            {
                "time": t,
                "attempt": 0,
                "node": "node0",
                "node_id": "",
                "source": "vllm",
                "target": "http://127.0.0.1:8000",
                "metric": "num_requests_running",
                "value": float(i % 8),
            }
        )
    if rows:
        _write(folder, "infra", "a000-node0-1-000001.parquet", _cols(rows))


@contextmanager
def serve_in_thread(roots: Sequence[str | Path], *, token: str | None = None) -> Generator[str, None, None]:
    """The inspector on a free port of 127.0.0.1 in a thread of this process; yields its URL."""
    import uvicorn

    from telescope_ui._app import create_app
    from telescope_ui._serve import bind

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(
        uvicorn.Config(create_app(roots, token=token), log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def chromium_path() -> str:
    """Debian's chromium, which the browser tests drive through Playwright (it downloads no browser
    here); missing, it is an error that says what to install."""
    import shutil

    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(
        "the inspector's browser tests need Debian's chromium: apt-get install -y chromium "
        "(the README's set-up command installs it)"
    )
