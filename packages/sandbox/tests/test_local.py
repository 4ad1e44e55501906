"""LocalSandbox does what a caller asks: languages, stdin, arguments, environment, files, exit codes."""

from __future__ import annotations

import os

import pytest

from telescope_sandbox import (
    Limits,
    LocalSandbox,
    SandboxInfraError,
    SandboxRequestError,
    SandboxUnavailableError,
)


async def test_python_roundtrip(sandbox: LocalSandbox):
    code = "import sys\nprint(sys.stdin.read().upper(), sys.argv[1:])\nprint('err', file=sys.stderr)\n"
    r = await sandbox.run(code, stdin="hello", args=["a", "b c"])
    assert r.ok
    assert r.exit_code == 0
    assert r.killed_by is None
    assert not r.timed_out
    assert r.stdout == "HELLO ['a', 'b c']\n"
    assert r.stderr == "err\n"
    assert r.duration_s > 0
    assert r.cpu_time_s is not None
    assert r.max_rss_mb is not None


async def test_exit_codes_and_signals(sandbox: LocalSandbox):
    r = await sandbox.run("import sys\nsys.exit(3)\n")
    assert r.exit_code == 3
    assert not r.ok
    assert r.killed_by is None
    # A real exit status above 128 is kept as is (not mistaken for a signal).
    r = await sandbox.run("import sys\nsys.exit(137)\n")
    assert r.exit_code == 137
    assert r.killed_by is None
    r = await sandbox.run("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    assert r.exit_code == -11
    assert r.killed_by == "signal"
    r = await sandbox.run("raise ValueError('boom')\n")
    assert r.exit_code == 1
    assert "ValueError: boom" in r.stderr
    assert 'File "/sandbox/main.py"' in r.stderr


async def test_shell_languages(sandbox: LocalSandbox):
    r = await sandbox.run(
        'echo "$1-$2"; read line; echo "got $line"', language="bash", args=["x", "y"], stdin="in\n"
    )
    assert r.stdout == "x-y\ngot in\n"
    r = await sandbox.run("echo $((6 * 7))", language="sh")
    assert r.stdout == "42\n"


async def test_run_command_env_and_cwd(sandbox: LocalSandbox):
    r = await sandbox.run_command(["sh", "-c", 'echo "$GREETING $HOME $(pwd)"'], env={"GREETING": "hi"})
    assert r.stdout == "hi /sandbox /sandbox\n"
    r = await sandbox.run_command(["no-such-program"])
    assert r.exit_code == 127
    assert "cannot run" in r.stderr


async def test_environment_is_clean(sandbox: LocalSandbox, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TELESCOPE_TEST_SECRET", "leak")
    r = await sandbox.run("import os\nprint(sorted(os.environ))\n")
    assert "TELESCOPE_TEST_SECRET" not in r.stdout
    assert "'HOME'" in r.stdout
    assert "'PATH'" in r.stdout


async def test_files_in_and_out(sandbox: LocalSandbox):
    code = (
        "import helper, os\n"
        "print(helper.VALUE, open('data/in.bin', 'rb').read())\n"
        "os.makedirs('out', exist_ok=True)\n"
        "open('out/result.txt', 'w').write('done')\n"
        "os.mkfifo('pipe')\n"
        "os.symlink('/etc/ld.so.cache', 'link')\n"
    )
    files = {"helper.py": "VALUE = 42\n", "data/in.bin": b"\x00\xff"}
    r = await sandbox.run(
        code, files=files, files_out=["out/result.txt", "missing.txt", "pipe", "link", "data/in.bin"]
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "42 b'\\x00\\xff'\n"
    # Missing files, FIFOs and symlinks are left out rather than read.
    assert dict(r.files) == {"out/result.txt": b"done", "data/in.bin": b"\x00\xff"}


async def test_files_out_are_capped(sandbox: LocalSandbox):
    code = "open('big', 'wb').write(b'x' * (3 << 20))\n"
    r = await sandbox.run(code, files_out=["big"], limits=Limits(max_file_mb=8, disk_mb=16))
    assert len(r.files["big"]) == 3 << 20


async def test_runs_are_independent(sandbox: LocalSandbox):
    await sandbox.run("open('left_behind', 'w').write('x')\n")
    r = await sandbox.run("import os\nprint(os.listdir('.'))\n")
    assert r.stdout == "['main.py']\n"


async def test_bad_requests(sandbox: LocalSandbox):
    with pytest.raises(SandboxRequestError, match="unknown language 'cobol'; known: python, bash, sh"):
        await sandbox.run("x", language="cobol")
    with pytest.raises(SandboxRequestError, match="leaves the work directory"):
        await sandbox.run("x", files={"../escape": "x"})
    with pytest.raises(SandboxRequestError, match="relative"):
        await sandbox.run("x", files_out=["/etc/passwd"])
    with pytest.raises(SandboxRequestError, match=r"main\.py"):
        await sandbox.run("x", files={"main.py": "y"})
    with pytest.raises(SandboxRequestError, match="timeout_s must be > 0"):
        await sandbox.run("x", timeout_s=0)
    with pytest.raises(SandboxRequestError, match="one string"):
        await sandbox.run_command("ls -l")
    with pytest.raises(SandboxRequestError, match="disk_mb"):
        await sandbox.run("x", files={"a": b"x" * (2 << 20)}, limits=Limits(disk_mb=1))
    with pytest.raises(SandboxRequestError, match="must be str or bytes"):
        await sandbox.run("x", files={"a": 5})  # type: ignore[dict-item]
    await sandbox.close()
    with pytest.raises(SandboxRequestError, match="closed"):
        await sandbox.run("print(1)")


def test_missing_bwrap_says_what_to_install():
    with pytest.raises(SandboxUnavailableError) as info:
        LocalSandbox(bwrap="/nonexistent/bwrap")
    assert "apt-get install bubblewrap" in str(info.value)
    assert "dnf install bubblewrap" in str(info.value)


async def test_setup_failure_is_an_infra_error(sandbox: LocalSandbox):
    at = sandbox._args.index("--proc")
    sandbox._args[at:at] = ["--ro-bind", "/nonexistent-telescope-path", "/x"]
    with pytest.raises(SandboxInfraError, match="nonexistent-telescope-path"):
        await sandbox.run("print(1)")


async def test_user_namespace_mode(sandbox: LocalSandbox):
    # The mode a non-root caller gets; forced here so root CI covers it too.
    user = LocalSandbox(user_namespace=True)
    r = await user.run("import os\nprint(os.getuid(), sorted(os.listdir('/')))\nopen('/usr/x', 'w')\n")
    assert r.stdout.startswith("1000 ")
    assert "Read-only file system" in r.stderr
    assert "shadow" not in r.stdout


async def test_isolation_none_is_a_plain_subprocess():
    sandbox = LocalSandbox(isolation="none", bwrap="/nonexistent/bwrap")
    r = await sandbox.run(
        "import os\nprint(open('in.txt').read(), os.getcwd() != '/sandbox')\nopen('o', 'w').write('1')\n",
        files={"in.txt": "hi"},
        files_out=["o"],
    )
    assert r.stdout == "hi True\n"
    assert r.files == {"o": b"1"}
    r = await sandbox.run("while True:\n    pass\n", timeout_s=0.5)
    assert r.timed_out
    with pytest.raises(SandboxRequestError, match="isolation"):
        LocalSandbox(isolation="docker")  # type: ignore[arg-type]


@pytest.mark.skipif(os.geteuid() != 0, reason="as a normal user the sandbox user is the caller")
async def test_root_runs_as_a_fresh_unprivileged_user(sandbox: LocalSandbox):
    r = await sandbox.run("import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n")
    uid, gid, groups = r.stdout.split(" ", 2)
    assert int(uid) >= 1_600_000_000
    assert uid == gid
    assert groups.strip() == "[]"


def test_the_shim_runs_on_the_oldest_python_a_user_may_give():
    """The shim runs under ``LocalSandbox(python=...)``, which may be older than ours: its syntax
    is 3.8's and its annotations are never evaluated (``int | None`` fails before 3.10)."""
    import ast
    from pathlib import Path

    import telescope_sandbox

    source = (Path(telescope_sandbox.__file__).parent / "_shim.py").read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    futures = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    assert [a.name for n in futures for a in n.names] == ["annotations"]
