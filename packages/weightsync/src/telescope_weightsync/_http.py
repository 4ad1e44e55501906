"""Calls into the receiver's methods through vLLM's ``POST /collective_rpc`` (dev mode).

vLLM forwards only string arguments, so each call carries one JSON string; it answers with one
result per worker (tensor-parallel rank). This is the one place where transport failures, HTTP
status codes and response bodies become the typed errors of ``_errors``.
"""

from __future__ import annotations

import json
from typing import Any, cast

import httpx

from telescope_weightsync._errors import ReceiverMissing, ServerError, ServerTimeout

__all__ = [
    "collective_rpc",
    "load_adapter",
    "load_folder",
    "probe_version",
    "served_models",
    "server_version",
]


def collective_rpc(
    client: httpx.Client, url: str, method: str, payload: dict[str, Any] | None = None, *, timeout_s: float
) -> list[Any]:
    """Run ``method`` on every worker of the server at ``url``: one JSON result per worker.

    Raises ``ServerTimeout`` when the server does not answer in time, ``ReceiverMissing`` when
    it has no ``/collective_rpc``, and ``ServerError`` for any other failure; each names ``url``.
    """
    body: dict[str, Any] = {"method": method, "timeout": timeout_s}
    if payload is not None:
        body["args"] = [json.dumps(payload)]
    try:
        response = client.post(f"{url}/collective_rpc", json=body, timeout=timeout_s + 10.0)
    except httpx.TimeoutException as exc:
        raise ServerTimeout(url, f"server {url} did not answer {method} within {timeout_s:.0f}s") from exc
    except httpx.HTTPError as exc:
        raise ServerError(url, f"server {url} failed during {method}: {type(exc).__name__}: {exc}") from exc
    return _results(response, url, method)


def served_models(client: httpx.Client, url: str, *, timeout_s: float) -> list[str]:
    """The names the server at ``url`` serves (``GET /v1/models``: the model, then its LoRA adapters)."""
    try:
        response = client.get(f"{url}/v1/models", timeout=timeout_s)
        response.raise_for_status()
        return [str(m["id"]) for m in response.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise ServerError(url, f"server {url} did not list its models: {type(exc).__name__}: {exc}") from exc


def load_adapter(
    client: httpx.Client, url: str, name: str, path: str, *, timeout_s: float, replace: bool = False
) -> None:
    """Register the LoRA adapter in the folder ``path`` (on the server's node) as ``name``, through
    vLLM's public ``POST /v1/load_lora_adapter`` (``replace``: unload ``name`` first, never its
    ``load_inplace``, which vLLM 0.32 would keep and re-read from disk at every step); raises a
    ``ServerError`` naming ``url`` and the fix."""
    body = {"lora_name": name, "lora_path": path}
    try:
        if replace:
            client.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=timeout_s + 10.0)
        response = client.post(f"{url}/v1/load_lora_adapter", json=body, timeout=timeout_s + 10.0)
    except httpx.TimeoutException as exc:
        raise ServerTimeout(
            url, f"server {url} did not load LoRA adapter {name} within {timeout_s:.0f}s"
        ) from exc
    except httpx.HTTPError as exc:
        raise ServerError(url, f"server {url} failed to load LoRA adapter {name}: {exc}") from exc
    if response.status_code == 404 and "lora" not in response.text.lower():
        raise ServerError(
            url,
            f"server {url} has no /v1/load_lora_adapter: start vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 "
            "and --enable-lora",
        )
    if response.status_code != 200:
        raise ServerError(
            url,
            f"server {url} refused LoRA adapter {name} from {path}: HTTP {response.status_code}: "
            f"{response.text[:500]}",
        )


def load_folder(url: str, folder: str, *, version: int, timeout_s: float = 600.0) -> float:
    """Serve the Hugging Face folder ``folder`` (a path on the server's node, of the architecture
    the server was started with) at ``url`` as weight version ``version``, in place of its weights,
    then drop its prefix cache (blocks computed with the old weights); returns the seconds the load
    took. Call it with no request in flight. Raises the errors of :func:`collective_rpc` (a folder
    the server cannot load: ``ServerError`` with the server's reason)."""
    base = url.rstrip("/")
    payload = {"path": folder, "version": version}
    with httpx.Client() as client:
        results = collective_rpc(client, base, "telescope_load", payload, timeout_s=timeout_s)
        try:
            reset = client.post(f"{base}/reset_prefix_cache", timeout=timeout_s)
            done = reset.status_code == 200 and reset.json().get("success") is True
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise ServerError(base, f"server {base} did not drop its prefix cache: {exc}") from exc
    if not done:
        raise ServerError(
            base,
            f"server {base} did not drop its prefix cache after the load (requests in flight?): "
            f"HTTP {reset.status_code}: {reset.text[:200]}",
        )
    return max(float(r["seconds"]) for r in results)


def server_version(url: str, *, timeout_s: float = 10.0) -> int:
    """The weight version the server at ``url`` serves (the lowest over its tensor-parallel workers;
    -1: the base model), asked through its engine: a server whose engine is stuck does not answer in
    time (``ServerTimeout``), unlike its ``/health``. Raises the errors of :func:`collective_rpc`."""
    with httpx.Client() as client:
        results = collective_rpc(client, url.rstrip("/"), "telescope_version", None, timeout_s=timeout_s)
    return min(int(v) for v in results)


async def probe_version(client: httpx.AsyncClient, url: str, *, timeout_s: float = 10.0) -> int:
    """:func:`server_version` for an event loop, on the caller's ``client`` (cancelling it
    cancels the request: nothing is left waiting in a thread)."""
    body = {"method": "telescope_version", "timeout": timeout_s}
    base = url.rstrip("/")
    try:
        response = await client.post(f"{base}/collective_rpc", json=body, timeout=timeout_s + 5.0)
    except httpx.TimeoutException as exc:
        raise ServerTimeout(
            base, f"server {base} did not answer telescope_version within {timeout_s:.0f}s"
        ) from exc
    except httpx.HTTPError as exc:
        raise ServerError(
            base, f"server {base} failed during telescope_version: {type(exc).__name__}: {exc}"
        ) from exc
    return min(int(v) for v in _results(response, base, "telescope_version"))


def _results(response: httpx.Response, url: str, method: str) -> list[Any]:
    """The per-worker results of a ``/collective_rpc`` answer, or the error its status means."""
    if response.status_code == 404:
        raise ReceiverMissing(
            url,
            f"server {url} has no /collective_rpc: start vLLM with VLLM_SERVER_DEV_MODE=1 and "
            "--worker-extension-cls telescope_weightsync.vllm_worker.WeightReceiver",
        )
    if response.status_code != 200:
        raise ServerError(
            url, f"server {url} answered {method} with HTTP {response.status_code}: {response.text[:500]}"
        )
    try:
        answer: object = response.json()
    except ValueError as exc:
        raise ServerError(
            url, f"server {url} answered {method} with non-JSON: {response.text[:200]}"
        ) from exc
    results: object = cast(dict[str, Any], answer).get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list) or not results:
        raise ServerError(url, f"server {url} returned no worker results for {method}: {response.text[:200]}")
    return cast(list[Any], results)
