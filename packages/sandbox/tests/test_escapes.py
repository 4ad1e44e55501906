"""Hostile programs stay contained: each test runs one and checks the host is unaffected.

Every test asserts both sides: what the program saw inside (an error) and what the host still
has (a file unwritten, a process alive, a listener never connected to).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from telescope_sandbox import Limits, LocalSandbox


def _code(source: str) -> str:
    return textwrap.dedent(source).strip() + "\n"


def _processes_of(uid: int) -> list[tuple[int, str]]:
    """Host processes running as ``uid`` (a run's user id: none may be left once the run is over),
    as (PID, start of its /proc status) so that a failure shows what is left."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        uid_line = next((line for line in status.splitlines() if line.startswith("Uid:")), "Uid: 0")
        if int(uid_line.split()[1]) == uid:
            pids.append(int(entry.name))
    return [(pid, (Path("/proc") / str(pid) / "status").read_text()[:300]) for pid in pids]


def _host_can_fork() -> bool:
    return subprocess.run(["true"], check=False).returncode == 0


@pytest.mark.slow
async def test_fork_bomb_is_contained(sandbox: LocalSandbox):
    code = _code(
        """
        import os
        print(os.getuid(), flush=True)
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """
    )
    r = await sandbox.run(code, timeout_s=2, limits=Limits(max_processes=32))
    assert r.timed_out
    assert r.killed_by == "timeout"
    assert r.duration_s < 5
    assert _processes_of(int(r.stdout.split()[0])) == []
    assert _host_can_fork()


async def test_shell_fork_bomb_is_contained(sandbox: LocalSandbox):
    r = await sandbox.run("id -u; bomb(){ bomb | bomb & }; bomb; sleep 30", language="bash", timeout_s=1.5)
    assert r.timed_out
    assert r.duration_s < 4
    assert _processes_of(int(r.stdout.split()[0])) == []
    assert _host_can_fork()


async def test_process_count_is_capped(sandbox: LocalSandbox):
    code = _code(
        """
        import os, time
        n = 0
        try:
            while n < 500:
                if os.fork() == 0:
                    time.sleep(5)
                    os._exit(0)
                n += 1
        except OSError:
            pass
        print(n, os.getuid())
        """
    )
    r = await sandbox.run(code, timeout_s=5, limits=Limits(max_processes=10))
    assert r.exit_code == 0, r.stderr
    children, uid = map(int, r.stdout.split())
    assert children == 9  # the program itself is the tenth process
    assert _processes_of(uid) == []


async def test_infinite_loop_times_out(sandbox: LocalSandbox):
    r = await sandbox.run("while True:\n    pass\n", timeout_s=1)
    assert r.timed_out
    assert r.killed_by == "timeout"
    assert r.exit_code == -9
    assert 1 <= r.duration_s < 3
    with pytest.raises(Exception, match="timeout"):
        r.raise_for_limit()


async def test_cpu_limit(sandbox: LocalSandbox):
    r = await sandbox.run("while True:\n    pass\n", timeout_s=5, limits=Limits(cpu_time_s=1))
    assert not r.timed_out
    assert r.killed_by == "cpu"
    assert r.duration_s < 4


async def test_memory_bomb(sandbox: LocalSandbox):
    code = "x = []\nwhile True:\n    x.append(bytearray(10**7))\n"
    r = await sandbox.run(code, memory_mb=128)
    assert r.killed_by == "memory"
    assert r.exit_code == 1
    assert "MemoryError" in r.stderr
    assert r.max_rss_mb is not None
    assert r.max_rss_mb <= 128
    huge = await sandbox.run("b = bytearray(2**34)\n", memory_mb=128)
    assert huge.killed_by == "memory"


async def test_disk_fill(sandbox: LocalSandbox):
    code = _code(
        """
        with open("big", "wb") as f:
            while True:
                f.write(b"x" * (1 << 20))
        """
    )
    r = await sandbox.run(code, limits=Limits(disk_mb=8, max_file_mb=64))
    assert r.killed_by == "disk", r.stderr
    assert "No space left on device" in r.stderr
    many = _code(
        """
        import os
        for d in ("/tmp", "/dev/shm", "."):
            try:
                for i in range(10_000):
                    with open(f"{d}/f{i}", "wb") as f:
                        f.write(b"x" * 65536)
            except OSError as e:
                print(d, e.errno)
        """
    )
    r = await sandbox.run(many, limits=Limits(disk_mb=8))
    assert r.stdout.split() == ["/tmp", "28", "/dev/shm", "28", ".", "28"]  # ENOSPC everywhere


async def test_file_size_limit(sandbox: LocalSandbox):
    r = await sandbox.run("head -c 3000000 /dev/zero > f", language="bash", limits=Limits(max_file_mb=1))
    assert r.killed_by == "disk"


async def test_network_egress_is_blocked(sandbox: LocalSandbox):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    code = _code(
        f"""
        import json, socket
        out = {{}}
        for name, target in [("host_tcp", ("127.0.0.1", {port})), ("internet_tcp", ("1.1.1.1", 80))]:
            try:
                socket.create_connection(target, timeout=2).close()
                out[name] = "connected"
            except OSError as e:
                out[name] = type(e).__name__
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.sendto(b"x", ("8.8.8.8", 53))
            out["udp"] = "sent"
        except OSError as e:
            out["udp"] = type(e).__name__
        try:
            socket.getaddrinfo("example.com", 80)
            out["dns"] = "resolved"
        except OSError as e:
            out["dns"] = type(e).__name__
        print(json.dumps(out))
        """
    )
    try:
        r = await sandbox.run(code, timeout_s=10)
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing ever reached the host's listener
    finally:
        listener.close()
    out = json.loads(r.stdout)
    assert "connected" not in out.values(), out
    assert out["udp"] != "sent", out
    assert out["dns"] != "resolved", out


async def test_host_files_are_invisible(sandbox: LocalSandbox, tmp_path: Path):
    secret = f"secret-{uuid.uuid4()}"
    (tmp_path / "secret.txt").write_text(secret)
    checkout = Path(__file__).resolve()
    targets = [
        "/etc/shadow",
        "/etc/gshadow",
        str(Path.home() / ".bashrc"),
        str(Path.home()),
        "/root",
        "/home",
        str(checkout),
        str(tmp_path / "secret.txt"),
        "/var/log",
        "/run",
    ]
    code = _code(
        f"""
        import os
        for path in {targets!r}:
            try:
                if os.path.isdir(path):
                    print(path, "LISTED", os.listdir(path))
                else:
                    print(path, "READ", open(path).read()[:200])
            except OSError as e:
                print(path, "DENIED", e.errno)
        """
    )
    r = await sandbox.run(code)
    assert r.exit_code == 0, r.stderr
    assert secret not in r.stdout
    assert "READ" not in r.stdout
    # Only the folders bubblewrap makes to mount the Python install under may be listed.
    allowed = set(Path(sandbox.python).parts)
    for line in r.stdout.splitlines():
        assert "DENIED" in line or "LISTED" in line, line
        if "LISTED" in line:
            assert set(eval(line.split("LISTED", 1)[1])) <= allowed, line
    if os.geteuid() == 0 and Path("/etc/shadow").exists():
        first = Path("/etc/shadow").read_text().splitlines()[0]
        assert first not in r.stdout


async def test_writes_outside_workdir_fail(sandbox: LocalSandbox, tmp_path: Path):
    marker = f"telescope-sandbox-test-{uuid.uuid4()}"
    targets = [
        str(tmp_path / "escaped"),
        "/usr/escaped",
        "/etc/escaped",
        "/escaped",
        "/root/escaped",
        "/proc/escaped",
        "/dev/escaped",
        str(Path(__file__).parent / "escaped"),
    ]
    code = _code(
        f"""
        for path in {targets!r}:
            try:
                open(path, "w").write("x")
                print(path, "WROTE")
            except OSError as e:
                print(path, "DENIED", e.errno)
        open("/tmp/{marker}", "w").write("private")
        open("inside.txt", "w").write("ok")
        print(open("/tmp/{marker}").read())
        """
    )
    r = await sandbox.run(code)
    assert r.exit_code == 0, r.stderr
    assert "WROTE" not in r.stdout
    assert r.stdout.strip().endswith("private")
    assert not (tmp_path / "escaped").exists()
    assert not (Path(__file__).parent / "escaped").exists()
    assert not Path(f"/tmp/{marker}").exists()  # the sandbox's /tmp is its own


async def test_host_processes_cannot_be_signalled(sandbox: LocalSandbox):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        code = _code(
            f"""
            import os, signal
            for pid in ({victim.pid}, {os.getpid()}, 1, -1):
                try:
                    os.kill(pid, signal.SIGKILL)
                    print(pid, "SENT")
                except OSError as e:
                    print(pid, "DENIED", e.errno)
            """
        )
        r = await sandbox.run(code)
        time.sleep(0.1)
        assert victim.poll() is None  # still alive
    finally:
        victim.kill()
        victim.wait()
    # kill(-1) reaches only the sandbox's own processes, so it may end the program itself.
    assert f"{victim.pid} SENT" not in r.stdout


async def test_proc_shows_only_the_sandbox(sandbox: LocalSandbox):
    code = _code(
        """
        import os
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
        print("PIDS", len(pids))
        cmdlines = [open(f"/proc/{p}/cmdline", "rb").read() for p in pids]
        print("PYTEST", any(b"pytest" in c for c in cmdlines))
        for path in ("/proc/1/root/etc/hostname", "/proc/1/environ", "/proc/1/root/root"):
            try:
                open(path, "rb").read()
                print(path, "READ")
            except OSError as e:
                print(path, "DENIED", e.errno)
        for path in ("/proc/sys/kernel/hostname", "/proc/sysrq-trigger", "/proc/sys/vm/drop_caches"):
            try:
                open(path, "w").close()  # opening is enough to prove access; nothing is written
                print(path, "WRITABLE")
            except OSError as e:
                print(path, "DENIED", e.errno)
        status = open("/proc/self/status").read()
        print("CAPS", [l.split()[1] for l in status.splitlines() if l.startswith(("CapEff", "CapPrm"))])
        print("NNP", [l.split()[1] for l in status.splitlines() if l.startswith("NoNewPrivs")])
        print("UID", os.getuid())
        """
    )
    r = await sandbox.run(code)
    assert r.exit_code == 0, r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert int(lines["PIDS"]) <= 4  # bubblewrap's init, the helper, the program
    assert lines["PYTEST"] == "False"
    assert "READ" not in r.stdout
    assert "WRITABLE" not in r.stdout
    assert lines["CAPS"] == "['0000000000000000', '0000000000000000']"
    assert lines["NNP"] == "['1']"
    assert int(lines["UID"]) != 0


async def test_megabytes_of_stdout_are_truncated(sandbox: LocalSandbox):
    r = await sandbox.run("import sys\nsys.stdout.write('x' * 5_000_000)\n")
    assert r.exit_code == 0
    assert r.killed_by is None
    assert r.output_truncated
    assert len(r.stdout) == 1 << 20


async def test_endless_stdout_is_killed(sandbox: LocalSandbox):
    r = await sandbox.run("while True:\n    print('y' * 1000)\n", timeout_s=10)
    assert r.killed_by == "output"
    assert not r.timed_out
    assert r.output_truncated
    assert len(r.stdout) == 1 << 20
    assert r.duration_s < 5


async def test_binary_garbage_on_stdout(sandbox: LocalSandbox):
    code = "import os\nos.write(1, bytes(range(256)) * 64)\nos.write(2, b'\\xff\\xfe\\x00')\n"
    r = await sandbox.run(code)
    assert r.exit_code == 0
    assert isinstance(r.stdout, str)
    assert "\ufffd" in r.stdout
    assert "\x00" in r.stdout
    assert r.stderr == "\ufffd\ufffd\x00"


async def test_closed_stdout_still_killed_at_timeout(sandbox: LocalSandbox):
    code = "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)\n"
    r = await sandbox.run(code, timeout_s=1)
    assert r.timed_out
    assert r.duration_s < 3


async def test_background_child_does_not_outlive_the_program(sandbox: LocalSandbox):
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nprint(os.getuid())\n"
    r = await sandbox.run(code, timeout_s=10)
    assert r.exit_code == 0
    assert r.duration_s < 3  # the child held stdout open, but died with the namespace
    assert _processes_of(int(r.stdout)) == []


def test_sandbox_python_is_the_callers(sandbox: LocalSandbox):
    assert os.path.realpath(sandbox.python) == os.path.realpath(sys.executable)
