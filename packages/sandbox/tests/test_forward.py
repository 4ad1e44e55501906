"""``forward_ports``: a host Unix socket reachable from inside a run, and nothing else.

A host HTTP server on a Unix socket answers a program that connects to ``127.0.0.1:<port>`` in
its own network namespace (bodies larger than the relay's buffers both ways, the exit code and the
files passed through as without forwarding), as root and in a user namespace; no other port or
host service is reachable; concurrent runs each reach only their own socket; a run killed at its
deadline while a connection is open leaves no process; bad requests say what is wrong.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from telescope_sandbox import ExecResult, LocalSandbox, Sandbox, SandboxRequestError
from telescope_sandbox._provider import ExecRequest

CLIENT = r"""
import sys, urllib.request
port = int(sys.argv[1])
size = int(sys.argv[2]) if len(sys.argv) > 2 else 1
body = urllib.request.urlopen(f"http://127.0.0.1:{port}/echo", data=b"x" * size, timeout=10).read()
print(len(body), body[:12].decode())
open("got.txt", "w").write(body[:12].decode())
sys.exit(3)
"""

PROBE = r"""
import socket, sys
for port in map(int, sys.argv[1:]):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        print(port, "open")
    except OSError as exc:
        print(port, "closed", type(exc).__name__)
"""


class _Echo:
    """A bare HTTP server on a Unix socket (the sandbox package depends on no HTTP library): every
    request is answered ``<name>:`` and three times its body's length in bytes, then closed."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            data = await reader.readexactly(length)
            body = self.name.encode() + b":" + b"a" * (3 * len(data))
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
            )
            await writer.drain()
        finally:
            writer.close()


async def _serve(name: str, tmp: Path) -> tuple[asyncio.Server, str]:
    """:class:`_Echo` as ``name`` on a Unix socket under ``tmp``."""
    path = str(tmp / f"{name}.sock")
    server = await asyncio.start_unix_server(_Echo(name), path, limit=1 << 16)
    os.chmod(path, 0o666)  # as root the program is a fresh user
    return server, path


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a Unix socket's path holds at most 107 bytes, and pytest's
    ``tmp_path`` can be longer (a CI machine's temp folder, long test names)."""
    folder = Path(tempfile.mkdtemp(prefix="fwd-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def servers(short_dir: Path) -> AsyncIterator[dict[str, str]]:
    started = [await _serve(name, short_dir) for name in ("one", "two")]
    yield {"one": started[0][1], "two": started[1][1]}
    for server, _ in started:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("user_namespace", [None, True], ids=["default", "user_namespace"])
async def test_a_program_reaches_the_host_socket_through_its_port(
    sandbox: LocalSandbox, servers: dict[str, str], user_namespace: bool | None
):
    box = LocalSandbox(user_namespace=user_namespace)
    size = 3 << 20  # larger than the relay's 1 MiB backlog and the sockets' buffers, both ways
    r = await box.run(
        CLIENT, args=["8000", str(size)], forward_ports={8000: servers["one"]}, files_out=["got.txt"]
    )
    assert (r.exit_code, r.stderr) == (3, "")
    assert r.stdout == f"{3 * size + 4} one:aaaaaaaa\n"
    assert r.files == {"got.txt": b"one:aaaaaaaa"}


async def test_only_the_forwarded_port_is_reachable(sandbox: LocalSandbox, servers: dict[str, str]):
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen()
    host_port = host.getsockname()[1]
    try:
        r = await sandbox.run(
            PROBE, args=["8000", "8001", str(host_port)], forward_ports={8000: servers["one"]}
        )
    finally:
        host.close()
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "8000 open"
    assert lines[1].startswith("8001 closed")
    assert lines[2].startswith(f"{host_port} closed")  # the host's loopback is another namespace's


async def test_concurrent_runs_each_reach_their_own_socket(sandbox: LocalSandbox, servers: dict[str, str]):
    runs = [
        sandbox.run(CLIENT, args=["8000"], forward_ports={8000: servers[name]})
        for name in ("one", "two", "one", "two")
    ]
    results = await asyncio.gather(*runs)
    assert [r.stdout.split()[1][:4] for r in results] == ["one:", "two:", "one:", "two:"]


async def test_a_run_killed_with_a_connection_open_leaves_nothing(sandbox: LocalSandbox, short_dir: Path):
    path = str(short_dir / "hang.sock")
    accepted: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append((reader, writer))  # never answers

    server = await asyncio.start_unix_server(hold, path)
    os.chmod(path, 0o666)
    code = "import socket\ns = socket.create_connection(('127.0.0.1', 8000))\ns.sendall(b'hi')\ns.recv(1)\n"
    try:
        r = await sandbox.run(code, forward_ports={8000: path}, timeout_s=1.0)
        assert r.timed_out
        assert len(accepted) == 1
        # the relay died with the run: the host end of its connection got what was sent, then EOF
        assert await asyncio.wait_for(accepted[0][0].read(), 5.0) == b"hi"
    finally:
        for _, writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_bad_forward_requests_say_what_is_wrong(
    sandbox: LocalSandbox, servers: dict[str, str], tmp_path: Path
):
    plain = tmp_path / "plain.txt"
    plain.write_text("")
    with pytest.raises(SandboxRequestError, match="1024 to 65535"):
        await sandbox.run_command(["true"], forward_ports={80: servers["one"]})
    with pytest.raises(SandboxRequestError, match="is not the path of a Unix socket"):
        await sandbox.run_command(["true"], forward_ports={8000: str(plain)})
    with pytest.raises(SandboxRequestError, match="is not the path of a Unix socket"):
        await sandbox.run_command(["true"], forward_ports={8000: "relative.sock"})
    with pytest.raises(SandboxRequestError, match="isolation='bwrap'"):
        await LocalSandbox(isolation="none").run_command(["true"], forward_ports={8000: servers["one"]})

    class NoForwarding(Sandbox):
        name = "remote-like"

        async def _execute(self, request: ExecRequest) -> ExecResult:  # pragma: no cover
            raise AssertionError("never reached")

    with pytest.raises(SandboxRequestError, match="'remote-like' sandbox cannot reach a host socket"):
        await NoForwarding().run_command(["true"], forward_ports={8000: servers["one"]})


MANY = r"""
import socket, time
held = [socket.create_connection(("127.0.0.1", 8000), timeout=5) for _ in range(20)]
time.sleep(1.0)
for s in held:
    s.close()
s = socket.create_connection(("127.0.0.1", 8000), timeout=5)
s.sendall(b"ping\n")
print(s.makefile().readline().strip())
"""


async def test_connections_past_the_cap_wait_and_the_relay_goes_on(sandbox: LocalSandbox, short_dir: Path):
    """20 connections held open: the host never sees more than ``MAX_PAIRS`` at once (the rest wait
    in the backlog); once they close, the program's next connection is answered."""
    from telescope_sandbox._shim import MAX_PAIRS

    live, peak = [0], [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        live[0] += 1
        peak[0] = max(peak[0], live[0])
        try:
            if await reader.readline() == b"ping\n":
                writer.write(b"pong\n")
                await writer.drain()
            await reader.read()
        finally:
            live[0] -= 1
            writer.close()

    path = str(short_dir / "count.sock")
    server = await asyncio.start_unix_server(handle, path)
    os.chmod(path, 0o666)
    try:
        r = await sandbox.run(MANY, forward_ports={8000: path}, timeout_s=20)
    finally:
        server.close()
        await server.wait_closed()
    assert (r.exit_code, r.stdout, r.stderr) == (0, "pong\n", "")
    assert peak[0] == MAX_PAIRS
