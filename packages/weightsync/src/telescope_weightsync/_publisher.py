"""The trainer side: join the inference servers into broadcast groups and publish updates.

One ``WeightPublisher`` lives on the trainer's broadcast rank. ``connect`` asks every server
for its tensor-parallel size, opens a ``TCPStore`` and forms each group (rank 0 = trainer,
server ``i``'s TP worker ``j`` = ``1 + sum(tp of servers before i) + j``). ``publish`` triggers
``telescope_receive`` on every server of a group over HTTP, streams the buckets, and returns
once every server reports the new version, or raises a ``WeightSyncError`` naming the server
(docs/weightsync.md describes the whole protocol).

After each successful ``publish`` the publisher keeps its timeline, in unix seconds:
``last_update``, one :class:`ServerUpdate` per server of the group (when its request went out, when
its answer came back, and the slowest TP worker's apply and wait times), and ``publish_spans``, the
sender's own phases as :class:`PublishSpan` (``publish`` and inside it ``publish/trigger``,
``publish/stream``, ``publish/wait``).
"""

from __future__ import annotations

import concurrent.futures as cf
import ipaddress
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import structlog
import torch

from telescope_weightsync._adapter import ADAPTER_NAME
from telescope_weightsync._errors import GroupError, ServerError, UpdateError, WeightSyncError
from telescope_weightsync._http import collective_rpc, load_adapter, served_models
from telescope_weightsync._protocol import Layout, plan_buckets
from telescope_weightsync._settings import PublisherSettings
from telescope_weightsync._stream import Scratch, StreamStats, send_update
from telescope_weightsync._transport import Group, make_group, open_store, resolve_backend

__all__ = ["DEFAULT_GROUP", "PublishSpan", "ServerUpdate", "WeightPublisher"]

log = structlog.get_logger()

DEFAULT_GROUP = "full"
_BLAME_WAIT_S = 15.0
"""After the sender failed, how long to wait for a server's own error, which usually names the cause."""

Results = list[Any]
"""One JSON result per tensor-parallel worker of a server."""
Calls = dict[cf.Future[Results], str]
"""Calls in flight, each with the URL of the server it went to."""


@dataclass(frozen=True)
class ServerUpdate:
    """One server's part of an update, as the publisher saw it (wall clock: unix seconds)."""

    server: str
    """The server's URL."""
    group: str
    version: int
    start: float
    """When the ``telescope_receive`` request was sent."""
    end: float
    """When that server's answer arrived (every TP worker applied the update)."""
    apply_s: float
    """The slowest TP worker's apply time (its ``seconds``)."""
    wait_s: float
    """The longest a TP worker waited before applying (its ``wait_s``)."""


@dataclass(frozen=True)
class PublishSpan:
    """One phase of the sender's side of an update (wall clock: unix seconds).

    ``publish`` (the whole call) holds ``publish/trigger`` (the requests sent to every server),
    ``publish/stream`` (the buckets broadcast; the weight iterator runs inside it, between broadcasts)
    and ``publish/wait`` (the stream is done; waiting for the servers' answers).
    """

    name: str
    start: float
    end: float


def _server_updates(
    results: dict[str, Results],
    sent: Mapping[str, float],
    answered: Mapping[str, float],
    group: str,
    version: int,
) -> list[ServerUpdate]:
    """The :class:`ServerUpdate` of every server that answered, in ``results`` order."""
    return [
        ServerUpdate(
            server=url,
            group=group,
            version=version,
            start=sent[url],
            end=answered[url],
            apply_s=max((float(r.get("seconds", 0.0)) for r in res), default=0.0),
            wait_s=max((float(r.get("wait_s", 0.0)) for r in res), default=0.0),
        )
        for url, res in results.items()
    ]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _first_error(calls: Mapping[cf.Future[Any], str], timeout_s: float) -> tuple[str, BaseException] | None:
    """Wait up to ``timeout_s`` for the first failed call; return (url, error) or None."""
    done, _ = cf.wait(calls, timeout=timeout_s, return_when=cf.FIRST_EXCEPTION)
    for future in done:
        error = future.exception()
        if error is not None:
            return calls[future], error
    return None


def _check_versions(results: dict[str, Results], version: int) -> None:
    """Raise ``ServerError`` unless every worker of every server reports ``version``."""
    wrong = {
        url: [r.get("version") for r in res]
        for url, res in results.items()
        if any(r.get("version") != version for r in res)
    }
    if wrong:
        url = next(iter(wrong))
        raise ServerError(url, f"servers report versions {wrong} after publishing version {version}")


def _publish_spans(began: float, triggered: float, streamed: float, done: float) -> list[PublishSpan]:
    """The sender's phases from its clock marks: start, requests sent, stream done, answers in."""
    return [
        PublishSpan("publish/trigger", began, triggered),
        PublishSpan("publish/stream", triggered, streamed),
        PublishSpan("publish/wait", streamed, done),
        PublishSpan("publish", began, done),
    ]


def _receive_payload(
    group: str, version: int, adapter_config: Mapping[str, Any] | None, adapter_name: str
) -> dict[str, Any]:
    """The argument of ``telescope_receive``: the group and version, and a LoRA adapter's name and config."""
    payload: dict[str, Any] = {"group": group, "version": int(version)}
    if adapter_config is not None:
        payload["adapter"] = {"name": adapter_name, "config": dict(adapter_config)}
    return payload


def _for_server(payload: dict[str, Any], url: str) -> dict[str, Any]:
    """``payload`` for the server at ``url``: an adapter goes into that server's own folder, named
    after its address (one folder per server, the same on every node, reused by a restart)."""
    if "adapter" not in payload:
        return payload
    folder = "telescope-adapter-" + re.sub(r"[^A-Za-z0-9]+", "-", urlsplit(url).netloc).strip("-")
    return {**payload, "adapter": {**payload["adapter"], "folder": folder}}


def _update_metrics(stats: StreamStats, results: dict[str, Results], seconds: float) -> dict[str, float]:
    """What ``publish`` returns: the sender's counts and the slowest server's apply times."""
    workers = [r for res in results.values() for r in res]
    return {
        "bytes": float(stats.bytes),
        "seconds": seconds,
        "gb_per_s": stats.bytes / seconds / 1e9 if seconds > 0 else 0.0,
        "send_seconds": stats.seconds,
        "apply_seconds_max": max(float(r.get("seconds", 0.0)) for r in workers),
        "apply_wait_seconds_max": max(float(r.get("wait_s", 0.0)) for r in workers),
        "buckets": float(stats.buckets),
        "tensors": float(stats.tensors),
        "layouts_sent": float(stats.layouts_sent),
    }


class WeightPublisher:
    """Publishes trainer weights to running vLLM servers (see the module docstring)."""

    def __init__(
        self,
        server_urls: Sequence[str],
        settings: PublisherSettings | None = None,
        *,
        host: str = "127.0.0.1",
    ) -> None:
        urls = [u.rstrip("/") for u in server_urls]
        if not urls:
            raise ValueError("WeightPublisher needs at least one server URL")
        if len(set(urls)) != len(urls):
            raise ValueError(f"duplicate server URLs: {urls}")
        self.server_urls = urls
        self.settings = settings or PublisherSettings()
        self.host = host
        self.backend = resolve_backend(self.settings.backend)
        self.tp_sizes: dict[str, int] = {}
        self._groups: dict[str, Group] = {}
        self._members: dict[str, list[str]] = {}
        self._ranks: dict[str, dict[str, list[int]]] = {}
        self._layouts: dict[str, list[Layout]] = {}
        self._scratch: dict[str, Scratch] = {}
        self._store: Any = None  # the TCPStore the groups rendezvous on (rank 0 hosts it)
        self._formed = 0  # groups formed so far: each forming's store keys are its own
        self._client: httpx.Client | None = httpx.Client()
        self._pool: cf.ThreadPoolExecutor | None = cf.ThreadPoolExecutor(
            max_workers=max(4, 2 * len(urls)), thread_name_prefix="weightsync"
        )
        self.last_update: list[ServerUpdate] = []
        """Each server's part of the last successful ``publish`` (empty before one, and after a failure)."""
        self.publish_spans: list[PublishSpan] = []
        """The sender's phases of the last successful ``publish`` (empty before one, and after a failure)."""

    # ----------------------------------------------------------------------------- connect
    def connect(self, groups: dict[str, list[str]] | None = None) -> None:
        """Form the broadcast groups (default: one group ``full`` of every server).

        Call it again to form them anew, e.g. with a dead server left out or a restarted one back:
        a group of the same name is replaced; only the servers named in ``groups`` are asked.
        """
        groups = groups or {DEFAULT_GROUP: list(self.server_urls)}
        for name, members in groups.items():
            unknown = [u for u in members if u.rstrip("/") not in self.server_urls]
            if unknown or not members:
                raise ValueError(f"group {name!r} must list some of {self.server_urls}; unknown: {unknown}")
        timeout = self.settings.init_timeout_s
        wanted = {m.rstrip("/") for members in groups.values() for m in members}
        named = [u for u in self.server_urls if u in wanted]
        infos = self._call_all(named, "telescope_info", None, timeout)
        for url, results in infos.items():
            if any(r.get("pp_size", 1) != 1 for r in results):
                raise ServerError(
                    url, f"server {url} uses pipeline parallelism, which weight sync does not support"
                )
            self.tp_sizes[url] = len(results)
        if self._store is None:
            self._store = open_store(self.host, 0, is_master=True, timeout_s=timeout, prefix="telescope/")
        port = int(self._store.underlying_store.port)
        iface = "127.0.0.1" if _is_loopback(self.host) else None
        for name, members in groups.items():
            self._connect_group(name, [u.rstrip("/") for u in members], port, iface)

    def _connect_group(self, name: str, members: list[str], port: int, iface: str | None) -> None:
        old = self._groups.pop(name, None)
        if old is not None:
            old.close()
        timeout = self.settings.init_timeout_s
        world = 1 + sum(self.tp_sizes[u] for u in members)
        # each forming of a group rendezvous under keys of its own: a group formed again (a server
        # restarted) must not read the addresses its earlier forming left in the store
        self._formed += 1
        prefix = f"telescope/{name}/{self._formed}/"
        offset = 1
        joins: Calls = {}
        for url in members:
            payload = {
                "group": name,
                "host": self.host,
                "port": port,
                "rank_offset": offset,
                "world_size": world,
                "backend": self.backend,
                "timeout_s": self.settings.timeout_s,
                "iface_host": iface,
                "prefix": prefix,
            }
            joins[self._submit(url, "telescope_join", payload, timeout)] = url
            offset += self.tp_sizes[url]
        store = open_store(self.host, port, is_master=False, timeout_s=timeout, prefix=prefix)
        own = self._executor().submit(
            make_group,
            store,
            rank=0,
            world_size=world,
            backend=self.backend,
            timeout_s=timeout,
            name=name,
            iface_host=iface,
        )
        failed = _first_error({**joins, own: "trainer"}, timeout)
        if failed is not None:
            url, exc = failed
            raise GroupError(f"group {name!r}: {url} failed to join: {exc}") from exc
        pending = [url for f, url in joins.items() if not f.done()] + ([] if own.done() else ["trainer"])
        if pending:
            raise GroupError(f"group {name!r}: {pending} did not join within {timeout:.0f}s")
        group = own.result()
        group.timeout_s = self.settings.timeout_s
        self._groups[name] = group
        self._members[name] = members
        self._ranks[name] = {url: [int(r["rank"]) for r in f.result()] for f, url in joins.items()}
        taken = sorted(r for ranks in self._ranks[name].values() for r in ranks)
        if taken != list(range(1, world)):
            self._drop_group(name)
            raise GroupError(
                f"group {name!r}: the servers' workers took ranks {taken}, expected 1..{world - 1} once each "
                "(does every server report its tensor-parallel rank correctly?)"
            )
        self._layouts[name] = []
        ranks = self._ranks[name]
        log.info("weightsync.connected", group=name, world_size=world, backend=self.backend, ranks=ranks)

    # ----------------------------------------------------------------------------- publish
    def publish(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        *,
        version: int,
        group: str = DEFAULT_GROUP,
        adapter_config: Mapping[str, Any] | None = None,
        adapter_name: str = ADAPTER_NAME,
    ) -> dict[str, float]:
        """Stream one update to every server of ``group``; return bytes, seconds and GB/s.

        With ``adapter_config`` (PEFT's ``adapter_config.json`` as a dict) the tensors are a LoRA
        adapter, which each server loads in place of the one it serves as ``adapter_name``, or
        registers when it serves none yet (docs/weightsync.md, "LoRA adapters").

        Raises ``ServerError`` naming the server that failed or answered a wrong version,
        ``UpdateError`` when the update failed with no server to blame, ``GroupError`` when
        ``group`` is not connected, and whatever the weight iterator raised. A failed update
        drops its group: call ``connect`` again before the next one. A successful one leaves its
        timeline in ``last_update`` and ``publish_spans``.
        """
        self.last_update, self.publish_spans = [], []
        handle = self._group(group)
        members = self._members[group]
        start, began = time.perf_counter(), time.time()
        payload = _receive_payload(group, version, adapter_config, adapter_name)
        sent: dict[str, float] = {}
        answered: dict[str, float] = {}
        calls: Calls = {
            self._executor().submit(self._timed_receive, url, _for_server(payload, url), sent, answered): url
            for url in members
        }
        buckets = plan_buckets(
            self._staged(named_tensors), mode=self.settings.mode, bucket_bytes=self.settings.bucket_bytes
        )
        triggered = time.time()
        try:
            scratch = self._scratch.setdefault(group, Scratch(handle.device))
            stats = send_update(handle, buckets, self._layouts[group], scratch)
            streamed = time.time()
            results = self._applied(calls, version)
            done = time.time()
        except BaseException as exc:
            self._drop_group(group)  # the stream's position is unknown: the group is unusable
            if isinstance(exc, WeightSyncError) and not isinstance(exc, ServerError):
                # The sender's side failed (a broadcast, or servers late): find a server to blame.
                raise self._blame(calls, exc, version, f"group {group!r} ({members})") from exc
            raise
        _check_versions(results, version)
        if adapter_config is not None:
            self._register_adapters(results, adapter_name)
        seconds = time.perf_counter() - start
        self.last_update = _server_updates(results, sent, answered, group, int(version))
        self.publish_spans = _publish_spans(began, triggered, streamed, done)
        metrics = _update_metrics(stats, results, seconds)
        rounded = {k: round(v, 4) for k, v in metrics.items()}
        log.info("weightsync.published", group=group, version=version, **rounded)
        return metrics

    def _register_adapters(self, results: dict[str, Results], name: str) -> None:
        """Where the API server does not serve ``name`` (a server just started), register the adapter
        each server just wrote; where it does but a worker held no adapter to load in place, register
        it again (unload, load). The folder's path is the same on every node of a server."""
        for url, res in results.items():
            served = name in served_models(self._http(), url, timeout_s=self.settings.timeout_s)
            if served and all(r.get("adapter_loaded") for r in res):
                continue
            path = str(res[0]["adapter_path"])
            load_adapter(self._http(), url, name, path, timeout_s=self.settings.timeout_s, replace=served)
            log.info("weightsync.adapter_registered", server=url, name=name, path=path, again=served)

    def _timed_receive(
        self, url: str, payload: dict[str, Any], sent: dict[str, float], answered: dict[str, float]
    ) -> Results:
        """``telescope_receive`` on ``url`` (in the pool), noting when it was sent and answered.

        The answer's time is taken here, before the future completes, rather than in a done-callback:
        ``concurrent.futures`` wakes the waiters before it runs the callbacks, so a callback's time
        could still be missing when ``publish`` reads it.
        """
        sent[url] = time.time()
        try:
            return self._rpc(url, "telescope_receive", payload, self.settings.timeout_s)
        finally:
            answered[url] = time.time()

    def _applied(self, calls: Calls, version: int) -> dict[str, Results]:
        """Each server's results once all of them applied ``version``; raise if one failed or is late."""
        timeout = self.settings.timeout_s
        failed = _first_error(calls, timeout)
        if failed is not None:
            url, exc = failed
            raise ServerError(url, f"server {url} failed to apply version {version}: {exc}") from exc
        late = [url for future, url in calls.items() if not future.done()]
        if late:
            raise UpdateError(f"servers {late} did not apply version {version} within {timeout:.0f}s")
        return {url: future.result() for future, url in calls.items()}

    def _blame(self, calls: Calls, exc: WeightSyncError, version: int, where: str) -> WeightSyncError:
        """The error to raise when the sender failed: a server's own error if one shows up soon
        (it is usually the cause: a dead or failing server), else the sender's, with the group."""
        failed = _first_error(calls, min(self.settings.timeout_s, _BLAME_WAIT_S))
        if failed is not None:
            url, cause = failed
            return ServerError(url, f"server {url} failed during update {version}: {cause} (sender: {exc})")
        return UpdateError(f"update {version} on {where} failed: {exc}")

    def _staged(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        pin = self.settings.pin_memory and torch.cuda.is_available()
        for name, source in named_tensors:
            tensor = source.detach()
            if self.settings.cpu_staging and tensor.device.type != "cpu":
                host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
                host.copy_(tensor)
                tensor = host
            yield name, tensor

    def raw_broadcast(self, nbytes: int, *, group: str = DEFAULT_GROUP) -> float:
        """Seconds for one plain broadcast of ``nbytes`` to the group's servers, triggered and
        acknowledged over HTTP like an update but with no framing and no apply: the transport
        baseline an update is compared with (``tools/bench_weightsync.py``)."""
        handle = self._group(group)
        timeout, payload = self.settings.timeout_s, {"group": group, "nbytes": int(nbytes)}
        buf = torch.zeros(int(nbytes), dtype=torch.uint8, device=handle.device)
        start = time.perf_counter()
        calls = [self._submit(url, "telescope_raw_receive", payload, timeout) for url in self._members[group]]
        handle.broadcast(buf, what=f"the raw baseline ({nbytes} bytes)")
        for call in calls:
            call.result(timeout=timeout)
        return time.perf_counter() - start

    # ----------------------------------------------------------------------------- queries
    def group_ranks(self, group: str = DEFAULT_GROUP) -> dict[str, list[int]]:
        """The group rank of each TP worker of each member server, in TP-rank order (trainer: 0)."""
        self._group(group)
        return {url: list(ranks) for url, ranks in self._ranks[group].items()}

    def server_versions(self) -> dict[str, int]:
        """The weight version each server serves (the lowest over its TP workers; -1: base model)."""
        results = self._call_all(self.server_urls, "telescope_version", None, self.settings.timeout_s)
        return {url: min(int(v) for v in res) for url, res in results.items()}

    def disconnect(self, group: str) -> None:
        """Leave ``group`` on its servers and release it (a group not connected: nothing to do)."""
        self._drop_group(group, leave=True)

    def close(self) -> None:
        """Leave every group on every reachable server and release sockets (idempotent)."""
        for name in list(self._groups):
            self._drop_group(name, leave=True)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._client is not None:
            self._client.close()
            self._client = None
        self._store = None

    def __enter__(self) -> WeightPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- helpers
    def _group(self, name: str) -> Group:
        handle = self._groups.get(name)
        if handle is None:
            raise GroupError(
                f"weight group {name!r} is not connected (known: {sorted(self._groups)}); a failed update "
                "drops its group: call connect() again"
            )
        return handle

    def _drop_group(self, name: str, *, leave: bool = True) -> None:
        group = self._groups.pop(name, None)
        members = self._members.pop(name, [])
        self._ranks.pop(name, None)
        self._layouts.pop(name, None)
        self._scratch.pop(name, None)
        if group is not None:
            group.close()
        if leave and self._client is not None:
            for url in members:
                try:
                    collective_rpc(self._client, url, "telescope_leave", {"group": name}, timeout_s=10.0)
                except WeightSyncError as exc:
                    log.warning("weightsync.leave_failed", group=name, server=url, error=str(exc))

    def _executor(self) -> cf.ThreadPoolExecutor:
        if self._pool is None:
            raise WeightSyncError("the publisher is closed")
        return self._pool

    def _http(self) -> httpx.Client:
        if self._client is None:
            raise WeightSyncError("the publisher is closed")
        return self._client

    def _rpc(self, url: str, method: str, payload: dict[str, Any] | None, timeout_s: float) -> Results:
        return collective_rpc(self._http(), url, method, payload, timeout_s=timeout_s)

    def _submit(
        self, url: str, method: str, payload: dict[str, Any] | None, timeout_s: float
    ) -> cf.Future[Results]:
        """Call ``method`` on the server at ``url`` in the background."""
        return self._executor().submit(self._rpc, url, method, payload, timeout_s)

    def _call_all(
        self, urls: list[str], method: str, payload: dict[str, Any] | None, timeout_s: float
    ) -> dict[str, Results]:
        calls = {self._submit(url, method, payload, timeout_s): url for url in urls}
        return {url: call.result() for call, url in calls.items()}
