"""The server: which relaunch server the logger talks to (``root=``,
``RELAUNCH_SERVER``, ``ML_LOGGER_ROOT``), with what token and timeout, and
the few ``/api/v1`` calls the Python API has no function for (read a run,
list its files, save its config: ``_native.ServerApi``, relaunch's client
too). Metrics and files go through relaunch's ``Run`` and file calls.

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

    def set_config(self, run_id: str, config: dict) -> dict:
        status, answer = self._answer(self.client.set_config, run_id, json.dumps(config))
        return self.expect(status, answer, f"saving the params of run {run_id}")  # type: ignore[return-value]


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
