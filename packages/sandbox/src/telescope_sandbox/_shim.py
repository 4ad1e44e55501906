"""The helper that runs first inside the sandbox: writes files, drops privileges, sets rlimits, execs.

This file is not imported inside the sandbox: the host passes its source text to
``python -S -I -c`` (stdlib only, no site, no environment), with two file descriptors as
arguments:

* ``spec_fd``: a line with the length of the run's spec, the spec as a ``marshal`` dump
  (format 4), then the raw bytes of the input files;
* ``status_fd``: where the helper reports back. It first writes ``S`` (so the host knows the
  sandbox was set up; a run without it failed in bubblewrap's setup). After the program exits
  it writes one ASCII line ``<wait status> <cpu seconds> <peak RSS KiB>``, one line per output
  file with its size (``-1``: not read), then the files' bytes. Plain text on purpose: the
  host parses it with ``int`` and ``float`` only, never an unpickler.

Only modules built into the interpreter are imported (``marshal``, ``_signal``, ``resource``):
``json`` or ``signal`` would add 5 to 15 ms to every run.

It forks: the child drops to the run's user id, writes the input files, sets the rlimits,
restores the signal dispositions Python changed (SIGPIPE, SIGXFSZ) and execs the program; the
parent drops to the same user id, waits with ``wait4`` (exact exit status and the tree's CPU time
and peak memory), reads the output files (regular files only, at most ``max_file_out`` bytes
each) and exits with the program's status.

With ``forward`` pairs ``[port, socket path]`` the parent first listens on ``127.0.0.1:port`` (the
run's own loopback, before the program starts, so its first connection finds it) and, while the
program runs, relays each connection to the Unix socket bound in at that path (``socket`` and
``selectors`` are imported for that only), in this one thread: a thread or a process more would
count against the run's ``RLIMIT_NPROC``. At most ``MAX_PAIRS`` connections are relayed at once.
"""

from __future__ import annotations  # the annotations below are not evaluated: the user's Python may be older

import marshal
import os
import resource
import stat
import sys

# ``typing`` is not imported at run time (it would slow every run down): what follows exists for
# the type checker only, which treats any ``TYPE_CHECKING`` as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal  # ``_signal`` (built into CPython) has no stub; ``signal`` wraps it
    from typing import Any, TypedDict

    class _Spec(TypedDict):
        """The run's spec, as ``_local`` builds it (after a ``marshal`` round trip)."""

        workdir: str
        uid: int | None
        gid: int | None
        rlimits: list[tuple[str, int, int]]
        argv: list[str]
        env: dict[str, str]
        files: list[tuple[str, int, int]]  # ``[path, offset, size]`` lists on the wire
        files_out: list[str]
        max_file_out: int
        forward: list[tuple[int, str]]  # ``[port, path]`` lists on the wire

else:
    import _signal


def _drop_privileges(uid: int | None, gid: int | None) -> None:
    if uid is None:
        return
    os.setgroups([])
    # The host sets gid with uid (both None or both ints); no ``typing.cast`` here (see above).
    os.setresgid(gid, gid, gid)  # pyright: ignore[reportArgumentType]
    os.setresuid(uid, uid, uid)


def _child(spec: _Spec, blob: memoryview) -> None:
    _drop_privileges(spec["uid"], spec["gid"])
    os.umask(0o022)
    os.chdir(spec["workdir"])
    for path, offset, size in spec["files"]:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as f:
            f.write(blob[offset : offset + size])
    del blob
    for name, soft, hard in spec["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):
        _signal.signal(sig, _signal.SIG_DFL)
    argv = spec["argv"]
    try:
        os.execvpe(argv[0], argv, spec["env"])
    except OSError as exc:
        os.write(2, f"telescope-sandbox: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


def _read_out(path: str, limit: int) -> bytes | None:
    """Content of a regular file, at most ``limit`` bytes; None for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        size = 0
        while size < limit:
            chunk = os.read(fd, min(1 << 20, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _listen(forward: list[tuple[int, str]]) -> list[tuple[Any, str]]:
    """A listening socket on ``127.0.0.1:port`` per forward pair (not inherited by the program)."""
    if not forward:
        return []
    import socket

    out: list[tuple[Any, str]] = []
    for port, path in forward:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(64)
        sock.setblocking(False)
        out.append((sock, path))
    return out


class _End:
    """One socket of a relayed connection: what is waiting to be written to it, whether it has
    sent its last byte, and the end it is paired with."""

    def __init__(self, sock: object) -> None:
        self.sock: Any = sock
        self.peer: _End = self
        self.out = bytearray()
        self.eof = False  # it sent its last byte
        self.shut = False  # and that was passed on (its peer's writing side shut)
        self.events = 0
        self.closed = False  # its pair was dropped (a later event of the same select is stale)


def _wants(end: _End) -> int:
    """Reading while the peer's backlog is small, writing while this end's is not empty."""
    return (1 if not end.eof and len(end.peer.out) < 1 << 20 else 0) | (2 if end.out else 0)


def _update(sel: Any, end: _End) -> None:
    events = _wants(end)
    if events != end.events:
        if end.events and events:
            sel.modify(end.sock, events, end)
        elif events:
            sel.register(end.sock, events, end)
        else:
            sel.unregister(end.sock)
        end.events = events


MAX_PAIRS = 16
"""Connections relayed at once: past them the listeners wait (each pair holds a descriptor of the
host's service, which the program must not exhaust)."""
_open = [0]  # pairs open now
_waiting: list[tuple[Any, str]] = []  # listeners taken off the selector while MAX_PAIRS are open


def _drop(sel: Any, end: _End) -> None:
    if end.closed:
        return
    for e in (end, end.peer):
        e.closed = True
        if e.events:
            sel.unregister(e.sock)
            e.events = 0
        e.sock.close()
    _open[0] -= 1
    while _waiting:
        listener, path = _waiting.pop()
        sel.register(listener, 1, path)


def _service(sel: Any, end: _End, events: int) -> None:
    """Move bytes for one ready socket; a closed or failed connection is dropped whole."""
    import socket

    if end.closed:
        return
    try:
        if events & 1:
            data = end.sock.recv(1 << 16)
            if data:
                end.peer.out += data
            else:
                end.eof = True
        if events & 2 and end.out:
            del end.out[: end.sock.send(end.out)]
        for e in (end, end.peer):
            if e.peer.eof and not e.out and not e.peer.shut:
                e.peer.shut = True
                e.sock.shutdown(socket.SHUT_WR)
    except BlockingIOError:
        pass
    except OSError:
        return _drop(sel, end)
    if end.eof and end.peer.eof and not end.out and not end.peer.out:
        return _drop(sel, end)
    _update(sel, end)
    _update(sel, end.peer)


def _accept(sel: Any, listener: Any, path: str) -> None:
    """Pair a new connection with one to the host's socket (never blocking: a host service that
    is full refuses the connection); at ``MAX_PAIRS`` (or out of descriptors) stop accepting until
    a pair ends."""
    import socket

    try:
        client, _ = listener.accept()
    except BlockingIOError:
        return
    except OSError:  # out of descriptors: wait for a pair to end rather than spin
        client = None
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) if client is not None else None
    if client is not None and upstream is not None:
        upstream.setblocking(False)
        if upstream.connect_ex(path) == 0:
            a, b = _End(client), _End(upstream)
            a.peer, b.peer = b, a
            for end in (a, b):
                end.sock.setblocking(False)
                _update(sel, end)
            _open[0] += 1
        else:
            upstream.close()
            client.close()
    if client is None or _open[0] >= MAX_PAIRS:
        for key in list(sel.get_map().values()):
            if isinstance(key.data, str):
                sel.unregister(key.fileobj)
                _waiting.append((key.fileobj, key.data))


def _relay(listeners: list[tuple[Any, str]], pid: int) -> None:
    """Relay connections until the program exits (module docstring)."""
    import selectors

    sel = selectors.DefaultSelector()
    for listener, path in listeners:
        sel.register(listener, selectors.EVENT_READ, path)
    # The program's end wakes the loop through a pidfd (Python >= 3.9), else a look every 0.1 s
    # that leaves its status to ``wait4``.
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # Python < 3.9, a kernel < 5.3, or a seccomp filter
        pidfd = None
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ, None)
    while True:
        for key, events in sel.select(None if pidfd is not None else 0.1):
            if key.data is None:
                os.close(pidfd)  # pyright: ignore[reportArgumentType]
                return
            if isinstance(key.data, str):
                _accept(sel, key.fileobj, key.data)
            else:
                _service(sel, key.data, events)
        if pidfd is None and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return


def main() -> None:
    spec_fd, status_fd = int(sys.argv[1]), int(sys.argv[2])
    os.write(status_fd, b"S")
    with os.fdopen(spec_fd, "rb") as f:
        data = f.read()
    head, _, rest = data.partition(b"\n")
    size = int(head)
    spec: _Spec = marshal.loads(rest[:size])
    blob = memoryview(rest)[size:]
    os.set_inheritable(status_fd, False)
    listeners = _listen(spec.get("forward") or [])
    pid = os.fork()
    if pid == 0:
        try:
            _child(spec, blob)
        except BaseException as exc:
            os.write(2, f"telescope-sandbox: setup failed: {exc!r}\n".encode())
        os._exit(126)
    del blob, rest, data
    _drop_privileges(spec["uid"], spec["gid"])
    if listeners:
        _relay(listeners, pid)
    _, status, usage = os.wait4(pid, 0)
    os.chdir(spec["workdir"])
    outputs = [_read_out(path, spec["max_file_out"]) for path in spec["files_out"]]
    lines = [f"{status} {usage.ru_utime + usage.ru_stime} {usage.ru_maxrss}"]
    lines += [str(-1 if out is None else len(out)) for out in outputs]
    try:
        with os.fdopen(status_fd, "wb") as report:
            report.write("\n".join(lines).encode() + b"\n")
            for out in outputs:
                if out is not None:
                    report.write(out)
    except OSError:
        pass  # the host stopped listening (it killed the run); nothing to report to
    code = os.waitstatus_to_exitcode(status)
    os._exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    main()
