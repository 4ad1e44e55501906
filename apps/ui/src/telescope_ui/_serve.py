"""``telescope ui``: find the runs, bind the port, print the URL, serve until Ctrl-C.

It listens on 127.0.0.1 unless told otherwise; any other address needs a token (one is made
and printed in the URL when none is given), since the pages show prompts, completions and configs.
"""

from __future__ import annotations

import secrets
import socket
import webbrowser
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["UiError", "bind", "check_roots", "serve"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class UiError(ValueError):
    """The inspector cannot start as asked; the message says how to fix it."""


def check_roots(roots: Sequence[str | Path]) -> list[Path]:
    """The given folders, each existing; a missing one is a :class:`UiError` with the fix."""
    paths = [Path(r).expanduser() for r in roots]
    for path in paths:
        if not path.is_dir():
            raise UiError(
                f"{path} is not a directory: pass a run directory or a folder of runs "
                "(telescope train writes them under ./runs, e.g. telescope ui runs)"
            )
    return paths


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UiError(
            f"cannot listen on {host}:{port} ({exc.strerror}): pick another --port (0: any free one)"
        ) from exc
    sock.listen(128)
    return sock


def serve(
    roots: Sequence[str | Path],
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    open_browser: bool = False,
    say: Callable[[str], None] = print,
) -> None:
    """Serve the inspector over ``roots`` until interrupted (see the module docstring)."""
    import uvicorn

    from telescope_ui._app import LOCAL_HOSTS, create_app

    paths = check_roots(roots)
    if host not in LOOPBACK and not token:
        token = secrets.token_urlsafe(18)
    sock = bind(host, port)
    shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}/" + (f"?token={token}" if token else "")
    say(f"Telescope UI over {', '.join(str(p) for p in paths)}: {url}  (Ctrl-C stops it)")
    if open_browser:
        webbrowser.open(url)
    hosts = LOCAL_HOSTS if host in LOOPBACK else ("*",)
    config = uvicorn.Config(
        create_app(paths, token=token, hosts=hosts), log_level="warning", access_log=False
    )
    uvicorn.Server(config).run(sockets=[sock])
