"""The server: which relaunch server the logger talks to (``root=``,
``RELAUNCH_SERVER``, ``ML_LOGGER_ROOT``), with what token and timeout, and
the few ``/api/v1`` calls the shim makes itself (read a run, list its files,
save its config). Metrics and files go through relaunch's own client.

Both follow relaunch's client (``crates/relaunch-client/src/http.rs``): the
token is ``access_token=``, else ``RELAUNCH_SERVER_TOKEN``, sent as
``Authorization: Bearer TOKEN`` (what the server's ``--token`` asks for);
the server may be several replicas, ``http://a:8765,http://b:8765``, read
by the client's own ``server_list``.
"""

from __future__ import annotations

import json
import math
import os
import re
import urllib.error
import urllib.parse
import urllib.request

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

_API = "/api/v1"
_UNAVAILABLE = (502, 503, 504)
# The replica in use for each server list, shared by every logger: after one
# stops answering, later calls start at the one that answered instead of
# waiting on the dead one each time (as relaunch's client moves its clones on).
_in_use: dict[str, int] = {}


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
    servers = _server_list(server)
    return servers[_in_use.get(",".join(servers), 0) % len(servers)]


class _Api:
    """``/api/v1`` of the relaunch server (one or several replicas)."""

    def __init__(self, server: str, token: str | None, timeout: float) -> None:
        self.urls = _server_list(server)
        self.key = ",".join(self.urls)
        self.token = _token(token)
        self.timeout = timeout

    def call(self, method: str, path: str, body: object = None) -> tuple[int, object]:
        """Sends the request to the replica in use; one that does not answer
        (refused, reset, timed out) or answers 502/503/504 moves every logger
        on to the next, and the request goes there, each replica once, as in
        relaunch's client. Every call here can be repeated safely (reads, and
        a PATCH that sets the whole config)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        problem = ""
        timed_out = False
        first = self._in_use()
        for tried in range(len(self.urls)):
            index = (first + tried) % len(self.urls)
            base = self.urls[index]
            last = tried == len(self.urls) - 1
            request = urllib.request.Request(
                base + _API + path, data=data, headers=headers, method=method
            )
            if self.token:
                # Not repeated to where a redirect points: the token is the server's.
                request.add_unredirected_header("Authorization", f"Bearer {self.token}")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    self._use(index)
                    return response.status, _parse(response.read())
            except urllib.error.HTTPError as e:
                answer = _parse(e.read())
                if e.code in _UNAVAILABLE and not last:
                    problem = f"{base} answered {e.code}"
                    continue
                self._use(index)
                return e.code, answer
            except (urllib.error.URLError, OSError) as e:
                reason = getattr(e, "reason", e)
                timed_out = timed_out or isinstance(reason, TimeoutError)
                problem = f"{base}: {reason}"
        others = f" (and no other of the {len(self.urls)} servers answered)"
        problem += others if len(self.urls) > 1 else ""
        if timed_out:
            raise TrackingTimeoutError(
                f"the relaunch server did not answer {method} {path} within {self.timeout:g} s "
                f"({problem}); raise {TIMEOUT_ENV} or logger.timeout if it is just slow"
            )
        raise TrackingConnectionError(
            f"cannot reach the relaunch server ({problem}); is `relaunch server` running there, "
            f"and is {SERVER_ENV} (or root=) its address?"
        )

    def _in_use(self) -> int:
        return _in_use.get(self.key, 0) % len(self.urls)

    def _use(self, index: int) -> None:
        if len(self.urls) > 1:
            _in_use[self.key] = index

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
        status, answer = self.call("GET", f"/runs/{urllib.parse.quote(run_id)}")
        if status == 404:
            return None
        return self.expect(status, answer, f"reading run {run_id}")  # type: ignore[return-value]

    def files(self, run_id: str) -> list[dict] | None:
        status, answer = self.call("GET", f"/runs/{urllib.parse.quote(run_id)}/files")
        if status == 404:
            return None
        return self.expect(status, answer, f"listing the files of run {run_id}")  # type: ignore[return-value]

    def set_config(self, run_id: str, config: dict) -> dict:
        status, answer = self.call(
            "PATCH", f"/runs/{urllib.parse.quote(run_id)}", {"config": config}
        )
        return self.expect(status, answer, f"saving the params of run {run_id}")  # type: ignore[return-value]


def _parse(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": raw.decode("utf-8", "replace").strip()[:300]}


def _resolve_server(root: object) -> str:
    """The relaunch server that ``root`` (or the environment) names: one URL or
    several, comma-separated and normalized."""
    if root is not None:
        root = _interpolate(root, "root")
        if re.match(r"https?://", root, re.IGNORECASE):
            return ",".join(_server_list(root))
        raise TrackingConfigError(
            f"root {root!r} is not an http(s) URL: ml-logger's local mode has no counterpart "
            "here, because relaunch keeps runs on its tracking server. Start one (`relaunch "
            "server --data-dir DIR`) and pass root='http://127.0.0.1:8765' or set RELAUNCH_SERVER"
        )
    server = os.environ.get(SERVER_ENV, "").strip()
    if server:
        return ",".join(_server_list(server))
    ml_root = os.environ.get("ML_LOGGER_ROOT", "").strip()
    if re.match(r"https?://", ml_root, re.IGNORECASE):
        return ",".join(_server_list(ml_root))
    why = (
        f"ML_LOGGER_ROOT={ml_root!r} is a local path (ml-logger's local mode), and relaunch "
        "keeps runs on its tracking server"
        if ml_root
        else "neither RELAUNCH_SERVER nor ML_LOGGER_ROOT names one"
    )
    raise TrackingConfigError(
        f"no relaunch server: {why}. Start one (`relaunch server --data-dir DIR`) and set "
        "RELAUNCH_SERVER=http://127.0.0.1:8765, or pass root= to configure()"
    )


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
