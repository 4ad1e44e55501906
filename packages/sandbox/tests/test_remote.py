"""The E2B, Modal and Daytona adapters, run against local fakes of their SDK objects.

Each fake mimics the SDK calls the adapter makes (names, arguments, return shapes, the way
errors come back) and executes the shell commands it receives with a local ``bash`` in
``tmp_path``, so the adapter's generated script (ulimits, ``timeout``, stdin redirection, file
transfer) really runs. The services themselves cannot be reached from CI.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from telescope_sandbox import Limits, SandboxInfraError, SandboxPool, available_sandboxes
from telescope_sandbox._remote import DaytonaSandbox, E2BSandbox, ModalSandbox, RemoteSandbox


async def _bash(command: str, timeout: float) -> tuple[bytes, bytes, int]:
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return out, err, proc.returncode


def _aio(fn: Any) -> SimpleNamespace:
    """Modal's calling convention: ``obj.method.aio(...)``."""
    return SimpleNamespace(aio=fn)


# -- E2B: AsyncSandbox.create(), .commands.run(), .files.write/read/exists, .kill() -----------


class TimeoutException(Exception):
    pass


class CommandExitException(Exception):
    def __init__(self, stdout: str, stderr: str, exit_code: int) -> None:
        super().__init__(f"exit {exit_code}")
        self.stdout, self.stderr, self.exit_code = stdout, stderr, exit_code


class FakeE2B:
    boxes: list[FakeE2B] = []  # noqa: RUF012

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs, self.killed, self.fail = kwargs, False, False
        self.commands = SimpleNamespace(run=self._run)
        self.files = SimpleNamespace(write=self._write, read=self._read, exists=self._exists)

    @classmethod
    async def create(cls, **kwargs: Any) -> FakeE2B:
        box = cls(**kwargs)
        cls.boxes.append(box)
        return box

    async def _run(self, cmd: str, timeout: float) -> SimpleNamespace:
        if self.fail:
            raise ConnectionError("sandbox not running")
        try:
            out, err, code = await _bash(cmd, timeout)
        except TimeoutError as exc:
            raise TimeoutException("context deadline exceeded") from exc
        if code:
            raise CommandExitException(out.decode(), err.decode(), code)
        return SimpleNamespace(stdout=out.decode(), stderr=err.decode(), exit_code=0)

    async def _write(self, path: str, data: bytes) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)

    async def _read(self, path: str, format: str = "text") -> bytearray:  # E2B's bytes come as a bytearray
        assert format == "bytes"
        return bytearray(Path(path).read_bytes())

    async def _exists(self, path: str) -> bool:
        return Path(path).exists()

    async def kill(self) -> None:
        self.killed = True


# -- Modal: App.lookup, Image.debian_slim, Sandbox.create, sb.exec/open/terminate, all .aio ----


class FakeModalFile:
    def __init__(self, path: str, mode: str) -> None:
        if "r" in mode and not Path(path).exists():
            raise FileNotFoundError(path)
        self._f = open(path, mode)  # noqa: SIM115  (closed through close.aio)
        self.write = _aio(self._write)
        self.read = _aio(self._read)
        self.close = _aio(self._close)

    async def _write(self, data: bytes) -> None:
        self._f.write(data)

    async def _read(self) -> bytes:
        return self._f.read()

    async def _close(self) -> None:
        self._f.close()


class FakeModalBox:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs, self.terminated = kwargs, False
        self.exec = _aio(self._exec)
        self.open = _aio(self._open)
        self.terminate = _aio(self._terminate)

    async def _exec(self, *argv: str, timeout: int) -> SimpleNamespace:
        assert argv[:2] == ("bash", "-c")
        assert isinstance(timeout, int)
        out, err, code = await _bash(argv[2], timeout)

        async def value(v: Any) -> Any:
            return v

        return SimpleNamespace(
            stdout=SimpleNamespace(read=_aio(lambda: value(out.decode()))),
            stderr=SimpleNamespace(read=_aio(lambda: value(err.decode()))),
            wait=_aio(lambda: value(code)),
        )

    async def _open(self, path: str, mode: str) -> FakeModalFile:
        return FakeModalFile(path, mode)

    async def _terminate(self) -> None:
        self.terminated = True


def fake_modal() -> SimpleNamespace:
    boxes: list[FakeModalBox] = []

    async def lookup(name: str, create_if_missing: bool = False) -> str:
        assert create_if_missing
        return f"app:{name}"

    async def create(**kwargs: Any) -> FakeModalBox:
        boxes.append(FakeModalBox(**kwargs))
        return boxes[-1]

    return SimpleNamespace(
        App=SimpleNamespace(lookup=_aio(lookup)),
        Image=SimpleNamespace(debian_slim=lambda: "debian-slim"),
        Sandbox=SimpleNamespace(create=_aio(create)),
        boxes=boxes,
    )


# -- Daytona: AsyncDaytona().create(), sb.process.exec (stdout+stderr together), sb.fs, delete -


class FakeDaytonaBox:
    def __init__(self) -> None:
        self.deleted = False
        self.process = SimpleNamespace(exec=self._exec)
        self.fs = SimpleNamespace(upload_file=self._upload, download_file=self._download)

    async def _exec(self, command: str, timeout: int | None = None) -> SimpleNamespace:
        out, err, code = await _bash(command, timeout or 60)
        return SimpleNamespace(result=(out + err).decode(), exit_code=code)

    async def _upload(self, data: bytes, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)

    async def _download(self, path: str) -> bytes:
        if not Path(path).exists():
            raise RuntimeError(f"Failed to download file: File not found: {path}")
        return Path(path).read_bytes()

    async def delete(self) -> None:
        self.deleted = True


class FakeDaytona:
    def __init__(self) -> None:
        self.boxes: list[FakeDaytonaBox] = []

    async def create(self) -> FakeDaytonaBox:
        self.boxes.append(FakeDaytonaBox())
        return self.boxes[-1]


def _make(kind: str, tmp_path: Path) -> RemoteSandbox:
    workdir = str(tmp_path / "box")
    if kind == "e2b":
        return E2BSandbox(template="python", sdk=FakeE2B, workdir=workdir)
    if kind == "modal":
        return ModalSandbox(sdk=fake_modal(), workdir=workdir)
    return DaytonaSandbox(sdk=FakeDaytona(), workdir=workdir)


KINDS = ["e2b", "modal", "daytona"]


@pytest.mark.parametrize("kind", KINDS)
async def test_roundtrip_through_the_adapter(kind: str, tmp_path: Path):
    async with _make(kind, tmp_path) as sandbox:
        code = (
            "import sys, helper\n"
            "print(sys.stdin.read().upper(), sys.argv[1:], helper.X)\n"
            "print('warn', file=sys.stderr)\n"
            "open('out/r.txt', 'w').write('done')\n"
        )
        r = await sandbox.run(
            code,
            stdin="hi",
            args=["a b"],
            files={"helper.py": "X = 7\n", "out/keep": ""},
            files_out=["out/r.txt", "nope"],
            env={"FOO": "1"},
        )
        assert r.exit_code == 0, r.stderr
        assert r.stdout == "HI ['a b'] 7\n"
        assert r.stderr == "warn\n"
        assert dict(r.files) == {"out/r.txt": b"done"}
        # Stateful: the next run sees the previous run's files.
        again = await sandbox.run("import os\nprint(sorted(os.listdir('out')), os.environ.get('FOO'))\n")
        assert again.stdout == "['keep', 'r.txt'] None\n"


@pytest.mark.parametrize("kind", KINDS)
async def test_limits_through_the_adapter(kind: str, tmp_path: Path):
    async with _make(kind, tmp_path) as sandbox:
        r = await sandbox.run("sleep 5", language="bash", timeout_s=0.5)
        assert r.timed_out
        assert r.killed_by == "timeout"
        r = await sandbox.run("import sys\nsys.exit(3)\n")
        assert r.exit_code == 3
        r = await sandbox.run("kill -SEGV $$", language="bash")
        assert r.exit_code == -11
        assert r.killed_by == "signal"
        r = await sandbox.run("x = bytearray(2**33)\n", memory_mb=256)
        assert r.killed_by == "memory"
        r = await sandbox.run("print('y' * 5000)\n", limits=Limits(max_output_bytes=100))
        assert r.output_truncated
        assert len(r.stdout) == 100


async def test_sdk_specific_calls(tmp_path: Path):
    FakeE2B.boxes.clear()
    e2b = _make("e2b", tmp_path / "e")
    await e2b.run_command(["true"])
    assert FakeE2B.boxes[0].kwargs == {"timeout": 3600, "template": "python"}
    await e2b.close()
    assert FakeE2B.boxes[0].killed

    modal = fake_modal()
    box = ModalSandbox(sdk=modal, workdir=str(tmp_path / "m"), cpu=2.0, memory_mb=1024)
    await box.run_command(["true"])
    assert modal.boxes[0].kwargs == {
        "app": "app:telescope-sandbox",
        "image": "debian-slim",
        "cpu": 2.0,
        "memory": 1024,
        "timeout": 3600,
    }
    await box.close()
    assert modal.boxes[0].terminated

    client = FakeDaytona()
    daytona = DaytonaSandbox(sdk=client, workdir=str(tmp_path / "d"))
    await daytona.run_command(["true"])
    await daytona.close()
    assert client.boxes[0].deleted


async def test_api_failure_is_an_infra_error_and_the_pool_retires(tmp_path: Path):
    FakeE2B.boxes.clear()
    async with SandboxPool(lambda: _make("e2b", tmp_path), max_concurrency=1, infra_retries=0) as pool:
        await pool.run("print(1)")
        FakeE2B.boxes[0].fail = True
        with pytest.raises(SandboxInfraError, match="sandbox not running"):
            await pool.run("print(1)")
        assert (await pool.run("print(2)")).stdout == "2\n"
        metrics = pool.metrics()
    assert len(FakeE2B.boxes) == 2
    assert metrics["failures"] == 1
    assert FakeE2B.boxes[0].killed


async def test_a_run_whose_machine_fails_goes_again_on_a_new_one(tmp_path: Path):
    FakeE2B.boxes.clear()
    async with SandboxPool(lambda: _make("e2b", tmp_path), max_concurrency=1, retry_backoff_s=0) as pool:
        await pool.run("print(1)")
        FakeE2B.boxes[0].fail = True
        assert (await pool.run("print(2)")).stdout == "2\n"  # the caller never sees the failure
        metrics = pool.metrics()
    assert len(FakeE2B.boxes) == 2
    assert FakeE2B.boxes[0].killed  # the failed machine was stopped
    assert (metrics["failures"], metrics["infra_retries"], metrics["runs"]) == (1, 1, 2)


async def test_pool_rejects_sharing_a_stateful_sandbox(tmp_path: Path):
    with pytest.raises(ValueError, match="factory"):
        SandboxPool(_make("modal", tmp_path))


@pytest.mark.parametrize(
    ("cls", "module", "extra"), [(E2BSandbox, "e2b", "e2b"), (ModalSandbox, "modal", "modal")]
)
def test_missing_sdk_names_the_extra(cls: type[E2BSandbox] | type[ModalSandbox], module: str, extra: str):
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed")
    with pytest.raises(ImportError, match=rf"pip install 'telescope-sandbox\[{extra}\]'"):
        cls()


def test_missing_daytona_sdk_names_the_extra():
    if importlib.util.find_spec("daytona") is not None:
        pytest.skip("daytona is installed")
    with pytest.raises(ImportError, match=r"telescope-sandbox\[daytona\]"):
        DaytonaSandbox()


def test_registered_names():
    assert {"local", "e2b", "modal", "daytona"} <= set(available_sandboxes())
