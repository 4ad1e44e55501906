"""Bubblewrap: finding it, what it supports, and the command line that builds a sandbox.

The sandbox's root is an empty tmpfs (made read-only at the end) into which only what programs
need is bound read-only: ``/usr`` (and the ``/bin``, ``/lib*``, ``/sbin`` links or folders), a
short allowlist from ``/etc`` (the dynamic loader's cache and config, CA certificates,
``alternatives``, ``localtime``), and the Python install when it lives outside ``/usr``. So
``/root``, ``/home``, ``/etc/shadow``, ``/var``, ``/run``, the project checkout and the caller's
temp files simply do not exist inside. Writable: the work directory, ``/tmp`` and ``/dev/shm``,
each a tmpfs capped at ``disk_mb``.

Namespaces: new PID, IPC, UTS, network (only a loopback interface: no route anywhere, no DNS),
mount and, where the kernel allows, cgroup. ``--die-with-parent`` and the PID namespace mean the
whole tree dies with bubblewrap.

Who the program runs as:

* **As root** (CI, containers): bubblewrap runs privileged, keeps only CAP_SETUID and CAP_SETGID
  for the helper, which switches to a user id of its own (``UidAllocator``: ids nobody on the
  host has, one per concurrent run) before running the program; the switch clears every
  capability, and ``no_new_privs`` keeps them from coming back. The program is thus an
  ordinary, unprivileged user *on the host*, not only inside a namespace, and ``RLIMIT_NPROC``
  counts exactly that run's processes (the kernel does not apply ``RLIMIT_NPROC`` to root).
* **As a normal user**: bubblewrap makes a user namespace (``--unshare-user --disable-userns``);
  the program is uid 1000 inside, the caller outside. ``RLIMIT_NPROC`` is set inside the
  namespace, where the kernel counts only that namespace's processes.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import subprocess
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import structlog

from telescope_sandbox._errors import SandboxUnavailableError

__all__ = [
    "FORWARD_DIR",
    "INSTALL_HINT",
    "UidAllocator",
    "bwrap_features",
    "find_bwrap",
    "forward_binds",
    "root_args",
]

INSTALL_HINT = (
    "install bubblewrap: `apt-get install bubblewrap` (Debian/Ubuntu), `dnf install bubblewrap` "
    "(Fedora/RHEL), `pacman -S bubblewrap` (Arch), `apk add bubblewrap` (Alpine); or pass "
    "LocalSandbox(bwrap=...) with its path"
)

USERNS_HINT = (
    "bubblewrap could not create its namespaces. As a normal user this needs unprivileged user "
    "namespaces: `sysctl kernel.unprivileged_userns_clone=1` (Debian), and on Ubuntu >= 23.10 "
    "`sysctl kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile for bwrap; "
    "inside Docker, run with `--security-opt seccomp=unconfined --cap-add SYS_ADMIN` or use a "
    "remote provider"
)

_ETC_ALLOWLIST = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl/certs",
    "ca-certificates.conf",
    "pki/tls/certs",
    "localtime",
)
_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")

_log = structlog.get_logger()


def find_bwrap(path: str | None = None) -> str:
    """The bubblewrap executable to use, or ``SandboxUnavailableError`` saying how to install it."""
    found = shutil.which(path or "bwrap")
    if found is None:
        where = f"{path!r} is not an executable" if path else "bubblewrap (bwrap) is not on PATH"
        raise SandboxUnavailableError(f"{where}; {INSTALL_HINT}")
    return found


@functools.cache
def bwrap_features(bwrap: str) -> frozenset[str]:
    """The options this bubblewrap build lists in ``--help`` (``--size`` needs >= 0.7)."""
    try:
        out = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailableError(f"cannot run {bwrap} --help: {exc}; {INSTALL_HINT}") from exc
    text = out.stdout + out.stderr
    return frozenset(word for word in text.split() if word.startswith("--"))


class UidAllocator:
    """Hands out host user ids that no account uses, one per concurrent run.

    Ids come from ``[base, base + span)``, starting at a random offset per process so that two
    processes on one host rarely pick the same id; an id in use by this process is skipped.
    """

    def __init__(self, base: int = 1_600_000_000, span: int = 1_000_000) -> None:
        self._base, self._span = base, span
        self._next = random.randrange(span)
        self._in_use: set[int] = set()
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            for _ in range(self._span):
                uid = self._base + self._next
                self._next = (self._next + 1) % self._span
                if uid not in self._in_use:
                    self._in_use.add(uid)
                    return uid
        raise SandboxUnavailableError("no free sandbox user id")  # pragma: no cover

    def release(self, uid: int) -> None:
        with self._lock:
            self._in_use.discard(uid)


def _ancestors(path: str) -> list[str]:
    """``/a/b/c`` -> ``["/a", "/a/b"]``: folders to create (mode 0755) before binding ``path``."""
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _bind_tree(paths: Iterable[str], made: set[str]) -> list[str]:
    args: list[str] = []
    for path in paths:
        for folder in _ancestors(path):
            if folder not in made:
                made.add(folder)
                args += ["--perms", "0755", "--dir", folder]
        args += ["--ro-bind", path, path]
    return args


def root_args(
    *,
    bwrap: str,
    privileged: bool,
    extra_ro: Sequence[str],
    workdir: str,
    sandbox_uid: int,
) -> tuple[list[str], bool]:
    """The part of the bubblewrap command line that is the same for every run.

    Returns the arguments and whether tmpfs sizes are supported (``--size``). The per-run tail
    (tmpfs sizes, the helper) is added by the caller; ``{size}`` placeholders mark where, and
    ``{binds}`` where the run's own mounts go (``forward_binds``).
    """
    features = bwrap_features(bwrap)
    args = [
        bwrap,
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        "--clearenv",
    ]
    if privileged:
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user", "--uid", str(sandbox_uid), "--gid", str(sandbox_uid)]
        if "--disable-userns" in features:
            args.append("--disable-userns")
    args += ["--ro-bind", "/usr", "/usr"]
    for name in _TOP_LEVEL:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    made = {"/etc"}
    args += ["--perms", "0755", "--dir", "/etc"]
    etc = [f"/etc/{name}" for name in _ETC_ALLOWLIST if os.path.lexists(f"/etc/{name}")]
    args += _bind_tree(etc, made)
    outside_usr = sorted({p for p in extra_ro if not (p == "/usr" or p.startswith("/usr/"))})
    args += _bind_tree(outside_usr, made)
    args += ["--proc", "/proc", "--dev", "/dev"]
    sized = "--size" in features
    if not sized:
        _log.warning(
            "sandbox_disk_limit_unenforced",
            reason=f"{bwrap} has no --size (bubblewrap < 0.7); tmpfs sizes are not capped",
        )
    args += _tmpfs_args(workdir, privileged=privileged, sized=sized)
    args += ["{binds}", "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", workdir]
    return args, sized


def _tmpfs_args(workdir: str, *, privileged: bool, sized: bool) -> list[str]:
    """The writable folders: ``/dev/shm``, ``/tmp`` and the work directory, each a tmpfs."""
    args: list[str] = []
    for mount, perms in (("/dev/shm", "1777"), ("/tmp", "1777"), (workdir, "0777" if privileged else "0755")):
        args += ["--perms", perms]
        if sized:
            args += ["--size", "{size}"]
        args += ["--tmpfs", mount]
    return args


FORWARD_DIR = "/run/telescope"
"""Where a run's forwarded host sockets appear inside: ``port-<port>.sock``."""


def forward_binds(forward_ports: dict[int, str]) -> tuple[list[str], list[list[Any]]]:
    """A run's ``forward_ports`` as bubblewrap mounts (each host socket at ``FORWARD_DIR``) and as
    the helper's ``[port, socket path inside]`` pairs."""
    if not forward_ports:
        return [], []
    args = ["--perms", "0755", "--dir", "/run", "--perms", "0755", "--dir", FORWARD_DIR]
    pairs: list[list[Any]] = []
    for port, host in sorted(forward_ports.items()):
        inside = f"{FORWARD_DIR}/port-{port}.sock"
        args += ["--bind", host, inside]
        pairs.append([port, inside])
    return args, pairs
