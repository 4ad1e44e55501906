"""Remote providers (E2B, Modal, Daytona): thin adapters over their SDKs, behind extras.

A remote sandbox is one machine in someone's cloud, started on the first run (or by
``start()``) and stopped by ``close()``. Unlike ``LocalSandbox`` it keeps state: files written
by one run are there for the next (``stateless = False``, so the pool leases it to one run at a
time). Every adapter only has to provide four calls: start the machine, run a shell command
with a client-side timeout, write a file, read a file (and stop). ``RemoteSandbox`` builds the
rest on top of them the same way for all three:

* ``files`` and stdin are written into the work directory (stdin as ``.telescope_stdin``), after
  one ``mkdir -p`` for their folders;
* the program runs under ``bash -c`` with ``ulimit`` for CPU time, address space, file size,
  open files and processes, and ``timeout -s KILL`` for the wall clock (the image needs bash and
  coreutils); the API call itself gets ``timeout_s + 10`` seconds;
* ``files_out`` are read back; stdout and stderr are cut to ``max_output_bytes`` on arrival.

The isolation is the provider's (a micro-VM or container per sandbox), not ours. Exit statuses
come back through bash, so a signal shows up as ``128 + n`` and is reported as ``-n``; a real
exit status in 129..159 is read the same way. The SDKs cannot be reached from CI: the tests run
these adapters against local fakes of the SDK objects.
"""

from __future__ import annotations

import abc
import asyncio
import importlib
import math
import posixpath
import shlex
import time
from collections.abc import Awaitable
from types import MappingProxyType
from typing import Any

from telescope_sandbox._errors import SandboxInfraError
from telescope_sandbox._limits import Limits
from telescope_sandbox._provider import ExecRequest, Sandbox
from telescope_sandbox._result import ExecResult, classify_end

__all__ = ["DaytonaSandbox", "E2BSandbox", "ModalSandbox", "RemoteSandbox"]

_API_GRACE_S = 10.0
_STDIN_FILE = ".telescope_stdin"


def _import_sdk(provider: str, module: str) -> Any:
    """The SDK module of an extra (named like it), or an ImportError that says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{provider} needs the {module!r} package: pip install 'telescope-sandbox[{module}]'"
        ) from exc


def _text(data: Any, limit: int) -> tuple[str, bool]:
    raw = data.encode() if isinstance(data, str) else bytes(data or b"")
    return raw[:limit].decode(errors="replace"), len(raw) > limit


def shell_script(request: ExecRequest, workdir: str) -> str:
    """The ``bash -c`` script that runs ``request`` in ``workdir`` under ulimits and a deadline."""
    limits = request.limits
    ulimits = (
        f"ulimit -t {limits.cpu_seconds} -v {limits.memory_mb * 1024} -f {limits.max_file_mb * 2048} "
        f"-n {limits.max_open_files} -u {limits.max_processes} -c 0"
    )
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in request.env.items())
    command = " ".join(shlex.quote(a) for a in request.argv)
    deadline = f"{limits.timeout_s:.3f}"
    stdin = shlex.quote(_STDIN_FILE)
    program = f"{ulimits}; exec env {env} timeout -s KILL {deadline} {command} < {stdin}"
    return f"cd {shlex.quote(workdir)} && bash -c {shlex.quote(program)}"


def _result(
    limits: Limits,
    out: Any,
    err: Any,
    code: int,
    *,
    timed_out: bool,
    duration: float,
    files: dict[str, bytes],
) -> ExecResult:
    """The result of a remote run. bash reports death by signal n as status 128 + n."""
    exit_code = -(code - 128) if 128 < code < 160 else code
    if exit_code == -9 and duration >= limits.timeout_s:
        timed_out = True  # timeout -s KILL fired (it reports 137, or dies by SIGKILL itself)
    if timed_out:
        exit_code = -9
    stdout, out_cut = _text(out, limits.max_output_bytes)
    stderr, err_cut = _text(err, limits.max_output_bytes)
    killed_by = classify_end(
        exit_code=exit_code,
        stderr_tail=stderr[-2048:],
        timed_out=timed_out,
        output_killed=False,
        cpu_time_s=None,
        cpu_limit_s=limits.cpu_seconds,
    )
    return ExecResult(
        stdout,
        stderr,
        exit_code,
        timed_out=timed_out,
        duration_s=duration,
        killed_by=killed_by,
        output_truncated=out_cut or err_cut,
        files=MappingProxyType(files),
    )


class RemoteSandbox(Sandbox):
    """Shared logic of the remote adapters; subclasses implement the five SDK calls."""

    stateless = False

    def __init__(self, *, workdir: str, limits: Limits | None = None) -> None:
        super().__init__(limits=limits)
        self.workdir = workdir
        self._started = False
        self._lock = asyncio.Lock()
        self._box: Any = None  # the SDK's handle on the machine, once started

    @abc.abstractmethod
    async def _start(self) -> None:
        """Boot the remote machine."""

    @abc.abstractmethod
    async def _exec(self, command: str, timeout_s: float) -> tuple[Any, Any, int]:
        """Run a shell command; return ``(stdout, stderr, exit_code)``; raise TimeoutError on timeout."""

    @abc.abstractmethod
    async def _write(self, path: str, data: bytes) -> None:
        """Write ``data`` to the absolute ``path``, making parent folders."""

    @abc.abstractmethod
    async def _read(self, path: str) -> bytes | None:
        """Content of the absolute ``path``; None when it does not exist."""

    @abc.abstractmethod
    async def _stop(self) -> None:
        """Stop and delete the remote machine."""

    async def start(self) -> None:
        """Boot the machine now instead of on the first run."""
        async with self._lock:
            if not self._started:
                try:
                    await self._start()
                except Exception as exc:
                    raise SandboxInfraError(f"{self.name}: could not start a sandbox: {exc!r}") from exc
                self._started = True
                await self._exec(f"mkdir -p {shlex.quote(self.workdir)}", _API_GRACE_S)

    async def _execute(self, request: ExecRequest) -> ExecResult:
        await self.start()
        started = time.monotonic()
        try:
            await self._upload(request)
            out, err, code, timed_out = await self._run_script(request)
            duration = time.monotonic() - started
            files = await self._download(request)
        except SandboxInfraError:
            raise
        except Exception as exc:
            raise SandboxInfraError(f"{self.name}: {exc!r}") from exc
        return _result(request.limits, out, err, code, timed_out=timed_out, duration=duration, files=files)

    async def _upload(self, request: ExecRequest) -> None:
        """Write the request's files and its stdin into the work directory."""
        folders = sorted({posixpath.dirname(p) for p in request.files} - {""})
        if folders:
            targets = " ".join(shlex.quote(posixpath.join(self.workdir, f)) for f in folders)
            await self._exec(f"mkdir -p {targets}", _API_GRACE_S)
        for path, content in {**request.files, _STDIN_FILE: request.stdin}.items():
            await self._write(posixpath.join(self.workdir, path), content)

    async def _run_script(self, request: ExecRequest) -> tuple[Any, Any, int, bool]:
        """``(stdout, stderr, exit status, timed out)`` of the program's ``bash -c`` script."""
        try:
            out, err, code = await self._exec(
                shell_script(request, self.workdir), request.limits.timeout_s + _API_GRACE_S
            )
        except TimeoutError:
            return b"", b"", -9, True
        return out, err, code, False

    async def _download(self, request: ExecRequest) -> dict[str, bytes]:
        """The ``files_out`` that exist, each cut to ``max_file_mb``."""
        files: dict[str, bytes] = {}
        for path in request.files_out:
            data = await self._read(posixpath.join(self.workdir, path))
            if data is not None:
                files[path] = bytes(data[: request.limits.max_file_mb << 20])
        return files

    async def close(self) -> None:
        if self._started and not self.closed:
            try:
                await self._stop()
            except Exception as exc:
                raise SandboxInfraError(f"{self.name}: could not stop the sandbox: {exc!r}") from exc
        await super().close()


class E2BSandbox(RemoteSandbox):
    """An E2B sandbox (``pip install 'telescope-sandbox[e2b]'``; ``E2B_API_KEY`` or ``api_key``).

    ``template`` is the E2B template (None: E2B's default); ``lifetime_s`` the machine's own
    time to live. ``sdk`` replaces ``e2b.AsyncSandbox`` (tests pass a fake).
    """

    name = "e2b"

    def __init__(
        self,
        *,
        template: str | None = None,
        api_key: str | None = None,
        lifetime_s: int = 3600,
        workdir: str = "/home/user/sandbox",
        limits: Limits | None = None,
        sdk: Any = None,
    ) -> None:
        self._sdk = sdk if sdk is not None else _import_sdk("E2BSandbox", "e2b").AsyncSandbox
        super().__init__(workdir=workdir, limits=limits)
        self._template, self._api_key, self._lifetime_s = template, api_key, lifetime_s

    async def _start(self) -> None:
        kwargs: dict[str, Any] = {"timeout": self._lifetime_s}
        if self._template:
            kwargs["template"] = self._template
        if self._api_key:
            kwargs["api_key"] = self._api_key
        self._box = await self._sdk.create(**kwargs)

    async def _exec(self, command: str, timeout_s: float) -> tuple[Any, Any, int]:
        result: Any
        try:
            result = await self._box.commands.run(command, timeout=timeout_s)
        except Exception as exc:
            # e2b raises CommandExitException (carrying the result) for a non-zero exit and
            # TimeoutException when its own timeout fires; both matched by shape, not import.
            if type(exc).__name__ == "TimeoutException":
                raise TimeoutError(str(exc)) from exc
            if not hasattr(exc, "exit_code"):
                raise
            result = exc
        return result.stdout, result.stderr, int(result.exit_code)

    async def _write(self, path: str, data: bytes) -> None:
        await self._box.files.write(path, data)

    async def _read(self, path: str) -> bytes | None:
        if not await self._box.files.exists(path):
            return None
        return bytes(await self._box.files.read(path, format="bytes"))

    async def _stop(self) -> None:
        await self._box.kill()


class ModalSandbox(RemoteSandbox):
    """A Modal sandbox (``pip install 'telescope-sandbox[modal]'``; Modal's token setup).

    ``app_name`` is looked up or created; ``image`` is a ``modal.Image`` (None: Debian slim);
    ``cpu`` and ``memory_mb`` size the container; ``lifetime_s`` is its time to live. ``sdk``
    replaces the ``modal`` module (tests pass a fake).
    """

    name = "modal"

    def __init__(
        self,
        *,
        app_name: str = "telescope-sandbox",
        image: Any = None,
        cpu: float = 1.0,
        memory_mb: int = 2048,
        lifetime_s: int = 3600,
        workdir: str = "/sandbox",
        limits: Limits | None = None,
        sdk: Any = None,
    ) -> None:
        self._sdk = sdk if sdk is not None else _import_sdk("ModalSandbox", "modal")
        super().__init__(workdir=workdir, limits=limits)
        self._app_name, self._image = app_name, image
        self._cpu, self._memory_mb, self._lifetime_s = cpu, memory_mb, lifetime_s

    async def _start(self) -> None:
        app = await self._sdk.App.lookup.aio(self._app_name, create_if_missing=True)
        image = self._image if self._image is not None else self._sdk.Image.debian_slim()
        self._box = await self._sdk.Sandbox.create.aio(
            app=app, image=image, cpu=self._cpu, memory=self._memory_mb, timeout=self._lifetime_s
        )

    async def _exec(self, command: str, timeout_s: float) -> tuple[Any, Any, int]:
        process = await self._box.exec.aio("bash", "-c", command, timeout=math.ceil(timeout_s))
        reads: list[Awaitable[Any]] = [process.stdout.read.aio(), process.stderr.read.aio()]
        stdout, stderr = await asyncio.gather(*reads)
        code = await process.wait.aio()
        return stdout, stderr, int(code)

    async def _write(self, path: str, data: bytes) -> None:
        handle = await self._box.open.aio(path, "wb")
        try:
            await handle.write.aio(data)
        finally:
            await handle.close.aio()

    async def _read(self, path: str) -> bytes | None:
        try:
            handle = await self._box.open.aio(path, "rb")
        except FileNotFoundError:
            return None
        except Exception as exc:  # modal raises its own SandboxFilesystemNotFoundError
            if "NotFound" in type(exc).__name__:
                return None
            raise
        try:
            return bytes(await handle.read.aio())
        finally:
            await handle.close.aio()

    async def _stop(self) -> None:
        await self._box.terminate.aio()


class DaytonaSandbox(RemoteSandbox):
    """A Daytona sandbox (``pip install 'telescope-sandbox[daytona]'``; ``DAYTONA_API_KEY``).

    Daytona's ``exec`` returns stdout and stderr together, so the script sends stderr to a file
    in the work directory and reads it back. ``sdk`` replaces ``daytona.AsyncDaytona()`` (tests
    pass a fake client).
    """

    name = "daytona"
    _STDERR = ".telescope_stderr"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        workdir: str = "/home/daytona/sandbox",
        limits: Limits | None = None,
        sdk: Any = None,
    ) -> None:
        if sdk is None:
            daytona = _import_sdk("DaytonaSandbox", "daytona")
            sdk = daytona.AsyncDaytona(daytona.DaytonaConfig(api_key=api_key) if api_key else None)
        super().__init__(workdir=workdir, limits=limits)
        self._client = sdk

    async def _start(self) -> None:
        self._box = await self._client.create()

    async def _exec(self, command: str, timeout_s: float) -> tuple[Any, Any, int]:
        workdir = shlex.quote(self.workdir)
        stderr_path = shlex.quote(posixpath.join(self.workdir, self._STDERR))
        wrapped = f"bash -c {shlex.quote(f'mkdir -p {workdir}; {{ {command}; }} 2> {stderr_path}')}"
        response = await self._client_exec(wrapped, timeout_s)
        # The redirection always creates the stderr file, so it is read without looking first.
        stderr = bytes(await self._box.fs.download_file(posixpath.join(self.workdir, self._STDERR)))
        return response.result, stderr, int(response.exit_code)

    async def _client_exec(self, command: str, timeout_s: float) -> Any:
        return await self._box.process.exec(command, timeout=math.ceil(timeout_s))

    async def _write(self, path: str, data: bytes) -> None:
        await self._box.fs.upload_file(data, path)

    async def _read(self, path: str) -> bytes | None:
        # Daytona reports a missing file only in its error message, so ask the shell first.
        found = await self._client_exec(f"test -f {shlex.quote(path)}", _API_GRACE_S)
        if int(found.exit_code) != 0:
            return None
        return bytes(await self._box.fs.download_file(path))

    async def _stop(self) -> None:
        await self._box.delete()
