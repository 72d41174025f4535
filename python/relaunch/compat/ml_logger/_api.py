"""The server: where the logger's runs live (``root=``, ``RELAUNCH_SERVER``,
``ML_LOGGER_ROOT``: a relaunch server, or a local directory that ``_local``
serves), with what token and timeout, and the few ``/api/v1`` calls the
Python API has no function for (read a run, list its files, save its
config: ``_native.ServerApi``, relaunch's client too; delete a file).
Metrics and files go through relaunch's ``Run`` and file calls.

Both follow relaunch's client (``crates/relaunch-client/src/http.rs``): the
token is ``access_token=``, else ``RELAUNCH_SERVER_TOKEN``, sent as
``Authorization: Bearer TOKEN`` (what the server's ``--token`` asks for);
the server may be several replicas, ``http://a:8765,http://b:8765``, read
by the client's own ``server_list``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from relaunch import _native
from relaunch.errors import (
    TrackingConfigError,
    TrackingConnectionError,
    TrackingRejectedError,
    TrackingTimeoutError,
)

from ._names import _interpolate

TIMEOUT_ENV = "RELAUNCH_ML_LOGGER_TIMEOUT"
"""Seconds a blocking call (params, uploads, reads, ``Sync``, ``job_completed``) waits."""
DEFAULT_TIMEOUT = 60.0
SERVER_ENV = "RELAUNCH_SERVER"
"""The server, or several replicas of it separated by commas (as relaunch's client reads it)."""
TOKEN_ENV = "RELAUNCH_SERVER_TOKEN"
"""The server's token (its ``--token``), when ``access_token=`` does not give one."""

# One client per server list and token, shared by every logger: after a
# replica stops answering, later calls start at the one that answered
# instead of waiting on the dead one each time.
_clients: dict[tuple[str, str | None], _native.ServerApi] = {}


def _server_list(server: str) -> list[str]:
    """Each server of a comma-separated list as relaunch's client reads it
    (the same rules and messages: it is the client's own function)."""
    return _native.server_list(server)


def _token(token: str | None) -> str | None:
    """``token``, else ``RELAUNCH_SERVER_TOKEN``; empty means none (as in relaunch's client)."""
    if token is None:
        token = os.environ.get(TOKEN_ENV, "")
        token = token if token.strip() else None
    return token or None


def _dashboard_base(server: str) -> str:
    """The replica in use (the first until one fails to answer), for links."""
    key = ",".join(_server_list(server))
    for (listed, _), client in _clients.items():
        if listed == key:
            return client.url
    return key.split(",")[0]


class _Api:
    """``/api/v1`` of the relaunch server (one or several replicas), through
    relaunch's client: a replica that does not answer (refused, reset, timed
    out) or answers 502/503/504 moves every logger on to the next, each
    replica once. Every call here can be repeated safely (reads, and a PATCH
    that sets the whole config)."""

    def __init__(self, server: str, token: str | None, timeout: float) -> None:
        self.token = _token(token)
        key = (",".join(_server_list(server)), self.token)
        if key not in _clients:
            _clients[key] = _native.ServerApi(key[0], self.token)
        self.client = _clients[key]
        self.servers = key[0]
        self.timeout = timeout

    def _answer(self, call: Callable[..., tuple[int, str]], *args: object) -> tuple[int, object]:
        try:
            status, body = call(*args, self.timeout)
        except TrackingTimeoutError as e:
            raise TrackingTimeoutError(
                f"{e}; raise {TIMEOUT_ENV} or logger.timeout if it is just slow"
            ) from None
        except TrackingConnectionError as e:
            raise TrackingConnectionError(
                f"{e}; is `relaunch server` running there, and is {SERVER_ENV} (or root=) "
                "its address?"
            ) from None
        return status, (json.loads(body) if status < 300 else {"error": body})

    def expect(self, status: int, answer: object, what: str) -> object:
        if 200 <= status < 300:
            return answer
        error = answer.get("error") if isinstance(answer, dict) else None
        if status in (401, 403) and not self.token:
            raise TrackingRejectedError(
                f"{what}: the server needs a token and none was sent ({error}); set "
                f"{TOKEN_ENV} to the server's --token, or pass access_token= to configure()"
            )
        if status in (401, 403):
            raise TrackingRejectedError(
                f"{what}: the server refused the token ({error}); {TOKEN_ENV} (or "
                "access_token=) must be the server's --token"
            )
        raise TrackingRejectedError(f"{what}: the server answered {status}: {error or answer}")

    def run(self, run_id: str) -> dict | None:
        status, answer = self._answer(self.client.run, run_id)
        if status == 404:
            return None
        return self.expect(status, answer, f"reading run {run_id}")  # type: ignore[return-value]

    def files(self, run_id: str) -> list[dict] | None:
        status, answer = self._answer(self.client.files, run_id)
        if status == 404:
            return None
        return self.expect(status, answer, f"listing the files of run {run_id}")  # type: ignore[return-value]

    def delete_file(self, run_id: str, name: str) -> dict | None:
        """``DELETE /runs/{run}/files/{name}``: what the file was, None when the
        run has no such file. Tries the replica in use, then the others."""
        path = f"/api/v1/runs/{urllib.parse.quote(run_id, safe='')}/files/"
        path += urllib.parse.quote(name, safe="/")
        first = self.client.url
        servers = [first, *(u for u in _server_list(self.servers) if u != first)]
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        for i, base in enumerate(servers):
            request = urllib.request.Request(base + path, method="DELETE", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                    return json.loads(answer.read() or b"{}")
            except urllib.error.HTTPError as e:
                body = e.read().decode("utf-8", "replace")
                if e.code == 404:
                    return None
                if e.code in (502, 503, 504) and i + 1 < len(servers):
                    continue
                self.expect(e.code, {"error": body}, f"deleting {name} of run {run_id}")
            except (urllib.error.URLError, OSError) as e:
                if i + 1 < len(servers):
                    continue
                reason = getattr(e, "reason", e)
                raise TrackingConnectionError(
                    f"deleting {name} of run {run_id}: cannot reach {base} ({reason}); is "
                    f"`relaunch server` running there, and is {SERVER_ENV} (or root=) its address?"
                ) from None
        return None

    def set_config(self, run_id: str, config: dict) -> dict:
        status, answer = self._answer(self.client.set_config, run_id, json.dumps(config))
        return self.expect(status, answer, f"saving the params of run {run_id}")  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True)
class _Root:
    """Where a logger's runs live: a relaunch server (``url``: one URL or
    several, comma-separated and normalized) or a local data directory
    (``local``: absolute), served by a server of this machine's own."""

    url: str | None = None
    local: str | None = None

    def __str__(self) -> str:
        return self.url or self.local or ""


def _local_root(path: str, shown: str) -> _Root:
    path = os.path.expanduser(path)
    if re.fullmatch(r"[\w.-]+:\d+(/.*)?", path):
        raise TrackingConfigError(
            f"root {shown!r} looks like a server without its scheme: write http://{path}"
        )
    if re.match(r"[a-z][a-z0-9+.-]*://", path, re.IGNORECASE):
        scheme = path.split("://", 1)[0]
        raise TrackingConfigError(
            f"root {shown!r}: {scheme}:// is not a place relaunch keeps runs; give a relaunch "
            "server (http://HOST:PORT) or a local directory (relaunch server --blobs s3://... "
            "keeps a server's files in S3)"
        )
    return _Root(local=os.path.abspath(path))


def _default_local() -> str:
    """The local data directory when nothing names a root: ``$XDG_DATA_HOME/relaunch/ml-logger``,
    else ``~/.local/share/relaunch/ml-logger``."""
    base = os.environ.get("XDG_DATA_HOME", "").strip()
    if not base or not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "relaunch", "ml-logger")


def _resolve_root(root: object) -> _Root:
    """Where ``root`` (or the environment) puts runs: an http(s) URL (several,
    comma-separated, are replicas of one server) is a relaunch server;
    ``file://PATH`` or a path is a local data directory. Without ``root``:
    ``RELAUNCH_SERVER``, else ``ML_LOGGER_ROOT`` (a URL or a path), else
    :func:`_default_local`."""
    if root is not None:
        text = _interpolate(root, "root").strip()
        if not text:
            raise TrackingConfigError(
                "root is empty; give a relaunch server (http://HOST:PORT) or a local directory"
            )
        if re.match(r"https?://", text, re.IGNORECASE):
            return _Root(url=",".join(_server_list(text)))
        if text.lower().startswith("file://"):
            path = text[len("file://") :]
            if not os.path.isabs(path):
                raise TrackingConfigError(f"root {text!r}: a file:// path must be absolute")
            return _Root(local=os.path.abspath(path))
        return _local_root(text, text)
    server = os.environ.get(SERVER_ENV, "").strip()
    if server:
        return _Root(url=",".join(_server_list(server)))
    ml_root = os.environ.get("ML_LOGGER_ROOT", "").strip()
    if ml_root:
        return _resolve_root(ml_root)
    return _Root(local=_default_local())


def _timeout_from_env() -> float:
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not math.isfinite(seconds) or seconds <= 0:
        raise TrackingConfigError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds > 0")
    return seconds
