"""``LocalSandbox``: the embedded provider, bubblewrap namespaces plus rlimits on this machine.

Each run is one ``bwrap`` process tree: the host starts bubblewrap (see ``_bwrap`` for the view
of the system it builds), which starts the helper (``_shim``), which runs the program. The host
side feeds stdin, reads stdout and stderr as they come (keeping ``max_output_bytes`` of each),
reads the helper's report, and kills the whole tree at the deadline by killing the PID
namespace's init (pinned with a pidfd; bubblewrap's ``--info-fd`` names it), which makes the
kernel kill everything in the namespace, whether or not the program still holds its pipes
open. ``run`` returns only once that init has exited, so no process of a run outlives it; a run
cancelled at any point (even while its process starts) ends the same way before the
``CancelledError`` reaches the caller, its pipes closed and its tasks ended.

Nothing is shared between runs, so one ``LocalSandbox`` serves any number of concurrent runs; the
object only caches the prepared bubblewrap command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import marshal
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from io import FileIO
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar

import structlog

from telescope_sandbox._bwrap import USERNS_HINT, UidAllocator, find_bwrap, forward_binds, root_args
from telescope_sandbox._errors import SandboxInfraError, SandboxRequestError, SandboxUnavailableError
from telescope_sandbox._limits import OUTPUT_KILL_FACTOR, Limits
from telescope_sandbox._provider import ExecRequest, Sandbox
from telescope_sandbox._result import ExecResult, classify_end

__all__ = ["LocalSandbox"]

_log = structlog.get_logger()
_T = TypeVar("_T")
_SHIM_SOURCE = (Path(__file__).parent / "_shim.py").read_text()
_UIDS = UidAllocator()
_INSIDE_UID = 1000
_WORKDIR = "/sandbox"
_READ_CHUNK = 1 << 16
KILL_WAIT_S = 10.0
"""How long a killed run's end waits for its process before it kills bubblewrap's group as well."""
INIT_NAMED_S = 1.0
"""How long a kill waits for bubblewrap to name the sandbox's init (it names it right after starting
it) before it takes bubblewrap's child as init, or kills bubblewrap's process group where it has none."""


def _python_prefix(python: str) -> str:
    """The install folder of an interpreter: the parent of its ``bin`` folder."""
    real = Path(os.path.realpath(python))
    return str(real.parent.parent)


@dataclass
class _Stream:
    """One output stream read with a cap."""

    limit: int
    kill_at: int
    data: bytearray
    total: int = 0

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.total += len(chunk)

    @property
    def truncated(self) -> bool:
        return self.total > self.limit


class LocalSandbox(Sandbox):
    """Runs programs on this machine inside bubblewrap namespaces with rlimits.

    ``isolation="bwrap"`` (the default) is the sandbox described in ``_bwrap``; it raises
    ``SandboxUnavailableError`` naming the package to install when bubblewrap is missing.
    ``isolation="none"`` runs the program as a plain child process in a temporary folder with
    the same rlimits (except ``max_processes``) and the same deadline, **but no isolation at
    all**: it sees the network, the whole file system and every process. Use it only for code
    you trust, on machines where bubblewrap cannot run.

    ``python`` is the interpreter ``run(language="python")`` uses (default: the one running
    this process, found through symlinks; its install folder is bound read-only when outside
    ``/usr``; a virtual environment's packages are not). ``ro_binds`` adds host folders, bound
    read-only at the same path. ``env`` adds environment variables to every run. ``limits``
    holds the defaults for every limit but ``timeout_s`` and ``memory_mb``.
    ``run_command(forward_ports=...)`` binds each host socket into the run and has the helper relay
    ``127.0.0.1:port`` of the run's own network namespace to it (with bubblewrap only).
    ``user_namespace`` forces (True) or forbids (False) bubblewrap's user namespace; by default
    it is used unless this process is root (see ``_bwrap`` for why). As root with a user
    namespace, ``max_processes`` is not enforced by the kernel: for tests only.
    """

    name = "local"
    stateless = True
    forwards_ports = True

    def __init__(
        self,
        *,
        isolation: Literal["bwrap", "none"] = "bwrap",
        bwrap: str | None = None,
        python: str | None = None,
        ro_binds: Sequence[str] = (),
        env: dict[str, str] | None = None,
        limits: Limits | None = None,
        user_namespace: bool | None = None,
    ) -> None:
        super().__init__(limits=limits)
        if isolation not in ("bwrap", "none"):
            raise SandboxRequestError(f"isolation must be 'bwrap' or 'none', got {isolation!r}")
        self.isolation = isolation
        self.python = os.path.realpath(python or sys.executable)
        if not os.access(self.python, os.X_OK):
            raise SandboxRequestError(f"python {self.python!r} is not executable")
        binds = [_python_prefix(self.python)]
        for path in ro_binds:
            if not os.path.isabs(path) or not os.path.exists(path):
                raise SandboxRequestError(f"ro_binds entry {path!r} must be an existing absolute path")
            binds.append(os.path.realpath(path))
        self.env = dict(env or {})
        self._privileged = os.geteuid() == 0 if user_namespace is None else not user_namespace
        self._args: list[str] = []
        self._sized = False
        if isolation == "bwrap":
            bwrap_path = find_bwrap(bwrap)
            self._args, self._sized = root_args(
                bwrap=bwrap_path,
                privileged=self._privileged,
                extra_ro=binds,
                workdir=_WORKDIR,
                sandbox_uid=_INSIDE_UID,
            )
        else:
            _log.warning(
                "sandbox_isolation_disabled",
                detail="LocalSandbox(isolation='none') runs programs unisolated; trusted code only",
            )

    def _interpreter(self, name: str) -> str:
        return self.python if name == "python" else name

    def _program_env(self, request: ExecRequest, workdir: str) -> dict[str, str]:
        bindir = str(Path(self.python).parent)
        env = {
            "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": "/tmp" if self.isolation == "bwrap" else workdir,
            "LANG": "C.UTF-8",
            "USER": "sandbox",
            "LOGNAME": "sandbox",
            "PYTHONDONTWRITEBYTECODE": "1",
            "MALLOC_ARENA_MAX": "2",
        }
        return env | self.env | dict(request.env)

    async def _execute(self, request: ExecRequest) -> ExecResult:
        limits = request.limits
        if self.isolation == "none":
            if request.forward_ports:
                raise SandboxRequestError(
                    "forward_ports needs the sandbox's own network namespace: isolation='bwrap'"
                )
            workdir = tempfile.mkdtemp(prefix="telescope-sandbox-")
            try:
                return await self._spawn(request, workdir=workdir, uid=None, argv_head=[], nproc=False)
            finally:
                await asyncio.to_thread(shutil.rmtree, workdir, True)
        size = str(max(limits.disk_mb, 1) << 20)
        binds, _ = forward_binds(dict(request.forward_ports))
        head: list[str] = []
        for arg in self._args:
            head += binds if arg == "{binds}" else [size if arg == "{size}" else arg]
        if not self._privileged:
            return await self._spawn(request, workdir=_WORKDIR, uid=None, argv_head=head, nproc=True)
        uid = _UIDS.acquire()
        try:
            return await self._spawn(request, workdir=_WORKDIR, uid=uid, argv_head=head, nproc=True)
        finally:
            _UIDS.release(uid)

    async def _spawn(
        self,
        request: ExecRequest,
        *,
        workdir: str,
        uid: int | None,
        argv_head: list[str],
        nproc: bool,
    ) -> ExecResult:
        spec, blob = self._spec(request, workdir=workdir, uid=uid, nproc=nproc)
        spec_fd = _memfd(marshal.dumps(spec, 4), blob)
        status_r, status_w = os.pipe()
        info_r, info_w = os.pipe() if argv_head else (-1, -1)
        keep = (spec_fd, status_w) if info_w < 0 else (spec_fd, status_w, info_w)
        try:
            info = ["--info-fd", str(info_w)] if argv_head else []
            shim = [self.python, "-S", "-I", "-c", _SHIM_SOURCE, str(spec_fd), str(status_w)]
            argv = [*argv_head, *info, *shim]
            start = time.monotonic()
            proc, cancelled = await _through_cancel(_start(argv, keep))
        except BaseException:
            for fd in (status_r, info_r):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            for fd in keep:
                os.close(fd)
        run = _Run(
            proc, request=request, limits=request.limits, status_fd=status_r, info_fd=info_r, start=start
        )
        if cancelled:  # ended like a killed run (nothing of it left), then cancelled
            run.kill("timeout")
            with contextlib.suppress(Exception):
                await _through_cancel(run.finish())
            raise asyncio.CancelledError
        return await run.finish()

    def _spec(
        self, request: ExecRequest, *, workdir: str, uid: int | None, nproc: bool
    ) -> tuple[dict[str, Any], bytearray]:
        """What the helper (``_shim``) needs to run ``request``, and the input files' bytes."""
        limits = request.limits
        rlimits = limits.rlimits()
        if nproc:
            # The helper (and, in a user namespace, bubblewrap's PID 1) run as the same user.
            extra = 1 if self._privileged else 2
            rlimits = [(n, s + extra, h + extra) if n == "RLIMIT_NPROC" else (n, s, h) for n, s, h in rlimits]
        else:
            rlimits = [r for r in rlimits if r[0] != "RLIMIT_NPROC"]
        blob = bytearray()
        files: list[list[Any]] = []
        for path, content in request.files.items():
            files.append([path, len(blob), len(content)])
            blob += content
        spec = {
            "workdir": workdir,
            "uid": uid,
            "gid": uid,
            "rlimits": rlimits,
            "argv": list(request.argv),
            "env": self._program_env(request, workdir),
            "files": files,
            "files_out": list(request.files_out),
            "max_file_out": limits.max_file_mb << 20,
            "forward": forward_binds(dict(request.forward_ports))[1],
        }
        return spec, blob


def _named_init(info: bytes) -> int | None:
    """The host PID of the sandbox's init in bubblewrap's ``--info-fd`` JSON, if there."""
    try:
        return int(json.loads(info.decode())["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def _child_of(pid: int) -> int | None:
    """The one child of process ``pid`` (bubblewrap's: the sandbox's init), if it has one."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if len(children) == 1 else None


def _pin_init(pid: int | None) -> int | None:
    """A pidfd of process ``pid`` if it is the init of a child PID namespace; None where the kernel
    is too old, it has already ended, or the PID names something else (reused)."""
    if pid is None:
        return None
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, OverflowError):
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        nspid = next(line for line in status.splitlines() if line.startswith("NSpid:")).split()
        if len(nspid) < 3 or nspid[-1] != "1":
            raise ValueError(nspid)
    except (OSError, StopIteration, ValueError):
        os.close(pidfd)
        return None
    return pidfd


async def _start(argv: list[str], keep: tuple[int, ...]) -> asyncio.subprocess.Process:
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=keep,
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
    except OSError as exc:
        raise SandboxInfraError(f"cannot start the sandbox ({argv[0]}): {exc}") from exc


async def _through_cancel(work: Coroutine[Any, Any, _T]) -> tuple[_T, bool]:
    """Run ``work`` to its end even if the caller is cancelled meanwhile; returns its result and
    whether the caller was cancelled (an error of ``work`` after that is a ``CancelledError``).

    For what must not stop half way: asyncio's start of a process, cancelled, kills it but leaves
    the pipes it has not connected yet to a task that connects them after the process is gone, and
    nobody closes them; a run's end, cancelled, would leave its process, pipes or tasks.
    """
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError:
            if task.cancelled():  # pragma: no cover - only the loop's shutdown cancels it
                raise
            cancelled = True
        except Exception as exc:
            if cancelled:
                raise asyncio.CancelledError from exc
            raise


def _memfd(spec: bytes, blob: bytearray) -> int:
    """A memory file holding the helper's input: the spec's length, the spec, the files' bytes."""
    fd = os.memfd_create("telescope-sandbox-spec")
    try:
        view = memoryview(b"%d\n" % len(spec) + spec + blob)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Run:
    """One started sandbox process: feeds, reads, enforces the deadline, builds the result."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        *,
        request: ExecRequest,
        limits: Limits,
        status_fd: int,
        info_fd: int,
        start: float,
    ) -> None:
        self.proc, self.request, self.limits, self.start = proc, request, limits, start
        self.info_fd = info_fd
        # Files now, not in the reading tasks: a task cancelled before it starts closes nothing.
        self.pipes = [os.fdopen(fd, "rb", buffering=0) for fd in (status_fd, info_fd) if fd >= 0]
        self.init_pidfd: int | None = None
        self.info_read = info_fd < 0
        """Whether bubblewrap has named the sandbox's init, or cannot any more (``kill``)."""
        self.kill_fallback: asyncio.TimerHandle | None = None
        cap = limits.max_output_bytes
        self.out = _Stream(cap, cap * OUTPUT_KILL_FACTOR, bytearray())
        self.err = _Stream(cap, cap * OUTPUT_KILL_FACTOR, bytearray())
        status_cap = (1 << 20) + len(request.files_out) * (limits.max_file_mb << 20)
        self.status = _Stream(status_cap, status_cap, bytearray())
        self.killed_for: Literal["timeout", "output"] | None = None

    def kill(self, reason: Literal["timeout", "output"]) -> None:
        """Kill the sandbox. With bubblewrap, kill the PID namespace's init: the kernel kills
        everything in the namespace and bubblewrap exits only once all of it is gone, so no
        process of the run outlives ``run``. Until bubblewrap has named init, the kill waits for it
        (``_watch_info``; after :data:`INIT_NAMED_S`, bubblewrap's child is taken as init): bubblewrap
        killed before its child has set its parent-death signal leaves the sandbox running. Without
        bubblewrap, or where init cannot be found, kill bubblewrap's process group."""
        if self.killed_for is None:
            self.killed_for = reason
        if self.proc.returncode is not None:
            return
        if self.init_pidfd is None and not self.info_read:
            if self.kill_fallback is None:  # bubblewrap slow to name init: find it, do not wait forever
                self.kill_fallback = asyncio.get_running_loop().call_later(INIT_NAMED_S, self._find_init)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.init_pidfd is not None:
                signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
            else:
                os.killpg(self.proc.pid, signal.SIGKILL)

    def _find_init(self) -> None:
        """The kill's fallback: bubblewrap's child, if it has one, is the sandbox's init."""
        if self.init_pidfd is None and self.proc.returncode is None:  # (else its PID may be reused)
            self.init_pidfd = _pin_init(_child_of(self.proc.pid))
        self._init_known()

    def _init_known(self) -> None:
        """Bubblewrap has named the sandbox's init, or cannot any more: do the kill that waited."""
        self.info_read = True
        if self.killed_for is not None:
            self.kill(self.killed_for)

    async def _watch_info(self) -> None:
        """Learn the host PID of the sandbox's init from bubblewrap's ``--info-fd`` and pin it;
        then do a kill that waited for it."""
        if self.info_fd < 0:
            return
        try:
            stream = _Stream(1 << 16, 1 << 16, bytearray())
            await self._read_pipe(self.pipes[1], stream)
            if self.init_pidfd is None:  # (unless the kill's fallback found it first)
                self.init_pidfd = _pin_init(_named_init(bytes(stream.data)))
        finally:
            if self.kill_fallback is not None:
                self.kill_fallback.cancel()
            self._init_known()

    async def _pump(self, reader: asyncio.StreamReader | None, stream: _Stream, kills: bool) -> None:
        if reader is None:  # pragma: no cover
            return
        while chunk := await reader.read(_READ_CHUNK):
            stream.feed(chunk)
            if kills and stream.total > stream.kill_at:
                self.kill("output")

    async def _feed_stdin(self) -> None:
        stdin = self.proc.stdin
        if stdin is None:  # pragma: no cover
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if self.request.stdin:
                stdin.write(self.request.stdin)
                await stdin.drain()
            stdin.close()
            await stdin.wait_closed()

    async def _wait_for_init(self, timeout_s: float = 5.0) -> None:
        """Wait until the sandbox's init has exited, i.e. its PID namespace is empty.

        bubblewrap exits as soon as init reports the program's status, which can be a moment
        before the kernel has finished killing the namespace's other processes.
        """
        with contextlib.suppress(Exception):  # too slow (TimeoutError), or failed: no init to wait for
            async with asyncio.timeout(1.0):
                await asyncio.shield(self.info_task)
        pidfd = self.init_pidfd
        if pidfd is None:
            return
        loop = asyncio.get_running_loop()
        exited = loop.create_future()
        loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
        try:
            async with asyncio.timeout(timeout_s):
                await exited
        except TimeoutError:
            _log.warning("sandbox_init_slow_to_exit", timeout_s=timeout_s)
        finally:
            loop.remove_reader(pidfd)

    async def _read_pipe(self, pipe: FileIO, stream: _Stream) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        try:
            await self._pump(reader, stream, kills=False)
        finally:
            transport.close()

    async def finish(self) -> ExecResult:
        self.info_task = asyncio.create_task(self._watch_info())
        io_tasks = [
            asyncio.create_task(self._pump(self.proc.stdout, self.out, kills=True)),
            asyncio.create_task(self._pump(self.proc.stderr, self.err, kills=True)),
            asyncio.create_task(self._read_pipe(self.pipes[0], self.status)),
            self.info_task,
        ]
        stdin_task = asyncio.create_task(self._feed_stdin())
        try:
            try:
                async with asyncio.timeout(self.limits.timeout_s):
                    await self.proc.wait()
            except TimeoutError:
                self.kill("timeout")
                await self.proc.wait()
            duration = time.monotonic() - self.start
        finally:
            _, cancelled = await _through_cancel(self._end(io_tasks, stdin_task))
            if cancelled:
                raise asyncio.CancelledError
        return self._result(duration)

    async def _end(self, io_tasks: list[asyncio.Task[None]], stdin_task: asyncio.Task[None]) -> None:
        """Leave nothing of the run: its process killed if it still runs (cancelled), the sandbox's
        namespace gone, its pipes read to their end, its tasks ended."""
        try:
            if self.proc.returncode is None:
                self.kill("timeout")
                await self._wait_killed()
            await self._wait_for_init()
            # The namespace is gone once bubblewrap is, so the pipes close right away; the grace
            # period only matters for isolation="none", where a detached child may hold them.
            await asyncio.wait(io_tasks, timeout=2.0)
        finally:
            for task in [*io_tasks, stdin_task]:
                task.cancel()
            await asyncio.gather(*io_tasks, stdin_task, return_exceptions=True)
            if self.kill_fallback is not None:
                self.kill_fallback.cancel()
            for pipe in self.pipes:
                pipe.close()
            if self.init_pidfd is not None:
                os.close(self.init_pidfd)
                self.init_pidfd = None

    async def _wait_killed(self) -> None:
        """Wait for the killed process; where the kill did not take within :data:`KILL_WAIT_S`
        (a signal refused), kill bubblewrap's process group too."""
        try:
            async with asyncio.timeout(KILL_WAIT_S):
                await self.proc.wait()
        except TimeoutError:
            _log.warning("sandbox_kill_slow", wait_s=KILL_WAIT_S, pid=self.proc.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()

    def _result(self, duration: float) -> ExecResult:
        status = bytes(self.status.data)
        stderr = self.err.data.decode(errors="replace")
        stdout = self.out.data.decode(errors="replace")
        returncode = self.proc.returncode if self.proc.returncode is not None else -signal.SIGKILL
        if not status.startswith(b"S") and self.killed_for is None:
            self._raise_setup_failure(returncode, stderr)
        report = _parse_report(status[1:], self.request.files_out)
        cpu = rss = None
        if self.killed_for is not None:
            exit_code = -signal.SIGKILL
        elif report is not None:
            exit_code, cpu, rss = report.exit_code, report.cpu_s, report.max_rss_mb
        else:  # the helper died before reporting: bubblewrap passes on 128 + signal
            exit_code = -(returncode - 128) if 128 < returncode < 192 else returncode
        killed_by = classify_end(
            exit_code=exit_code,
            stderr_tail=stderr[-2048:],
            timed_out=self.killed_for == "timeout",
            output_killed=self.killed_for == "output",
            cpu_time_s=cpu,
            cpu_limit_s=self.limits.cpu_seconds,
        )
        return ExecResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=exit_code,
            timed_out=self.killed_for == "timeout",
            duration_s=duration,
            killed_by=killed_by,
            output_truncated=self.out.truncated or self.err.truncated,
            files=MappingProxyType(report.files if report else {}),
            cpu_time_s=cpu,
            max_rss_mb=rss,
        )

    def _raise_setup_failure(self, returncode: int, stderr: str) -> None:
        detail = stderr.strip()[-2000:] or f"exit status {returncode}"
        _log.warning("sandbox_setup_failed", returncode=returncode, detail=detail)
        lowered = detail.lower()
        if any(s in lowered for s in ("namespace", "uid map", "operation not permitted", "setting up")):
            raise SandboxUnavailableError(f"bubblewrap failed to set up the sandbox: {detail}\n{USERNS_HINT}")
        raise SandboxInfraError(f"the sandbox failed before the program started: {detail}")


@dataclass
class _Report:
    exit_code: int
    cpu_s: float
    max_rss_mb: float
    files: dict[str, bytes]


def _parse_report(data: bytes, files_out: Sequence[str]) -> _Report | None:
    """The helper's final report (see ``_shim``); None when it is missing or malformed."""
    lines = data.split(b"\n", len(files_out) + 1)
    if len(lines) < len(files_out) + 2:
        return None
    try:
        status, cpu, rss = lines[0].split()
        sizes = [int(line) for line in lines[1 : len(files_out) + 1]]
        report = _Report(os.waitstatus_to_exitcode(int(status)), float(cpu), int(rss) / 1024, {})
    except ValueError:
        return None
    payload, offset = lines[-1], 0
    for path, size in zip(files_out, sizes, strict=True):
        if size >= 0:
            report.files[path] = payload[offset : offset + size]
            offset += size
    return report
