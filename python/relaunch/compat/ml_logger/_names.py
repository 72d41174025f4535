"""Names: ml-logger's prefixes as relaunch run ids and projects, file keys as
a run's file names, and globbing over those names. A prefix is a path from
the root, as on ml-logger's server: a leading ``/`` starts from the root
(``/x`` is ``x``) and ``..`` goes up; what would leave the root (``..`` above
it, ``//`` for the host's file system) is refused. File keys stay below their
run (no ``..``, no leading ``/``)."""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from collections.abc import Sequence
from datetime import datetime, timezone

from relaunch.errors import TrackingConfigError

USER = os.environ.get("ML_LOGGER_USER") or os.environ.get("USER")
LOGGER_USER = USER
ROOT = os.environ.get("ML_LOGGER_ROOT") or None
PREFIX = os.environ.get("ML_LOGGER_PREFIX") or "{USER}/scratch/{now:%Y/%m-%d/%H%M%S}"

_PLAIN_PART = re.compile(r"[A-Za-z0-9_-]+")
_NOT_NAME = re.compile(r"[^A-Za-z0-9._-]+")
_FILE_PART = re.compile(r"[A-Za-z0-9._+=@-]+")
_MAX_NAME = 128
_MAX_FILE_NAME = 1024


def now(fmt: str | None = None) -> datetime | str:
    """The local time, tz-aware; a ``strftime`` string when ``fmt`` is given."""
    t = datetime.now().astimezone()
    return t.strftime(fmt) if fmt else t


def utcnow(fmt: str | None = None) -> datetime | str:
    """The UTC time, naive as in ml-logger; a ``strftime`` string when ``fmt`` is given."""
    t = datetime.now(timezone.utc).replace(tzinfo=None)
    return t.strftime(fmt) if fmt else t


def pJoin(*parts: str | None) -> str | None:
    """``os.path.join`` of the truthy parts; None when there are none."""
    kept = [p for p in parts if p]
    return os.path.join(*kept) if kept else None


def _interpolate(part: object, what: str) -> str:
    if isinstance(part, os.PathLike):
        part = os.fspath(part)
    if not isinstance(part, str):
        raise TypeError(f"{what} parts must be str, not {type(part).__name__}: {part!r}")
    if part.startswith("$"):
        value = os.environ.get(part[1:])
        if not value:
            raise TrackingConfigError(
                f"{what} part {part!r} names the environment variable {part[1:]}, which is "
                "not set; set it or write the part out"
            )
        return value
    return part


def _format(prefix: str) -> str:
    try:
        return prefix.format(USER=USER, now=datetime.now())
    except (KeyError, IndexError, ValueError, AttributeError) as e:
        raise TrackingConfigError(
            f"prefix {prefix!r} cannot be formatted ({type(e).__name__}: {e}); only {{USER}} "
            "and {now:...} are filled in, so write a literal brace twice"
        ) from None


def _parts(path: str, what: str, *, absolute_ok: bool = False) -> tuple[bool, list[str]]:
    """``path``'s parts, refusing what ml-logger let escape its root."""
    if path.startswith("//"):
        raise TrackingConfigError(
            f"{what} {path!r} starts with '//', which ml-logger resolved on the host's file "
            "system; relaunch keeps everything on its server: drop the slashes"
        )
    absolute = path.startswith("/")
    if absolute and not absolute_ok:
        raise TrackingConfigError(
            f"{what} {path!r} is absolute; ml-logger wrote it outside its root (with a server, "
            "on the server's disk), relaunch names runs and files relative to the server: drop "
            "the leading '/' (e.g. 'alice/demo/run-1'), or write file://"
            f"{path if path.startswith('/') else '/' + path} for a file on this machine"
        )
    parts = [p for p in path.split("/") if p not in ("", ".")]
    for p in parts:
        if p == "..":
            raise TrackingConfigError(
                f"{what} {path!r} has a '..' part, which ml-logger let escape its root; "
                "relaunch refuses it: name the path from the run down"
            )
        if any(ord(c) < 32 or c in "\x7f\\" for c in p):
            raise TrackingConfigError(
                f"{what} {path!r} holds a control character or a backslash; use plain text"
            )
    return absolute, parts


def _join(parts: Sequence[str]) -> str:
    """The parts of a prefix joined as ``os.path.join`` joins them (as ml-logger
    did): a part starting with ``/`` starts again from the root."""
    return posixpath.join(*parts) if parts else ""


def _prefix_parts(path: str, base: Sequence[str] = (), what: str = "prefix") -> list[str]:
    """``path`` resolved below ``base`` (both from the root) as a path is
    resolved: a leading ``/`` starts from the root, ``.`` stays, ``..`` goes
    up. Refuses ``//`` and a ``..`` above the root."""
    if path.startswith("//"):
        raise TrackingConfigError(
            f"{what} {path!r} starts with '//', which ml-logger resolved on the host's file "
            "system; relaunch keeps everything on its server: drop the slashes"
        )
    parts = [] if path.startswith("/") else list(base)
    for p in path.split("/"):
        if p in ("", "."):
            continue
        if p == "..":
            if not parts:
                start = "/".join(base) if base and not path.startswith("/") else ""
                where = f" from {start!r}" if start else ""
                raise TrackingConfigError(
                    f"{what} {path!r}{where} goes above the root with '..'; ml-logger let that "
                    "escape its root, relaunch names runs from the root down: drop a '..'"
                )
            parts.pop()
            continue
        if any(ord(c) < 32 or c in "\x7f\\" for c in p):
            raise TrackingConfigError(
                f"{what} {path!r} holds a control character or a backslash; use plain text"
            )
        parts.append(p)
    return parts


def _slug(text: str) -> str:
    return _NOT_NAME.sub("-", text).strip(".-")


def run_ids(prefix: str) -> tuple[str | None, str]:
    """The relaunch (project, run id) that an ml-logger prefix maps to (see the package doc)."""
    parts = _prefix_parts(prefix)
    if not parts:
        raise TrackingConfigError("the prefix is empty; give one such as 'alice/demo/run-1'")
    joined = "/".join(parts)
    if all(_PLAIN_PART.fullmatch(p) for p in parts) and len(joined) <= _MAX_NAME:
        run_id = ".".join(parts)
    else:
        digest = hashlib.sha256(joined.encode()).hexdigest()[:10]
        readable = _slug(".".join(parts))[-(_MAX_NAME - 11) :].lstrip(".-")
        run_id = f"{readable}-{digest}" if readable else digest
    head = parts[:2] if len(parts) >= 3 else parts[:1] if len(parts) == 2 else []
    project = _slug(".".join(head))[:_MAX_NAME].rstrip(".-") or None
    return project, run_id


def _file_name(parts: list[str], shown: str) -> str:
    for p in parts:
        if not _FILE_PART.fullmatch(p):
            raise TrackingConfigError(
                f"file name {shown!r}: part {p!r} is not allowed; relaunch file names are "
                "'/'-separated parts of letters, digits, '-', '_', '.', '+', '=', '@'"
            )
    name = "/".join(parts)
    if not name:
        raise TrackingConfigError("give a file name, e.g. 'checkpoints/net.pt'")
    if len(name) > _MAX_FILE_NAME:
        raise TrackingConfigError(f"file name {name[:80]!r}... is over {_MAX_FILE_NAME} bytes")
    return name


def _key(keys: tuple[object, ...], path: object = None) -> str:
    parts = []
    for k in (*keys, path):
        if k is None or k == "":
            continue
        if isinstance(k, os.PathLike):
            k = os.fspath(k)
        if not isinstance(k, str):
            raise TypeError(f"file keys must be str, not {type(k).__name__}: {k!r}")
        parts.append(k)
    if not parts:
        raise TrackingConfigError("give a file name, e.g. 'checkpoints/net.pt'")
    return "/".join(parts)


def _remote_scheme(key: str) -> None:
    if key.startswith(("s3://", "gs://")):
        raise NotImplementedError(
            f"{key!r}: relaunch's ml-logger shim does not write to S3 or GCS itself; save to the "
            "run (a relative name) and let the server keep it (relaunch server --blobs s3://...), "
            "or use boto3 / google-cloud-storage directly"
        )


def _local_path(key: str) -> str | None:
    if key.startswith("file://"):
        path = key[len("file://") :]
        if not os.path.isabs(path):
            raise TrackingConfigError(f"{key!r}: a file:// path must be absolute (file:///tmp/x)")
        return path
    return None


def _glob_regex(query: str, recursive: bool) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(query):
        c = query[i]
        if query.startswith("**", i) and recursive:
            if query.startswith("**/", i):
                out.append("(?:[^/]+/)*")
                i += 3
            else:
                out.append(".*")
                i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and "]" in query[i + 2 :]:
            end = query.index("]", i + 2)  # a "]" right after "[" is a member
            body = query[i + 1 : end].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out))


def _file_scope(file: str | None) -> list[str]:
    """Key parts for rows flushed into ``file`` (none for ``metrics.pkl``)."""
    if not file:
        return []
    _, parts = _parts(file, "metrics file")
    if parts:
        parts[-1] = parts[-1].split(".", 1)[0]
        if parts[-1] == "metrics":
            parts.pop()
    return parts
