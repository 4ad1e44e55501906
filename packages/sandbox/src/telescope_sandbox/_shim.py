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
    from typing import TypedDict

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
    pid = os.fork()
    if pid == 0:
        try:
            _child(spec, blob)
        except BaseException as exc:
            os.write(2, f"telescope-sandbox: setup failed: {exc!r}\n".encode())
        os._exit(126)
    del blob, rest, data
    _drop_privileges(spec["uid"], spec["gid"])
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
