"""A run's files on the tracking server: upload and download.

Files travel as content-defined chunks named by their BLAKE3 hash: an upload
sends only the chunks the server lacks (an interrupted upload resumes; a
checkpoint that changed little sends little), and a download is checked
against the file's hash before it replaces its destination. Proxies come
from ``https_proxy`` / ``http_proxy`` / ``no_proxy``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from relaunch import _native
from relaunch.errors import TrackingConfigError

__all__ = ["Downloaded", "Uploaded", "download", "upload_file"]


@dataclass(frozen=True)
class Uploaded:
    """What :func:`upload_file` did."""

    name: str
    size: int
    blake3: str
    chunks: int
    sent_chunks: int
    """Chunks sent; the server had the others."""
    sent_bytes: int


@dataclass(frozen=True)
class Downloaded:
    """What :func:`download` did."""

    path: Path
    size: int
    blake3: str
    resumed_from: int
    """Bytes an earlier, interrupted download had already fetched."""


def _server(server: str | None, token: str | None) -> tuple[str, str | None]:
    server = server or os.environ.get("RELAUNCH_SERVER")
    if not server:
        raise TrackingConfigError("no tracking server: pass server=URL or set RELAUNCH_SERVER")
    return server, token if token is not None else os.environ.get("RELAUNCH_SERVER_TOKEN")


def _run(run: object) -> str:
    run_id = getattr(run, "id", run)
    if not isinstance(run_id, str):
        raise TypeError(f"run must be a run id (str) or a relaunch.Run, not {type(run).__name__}")
    return run_id


def upload_file(
    path: str | os.PathLike[str],
    run: object,
    name: str | None = None,
    *,
    server: str | None = None,
    token: str | None = None,
) -> Uploaded:
    """Uploads the file at ``path`` to ``run`` (an id or a :class:`relaunch.Run`)
    as ``name`` (default: the file's name); returns once the server has
    committed it. Call it again after an interruption: it sends only what is
    still missing. Raises :class:`relaunch.TrackingError` subclasses."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not a file; upload_file uploads one file")
    server, token = _server(server or getattr(run, "server", None), token)
    name = path.name if name is None else name
    done = _native.upload_file(server, token, _run(run), os.fspath(path), name)
    return Uploaded(**done)


def download(
    run: object,
    name: str,
    dest: str | os.PathLike[str] | None = None,
    *,
    server: str | None = None,
    token: str | None = None,
) -> Downloaded:
    """Downloads file ``name`` of ``run`` to ``dest`` (default: the name's last
    part, here; a directory: into it). The bytes go to ``DEST.relaunch-part``
    and replace ``dest`` only once their BLAKE3 matches the server's; an
    interrupted download resumes from that partial file."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    target = Path(dest) if dest is not None else Path(name.rsplit("/", 1)[-1])
    if target.is_dir():
        target = target / name.rsplit("/", 1)[-1]
    server, token = _server(server or getattr(run, "server", None), token)
    got = _native.download_file(server, token, _run(run), name, os.fspath(target))
    return Downloaded(path=target, **got)
