"""``ML_Logger``: one ml-logger logger on one relaunch run. This module holds
what ties the parts together: the prefix and the run it names, the server,
the contexts (``Prefix``, ``Sync``), params and job status, timers, and the
exit hook; metrics, text and files are the mixins of their own modules."""

from __future__ import annotations

import atexit
import builtins
import contextlib
import copy
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import traceback
import urllib.parse
import weakref
from collections.abc import Mapping

import relaunch
from relaunch.errors import (
    TrackingConfigError,
    TrackingConnectionError,
    TrackingError,
    TrackingTimeoutError,
)

from . import _local
from ._api import _Api, _dashboard_base, _resolve_root, _Root, _timeout_from_env
from ._api import _token as _token_or_env
from ._metrics import _MetricsMixin
from ._names import (
    PREFIX,
    _file_name,
    _format,
    _glob_regex,
    _interpolate,
    _join,
    _key,
    _local_path,
    _parts,
    _prefix_parts,
    _remote_scheme,
    now,
    pJoin,
    run_ids,
    utcnow,
)
from ._reads import METRICS_REMOVED
from ._run_files import _FilesMixin
from ._summary import _SummaryCache
from ._text import LOG_FILE, _params_table, _TextFile, _TextMixin
from ._values import _assign, _dot_flatten, _jsonable, _namespace

METRICS_FILE = "metrics.pkl"
PARAMS_FILE = "parameters.pkl"

_live: weakref.WeakSet[ML_Logger] = weakref.WeakSet()
_exit_hook = False
_local_exit_hook = False
_texts_saved = False
_told_metrics_stay: set[str] = set()


def _unsupported(name: str, why: str):
    def method(self, *args, **kwargs):
        raise NotImplementedError(f"logger.{name}() has no relaunch counterpart: {why}")

    method.__name__ = name
    method.__doc__ = f"Not available on relaunch: {why}"
    return method


class _Defaults:
    """ml-logger's methods that no mixin provides: ``get_exps`` from the
    server's run listing, and those relaunch has no counterpart for (they
    raise). Last in ``ML_Logger``'s bases, so a mixin that implements one
    wins."""

    def get_exps(self, *prefixes: str, as_dataframe: bool = True, show_progress: bool = False):
        """The params of the runs that ``prefixes`` name below the current
        prefix, one row each (dot-flattened, with ``prefix``: the run's
        ``.../parameters.pkl`` under the current prefix, as ml-logger gave
        it). A prefix is a glob over runs' prefixes, ending in
        ``parameters.pkl`` or not (``**`` is any depth, itself included). A
        pandas DataFrame, or a list of dicts with ``as_dataframe=False``."""
        base = self._prefix.split("/") if self._prefix else []
        patterns = []
        for path in prefixes:
            if not isinstance(path, str):
                raise TypeError(f"prefixes must be str, not {type(path).__name__}: {path!r}")
            _, parts = _parts(path, "experiment prefix")
            if parts[-1:] != [PARAMS_FILE]:
                parts.append(PARAMS_FILE)
            patterns.append(_glob_regex("/".join([*base, *parts]), recursive=True))
        api = relaunch.Api(self._server, _token_or_env(self._token), timeout=self.timeout)
        rows = []
        for record in sorted(api.runs(), key=lambda r: r.name):
            path = f"{record.name.strip('/')}/{PARAMS_FILE}"
            if record.config and any(p.fullmatch(path) for p in patterns):
                row = _dot_flatten(record.config)
                row["prefix"] = "/".join(path.split("/")[len(base) :])
                rows.append(row)
        if not as_dataframe:
            return rows
        import pandas

        return pandas.DataFrame(rows)

    ping = _unsupported(
        "ping", "relaunch run watches liveness itself (relaunch.heartbeat under relaunch run)"
    )
    shell = _unsupported("shell", "the relaunch server runs no commands")
    memoize = _unsupported("memoize", "use functools.cache or joblib.Memory locally")
    read_metrics = _unsupported(
        "read_metrics",
        "read the run's series from the server (`relaunch metrics RUN KEY --format json`, or "
        "GET /api/v1/runs/RUN/series?key=KEY)",
    )
    get_dataframe = read_metrics
    upload_dir = _unsupported("upload_dir", "archive the folder and upload_file() the archive")
    download_dir = _unsupported("download_dir", "download_file() each file from glob()")
    savefig = _unsupported("savefig", "fig.savefig(path), then upload_file(path, 'figures/')")
    save_pyplot = savefig
    save_image = _unsupported("save_image", "save the image to a file, then upload_file() it")
    save_images = save_image
    save_video = _unsupported("save_video", "write the video to a file, then upload_file() it")
    make_video = save_video


_NOT_FILES = {
    "metrics.pkl": "metrics",
    "parameters.pkl": "params",
}
"""ml-logger's files that are not files of a relaunch run."""


class ML_Logger(_MetricsMixin, _TextMixin, _FilesMixin, _Defaults):
    """ml-logger's ``ML_Logger`` on a relaunch run; see the package doc for the mapping."""

    metric_filename = METRICS_FILE
    log_filename = LOG_FILE

    def __init__(
        self,
        prefix: str = "",
        *prefixae: str,
        root: str | None = None,
        user: str | None = None,
        access_token: str | None = None,
        buffer_size: int = 2048,
        max_workers: int | None = None,
        asynchronous: bool | None = None,
        summary_cache_opts: dict | None = None,
    ) -> None:
        # An empty root is the default, as in ml-logger (``root or ROOT``).
        self._root: _Root | None = _resolve_root(root) if root else None
        self._url: str | None = None
        self._token = access_token
        self.timeout = _timeout_from_env()
        self.metrics_prefix = ""
        self.do_not_print: set[str] = {"__timestamp"}
        self._depth = 0  # how many Prefix() contexts are open
        self._run: relaunch.Run | None = None
        self._confirmed = False
        self._on_server_files: set[str] = set()
        self._config: dict | None = None
        self._texts: dict[str, _TextFile] = {}
        self._text_dir: str | None = None
        self._kv: dict[object, dict[str, int | float]] = {}
        self._last_row_step = 0  # the step the last row with numbers was logged at
        self._summary_opts = dict(summary_cache_opts or {})
        _SummaryCache(**self._summary_opts)  # bad options fail here, not at the first store
        self._summaries: dict[object, _SummaryCache] = {}
        self._timers: dict[str, float] = {}
        self.counter: dict[str, int] = {}
        parts = [_interpolate(p, "prefix") for p in (prefix, *prefixae) if p]
        self._run_prefix = self._checked(_format(_join(parts) if parts else PREFIX))
        self._prefix = self._run_prefix
        _live.add(self)

    # --- configuration --------------------------------------------------------

    @staticmethod
    def _checked(prefix: str) -> str:
        """The prefix as a path from the root (``/x`` is ``x``, ``..`` goes up)."""
        parts = _prefix_parts(prefix)
        if not parts:
            raise TrackingConfigError("the prefix is empty; give one such as 'alice/demo/run-1'")
        run_ids("/".join(parts))
        return "/".join(parts)

    @property
    def prefix(self) -> str:
        """The current prefix; setting it outside ``Prefix()`` switches the run."""
        return self._prefix

    @prefix.setter
    def prefix(self, value: str) -> None:
        value = self._checked(_interpolate(value, "prefix"))
        if self._depth == 0:
            self._switch(value)
        self._prefix = value

    @property
    def root(self) -> str:
        """Where the runs live: the relaunch server's URL(s), or the local data directory."""
        return str(self._root_spec())

    def _root_spec(self) -> _Root:
        if self._root is None:
            self._root = _resolve_root(None)
        return self._root

    @property
    def _server(self) -> str:
        """The server's URL(s); for a local root, its server, started or joined now."""
        if self._url is None:
            root = self._root_spec()
            if root.url is not None:
                self._url = root.url
            else:
                assert root.local is not None
                _install_local_exit_hook()
                self._url = _local.server_for(root.local, self.timeout)
        return self._url

    def configure(
        self,
        prefix: str | None = PREFIX,
        *prefixae: str,
        root: str | None = None,
        user: str | None = None,
        access_token: str | None = None,
        asynchronous: bool | None = None,
        max_workers: int | None = None,
        buffer_size: int | None = None,
        summary_cache_opts: dict | None = None,
        register_experiment: object = None,
        silent: bool = False,
    ) -> None:
        """Sets the prefix (``{USER}``/``{now:...}`` filled in; by default a new
        one from ``ML_LOGGER_PREFIX``; all parts empty: unchanged) and the
        server. A new prefix or server finishes the run of the old one,
        waiting until the server has it."""
        if register_experiment:
            raise DeprecationWarning("register_experiment is deprecated in ml-logger too")
        spec = _resolve_root(root) if root else self._root_spec()  # "": unchanged, as before
        if spec != self._root:
            self._leave()
            self._root, self._url = spec, None
        if access_token is not None:
            self._token = access_token
        if summary_cache_opts is not None:
            _SummaryCache(**summary_cache_opts)
            self._summary_opts = dict(summary_cache_opts)
            self._kv.clear()
            self._summaries.clear()
        parts = [_interpolate(p, "prefix") for p in (prefix, *prefixae) if p]
        if parts:
            new = self._checked(_format(_join(parts)))
            self._switch(new)
            self._prefix = new
        if not silent:
            builtins.print(f"Dashboard: {self.get_dash_url()}")
            builtins.print(f"Log_directory: {self.root}")

    def _switch(self, prefix: str) -> None:
        if prefix != self._run_prefix and self._run is not None:
            self._leave()
            self._texts.clear()
        self._run_prefix = prefix

    def _leave(self) -> None:
        """Finishes the run for a switch to another prefix or root. When its
        server cannot be reached the switch still happens (a script is not
        stuck on a server that went away) and nothing is lost: the run's
        records stay in relaunch's spool (the next logger of the run, or
        ``relaunch sync``, ships them), params logged during the outage in
        the outbox (see ``_outbox``), and its text files in a folder of
        their own, named on stderr."""
        if self._run is None:
            return
        try:
            self._finish(error=None)
            return
        except (TrackingConnectionError, TrackingTimeoutError) as e:
            why = e
        run, self._run = self._run, None
        kept = self._text_dir if any(t.dirty for t in self._texts.values()) else None
        if kept is not None:
            self._text_dir = None  # the next run's text goes to a folder of its own
        self._texts.clear()
        try:
            run.finish(min(self.timeout, 1.0))
        except TrackingError:  # "finished" is in the spool with the rest: no waiting at exit
            run._native.close()
            run._state = "closed"
        builtins.print(
            f"relaunch.compat.ml_logger: left run {run.id} while its server cannot be reached "
            f"({why}). Nothing is lost: its metrics and events stay in relaunch's spool (the "
            "next logger of the run, or `relaunch sync`, ships them), params logged meanwhile "
            "in the outbox (`python -m relaunch.compat.ml_logger.outbox` delivers them)"
            + (f", and its text files in {kept} (upload them with upload_file())" if kept else ""),
            file=sys.stderr,
        )

    def _identity(self) -> tuple[str | None, str | None]:
        project, run_id = run_ids(self._run_prefix)
        if os.environ.get("RELAUNCH_PROJECT", "").strip():
            project = None  # the client reads it
        if os.environ.get("RELAUNCH_RUN_ID", "").strip():
            run_id = None  # the job's run, under `relaunch run`
        return project, run_id

    def _own_id(self) -> str:
        if self._run is not None:
            return self._run.id
        return os.environ.get("RELAUNCH_RUN_ID", "").strip() or run_ids(self._run_prefix)[1]

    def _api(self, timeout: float | None = None) -> _Api:
        return _Api(self._server, self._token, timeout or self.timeout)

    def _ensure_run(self) -> relaunch.Run:
        """This logger's run, opened on first use (never contacts the server)."""
        if self._run is not None:
            return self._run
        project, run_id = self._identity()
        self._run = relaunch.init(
            project=project,
            id=run_id,
            name=self._run_prefix,
            server=self._server,
            token=self._token,
        )
        self._confirmed, self._config, self._on_server_files = False, None, set()
        _install_exit_hook()
        return self._run

    def _on_server(self, timeout: float | None = None) -> relaunch.Run:
        """This logger's run, made sure to exist on the server (blocking)."""
        run = self._ensure_run()
        if self._confirmed:
            return run
        api = self._api(timeout)
        if api.run(run.id) is None:
            run.flush(timeout or self.timeout)  # the client opens the run as it ships
            if api.run(run.id) is None:
                raise TrackingError(
                    f"run {run.id} is not on {self.root} although everything was shipped; "
                    "log something first, or check that the server is the one you meant"
                )
        self._on_server_files = {f["name"] for f in api.files(run.id) or []}
        self._confirmed = True
        return run

    def _where(self) -> tuple[bool, list[str], str]:
        """(the current prefix is in this logger's run, the parts below it, the run id)."""
        current = self._prefix.split("/") if self._prefix else []
        own = self._run_prefix.split("/")
        if current[: len(own)] == own:
            return True, current[len(own) :], self._own_id()
        if not current:
            raise TrackingConfigError("the prefix is empty; give one such as 'alice/demo/run-1'")
        return False, [], run_ids(self._prefix)[1]

    def _host_path(self, key: str) -> str | None:
        """The path on this machine that the file key ``key`` names, if it
        names one: ``file:///PATH`` always; with a local root (ml-logger's
        local mode) also an absolute key, which ml-logger wrote exactly
        there (``os.path.join(root, prefix, "/tmp/x")`` is ``/tmp/x``). With a
        server as root an absolute key stays refused: ml-logger wrote it on
        the server's disk."""
        local = _local_path(key)
        if (
            local is None
            and key.startswith("/")
            and not key.startswith("//")
            and self._root_spec().local is not None
        ):
            _parts(key, "file name", absolute_ok=True)  # no '..', no control characters
            return key
        return local

    def _target(self, keys: tuple[object, ...], path: object = None) -> tuple[bool, str, str]:
        """(own run, run id, file name) of a file key under the current prefix."""
        key = _key(keys, path)
        _remote_scheme(key)
        _, parts = _parts(key, "file name")
        own, sub, run_id = self._where()
        return own, run_id, _file_name([*sub, *parts], key)

    def _other_run(self, run_id: str) -> None:
        if self._api().run(run_id) is None:
            raise TrackingConfigError(
                f"no run {run_id} (prefix {self._prefix!r}) on {self.root}; configure() that "
                "prefix to create it"
            )

    # --- contexts -------------------------------------------------------------

    @contextlib.contextmanager
    def Prefix(self, *praefixa: str, metrics: str | bool | None = None, sep: str = "/"):
        """A context with the prefix extended by ``praefixa`` as a path (a part
        starting with ``/`` starts from the root: another run; ``..`` goes up)
        and, with ``metrics``, metric keys prefixed ``metrics + sep``."""
        if metrics not in (None, False) and not isinstance(metrics, str):
            raise TypeError(f"metrics must be a str, False or None, not {metrics!r}")
        base = self._prefix.split("/") if self._prefix else []
        for part in praefixa:
            base = _prefix_parts(_interpolate(part, "prefix"), base)
        old = (self._prefix, self.metrics_prefix)
        if praefixa:
            self._prefix = "/".join(base)
        if metrics:
            self.metrics_prefix = metrics + (sep or "")
        elif metrics is False:
            self.metrics_prefix = ""
        self._depth += 1
        try:
            yield self
        finally:
            self._depth -= 1
            self._prefix, self.metrics_prefix = old

    PrefixContext = Prefix

    @contextlib.contextmanager
    def Sync(self, clean: bool = False, **kwargs: object):
        """A context after which everything logged and saved is acknowledged by the server."""
        try:
            yield self
        except BaseException:
            try:
                self._acknowledged()
            except Exception as e:  # the block's own exception is what propagates
                builtins.print(
                    f"relaunch.compat.ml_logger: leaving Sync(): not acknowledged: {e}",
                    file=sys.stderr,
                )
            raise
        self._acknowledged()

    SyncContext = Sync

    @contextlib.contextmanager
    def Async(self, clean: bool = False, **kwargs: object):
        """Metrics are always asynchronous here; a no-op context (ml-logger's raised NameError)."""
        yield self

    AsyncContext = Async

    def __enter__(self) -> ML_Logger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()

    def _acknowledged(self) -> None:
        if self._run is None and not any(t.dirty for t in self._texts.values()):
            return
        self._save_texts(force=True)
        self._on_server().flush(self.timeout)

    # --- params and job status --------------------------------------------------

    def log_params(self, path: str = PARAMS_FILE, silent: bool = False, **namespaces) -> None:
        """Deep-merges ``namespaces`` (``Args=vars(Args)``) into the run's
        config on the server; blocks until it is saved, raises otherwise."""
        if path not in (PARAMS_FILE, None):
            raise TrackingConfigError(
                f"log_params(path={path!r}): a relaunch run has one set of params (its config); "
                "drop path= or use save_json() for a separate file"
            )
        if not namespaces:
            return
        record = {name: _namespace(value) for name, value in namespaces.items()}
        own, sub, run_id = self._where()
        for part in reversed(sub):
            record = {part: record}
        if own:
            self._text_lines(_params_table(namespaces), echo=not silent)
            run = self._on_server()
            if self._config is None:
                info = self._api().run(run.id) or {}
                config = info.get("config")
                self._config = config if isinstance(config, dict) else {}
            merged = _assign(copy.deepcopy(self._config), record)
            saved = self._api().set_config(run.id, merged)
            self._config = saved.get("config", merged) if isinstance(saved, dict) else merged
        else:
            if not silent:
                builtins.print("\n".join(_params_table(namespaces)))
            api = self._api()
            info = api.run(run_id)
            if info is None:
                self._other_run(run_id)
            config = info.get("config") if info else None
            merged = _assign(copy.deepcopy(config if isinstance(config, dict) else {}), record)
            api.set_config(run_id, merged)

    def get_parameters(
        self, *keys: str, path: str = PARAMS_FILE, not_exist_ok: bool = False, **kwargs: object
    ):
        """The run's params from the server, dot-flattened: all (no keys), one
        value (one key) or a tuple. ``default=`` answers for missing keys."""
        if path not in (PARAMS_FILE, None):
            raise TrackingConfigError(
                f"read_params(path={path!r}): a relaunch run has one set of params; drop path="
            )
        own, sub, run_id = self._where()
        if own and self._run is not None:
            self._on_server()
        info = self._api().run(run_id)
        if info is None:
            if not not_exist_ok:
                raise FileNotFoundError(
                    f"no run {run_id} (prefix {self._prefix!r}) on {self.root}, so no params"
                )
            config: object = {}
        else:
            config = info.get("config")
            config = config if isinstance(config, dict) else {}
        for part in sub:
            config = config.get(part, {}) if isinstance(config, dict) else {}
        params = _dot_flatten(config) if isinstance(config, dict) else {}

        def value(key: str) -> object:
            if key in params:
                return params[key]
            if isinstance(config, dict) and key in config:
                return config[key]
            if "default" in kwargs:
                return kwargs["default"]
            raise KeyError(f"{key!r} is not among the params of run {run_id}: {sorted(params)}")

        if len(keys) > 1:
            return tuple(value(k) for k in keys)
        if len(keys) == 1:
            return value(keys[0])
        return params

    read_params = get_parameters

    def _job(self, status: str, time_key: str, job: Mapping | None, kwargs: dict) -> dict:
        if job is not None and not isinstance(job, Mapping):
            raise TypeError(f"job must be a dict, not {type(job).__name__}")
        record = {**(job or {}), "status": status, time_key: str(utcnow())}
        self.log_params(job=record, **kwargs)
        return record

    def job_created(self, job: Mapping | None = None, **kwargs: object) -> None:
        self._job_event(self._job("created", "createTime", job, kwargs))

    def job_requested(self, job: Mapping | None = None, **kwargs: object) -> None:
        self._job_event(self._job("requested", "requestTime", job, kwargs))

    def job_started(self, job: Mapping | None = None, **kwargs: object) -> None:
        self._job_event(self._job("started", "startTime", job, kwargs))

    def job_running(self, job: Mapping | None = None, **kwargs: object) -> None:
        self._job_event(self._job("running", "runTime", job, kwargs))

    def job_paused(self, job: Mapping | None = None, **kwargs: object) -> None:
        self._job_event(self._job("paused", "pauseTime", job, kwargs))

    def _job_event(self, record: dict) -> None:
        if self._where()[0]:
            self._ensure_run().event(f"job_{record['status']}", data=_jsonable(record))

    def job_completed(self, job: Mapping | None = None, **kwargs: object) -> None:
        """Records ``job.status = completed``, flushes the pending row, uploads
        the text and finishes the run: returns once the server has all of it,
        raises otherwise."""
        self._job("completed", "completionTime", job, kwargs)
        if self._where()[0]:
            self._flush_pending()
            self._finish(error=None)

    def job_errored(self, job: Mapping | None = None, **kwargs: object) -> None:
        """Records ``job.status = errored`` and finishes the run as failed,
        with the traceback being handled (if any); raises like job_completed."""
        self._job("errored", "errorTime", job, kwargs)
        if self._where()[0]:
            kind, value, tb = sys.exc_info()
            error = "job_errored()"
            if kind is not None:
                error = "".join(traceback.format_exception(kind, value, tb))[-8000:]
            self._flush_pending()
            self._finish(error=error)

    def _flush_pending(self) -> None:
        for cache in list(self._kv):
            if self._kv[cache]:
                self.flush_metrics(cache=cache, silent=True)

    def _finish(self, error: str | None) -> None:
        if self._run is None:
            return
        self._save_texts(force=True)
        self._run.finish(self.timeout, error=error)
        self._run = None
        for text in self._texts.values():
            # The server has it all; a later resume continues the server's copy.
            open(text.path, "wb").close()
            text.seeded = text.dirty = False

    # --- removing and moving files -------------------------------------------------------

    def _matching(self, paths: tuple[str, ...]) -> tuple[bool, str, list[str], list[str]]:
        """(own run, run id, the run's files that ``paths`` name (a file, a
        folder: everything below it, ``''``: everything under the prefix, a
        glob), the ml-logger names among ``paths`` that are not files of the
        run (none when the run is not on the server))."""
        own, sub, run_id = self._where()
        if own and self._run is not None:
            self._on_server()
            self._run.flush(self.timeout)  # queued uploads land before anything is deleted
        files = self._api().files(run_id)
        if files is None:
            return own, run_id, [], []
        listed = [f["name"] for f in files]
        folders = {n.rsplit("/", i)[0] for n in listed for i in range(1, n.count("/") + 1)}
        found: list[str] = []
        special: list[str] = []
        for path in paths:
            if not isinstance(path, str):
                raise TypeError(f"paths must be str, not {type(path).__name__}: {path!r}")
            _remote_scheme(path)
            _, parts = _parts(path, "path")
            whole = [*sub, *parts]
            if not parts:
                special += _NOT_FILES  # everything under the prefix
            elif len(parts) == 1 and parts[0] in _NOT_FILES:
                special.append(parts[0])
            if any(c in path for c in "*?["):
                pattern = _glob_regex("/".join(whole), recursive=True)
                hits = [n for n in listed if pattern.fullmatch(n)]
                for folder in sorted(folders):
                    if pattern.fullmatch(folder):
                        hits += [n for n in listed if n.startswith(folder + "/")]
            else:
                name = "/".join(whole)
                hits = [n for n in listed if not name or n == name or n.startswith(name + "/")]
            found += [n for n in hits if n not in found]
        return own, run_id, found, special

    def _forget_text(self, names: list[str]) -> None:
        """Local copies of the text files ``names`` restart empty (their server copy is gone)."""
        for name in names:
            text = self._texts.get(name)
            if text is not None:
                open(text.path, "wb").close()
                text.seeded, text.dirty = True, False

    def remove(self, *paths: str) -> list[str]:
        """Deletes the run's files that ``paths`` name: a file, a folder (all
        below it), a glob, or ``''`` (everything under the current prefix).
        ``parameters.pkl`` clears the params; ``metrics.pkl`` hides the rows
        logged so far from ml-logger's reads (``METRICS_REMOVED``; the server
        keeps them). Returns the names removed (under the current prefix);
        names that match nothing are skipped, as in ml-logger."""
        own, run_id, found, special = self._matching(paths)
        self._delete(own, run_id, found)
        api = self._api()
        info = api.run(run_id) if "parameters.pkl" in special else None
        if info is not None:
            # The params under the current prefix: all of them at the run's own.
            config = info.get("config") if isinstance(info.get("config"), dict) else {}
            sub = self._where()[1]
            at = config
            for part in sub[:-1]:
                at = at.get(part) if isinstance(at, dict) else None
            if not sub:
                config = {}
            elif isinstance(at, dict):
                at.pop(sub[-1], None)
            saved = api.set_config(run_id, config)
            if own:
                self._config = saved.get("config", config) if isinstance(saved, dict) else config
        if "metrics.pkl" in special and own:
            # The rows stay on the server (the dashboard shows every one);
            # ml-logger's reads of this scope start after this event.
            sub = self._where()[1]
            self._ensure_run().event(
                METRICS_REMOVED, "remove('metrics.pkl')", data={"scope": "/".join(sub)}
            )
        elif "metrics.pkl" in special and run_id not in _told_metrics_stay:
            _told_metrics_stay.add(run_id)
            builtins.print(
                f"relaunch.compat.ml_logger: remove(): run {run_id} is not this logger's, so its "
                "metrics stay as they are; configure() its prefix to remove them",
                file=sys.stderr,
            )
        return self._below(found)

    def _below(self, names: list[str]) -> list[str]:
        """Run file names as names under the current prefix."""
        depth = len(self._where()[1])
        return ["/".join(n.split("/")[depth:]) for n in names]

    def move(self, source: str, to: str) -> list[str]:
        """Moves the run's file ``source`` (or every file below the folder
        ``source``) to ``to``: copied on the server, then deleted. Returns
        the new names (under the current prefix); raises FileNotFoundError
        when nothing is there."""
        for what in (source, to):
            if not isinstance(what, str):
                raise TypeError(f"source and to must be str, not {type(what).__name__}: {what!r}")
            if what.strip("/") in _NOT_FILES:
                raise TrackingConfigError(
                    f"move({source!r}, {to!r}): {what} holds the run's "
                    f"{_NOT_FILES[what.strip('/')]}, which are not a file of a relaunch run; "
                    "read_params()/log_params() them under the other prefix instead"
                )
        if any(c in source for c in "*?["):
            raise TrackingConfigError(
                f"move({source!r}, {to!r}): move() takes a file or a folder, not a glob; move "
                "each of glob(...) instead"
            )
        _, src = _parts(source, "path")
        _, dst = _parts(to, "path")
        if not dst:
            raise TrackingConfigError(f"move({source!r}, {to!r}): give a name to move it to")
        own, run_id, found, _ = self._matching((source,))
        if not found:
            raise FileNotFoundError(f"run {run_id} has no file or folder {source!r} to move")
        _, sub, _ = self._where()
        if found == ["/".join([*sub, *src])]:  # a file: into ``to`` when that is a folder
            into = "/".join([*sub, *dst]) + "/"
            listed = self._api().files(run_id) or []
            if to.endswith("/") or any(f["name"].startswith(into) for f in listed):
                dst = [*dst, src[-1]]
        if src == dst[: len(src)]:
            if src == dst:
                return self._below(found)
            raise TrackingConfigError(f"move({source!r}, {to!r}): cannot move a folder into itself")
        moved = []
        for name in found:
            below = name.split("/")[len(sub) :]  # the name under the current prefix
            target = "/".join([*dst, *below[len(src) :]])
            self._duplicate_file("/".join(below), target, True)
            moved.append(target)
        self._delete(own, run_id, found)
        return moved

    def _delete(self, own: bool, run_id: str, names: list[str]) -> None:
        """Deletes the run's files ``names``; for the own run, forgets them too."""
        api = self._api()
        for name in names:
            api.delete_file(run_id, name)
        if own:
            self._forget_text(names)
            self._on_server_files.difference_update(names)

    # --- timers and counters ---------------------------------------------------------------

    def start(self, *keys: str) -> float | list[float]:
        keys = keys or ("default",)
        tic = time.perf_counter()
        for key in keys:
            self._timers[key] = tic
        return tic if len(keys) == 1 else [tic for _ in keys]

    def split(self, *keys: str) -> float | list[float | None] | None:
        """Seconds since the last start/split of each key (None the first time); restarts it."""
        keys = keys or ("default",)
        tic = time.perf_counter()
        results = {k: (tic - self._timers[k]) if k in self._timers else None for k in keys}
        for k in keys:
            self._timers[k] = tic
        return results[keys[0]] if len(keys) == 1 else [results[k] for k in keys]

    def since(self, *keys: str) -> float | list[float | None] | None:
        """Seconds since each key's start, not restarting it (None, and started, the first time)."""
        keys = keys or ("default",)
        tic = time.perf_counter()
        results = {}
        for k in keys:
            if k in self._timers:
                results[k] = tic - self._timers[k]
            else:
                self._timers[k], results[k] = tic, None
        return results[keys[0]] if len(keys) == 1 else [results[k] for k in keys]

    @contextlib.contextmanager
    def time(self, key: str = "default", interval: int = 1, fmt: str = "{delta:0.3E}s"):
        name = f"time.{key}"
        self.split(name)
        yield
        delta = self.split(name)
        self.store_metrics(delta=delta, cache=name)
        if self.every(interval, key=name):
            data = [x for x in self._summaries[name].data["delta"] if not math.isnan(x)]
            mean = math.fsum(data) / len(data)
            shown = fmt(mean) if callable(fmt) else fmt.format(delta=mean)
            self.print(f"timing <{key}>: {shown}", flush=True)

    def every(self, n: int | None = 1, key: str = "default", start_on: int = 0) -> bool:
        """True on every ``n``-th call for ``key`` (counting from ``start_on``)."""
        self.counter[key] = self.counter.get(key, 0) + 1
        if n is None:
            return False
        count = self.counter[key]
        return (count - start_on) % n == 0 and count >= start_on

    def count(self, key: str = "default") -> int:
        self.counter[key] = self.counter.get(key, 0) + 1
        return self.counter[key]

    def clear(self, key: str = "default") -> None:
        self.counter.pop(key, None)

    now = staticmethod(now)
    utcnow = staticmethod(utcnow)

    # --- the job's host and code (what ml-logger's instr records) --------------------------------

    @staticmethod
    def _git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], capture_output=True, text=True, check=False, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    def git_rev(self, branch: str) -> str | None:
        """The commit of ``branch`` in the working directory's repository (None outside one)."""
        return self._git("rev-parse", branch)

    def git_tags(self) -> str | None:
        """``git describe --tags`` (None without a tag or a repository)."""
        return self._git("describe", "--tags")

    @property
    def __head__(self) -> str | None:
        return self.git_rev("HEAD")

    @property
    def __current_branch__(self) -> str | None:
        return self._git("symbolic-ref", "HEAD")

    @property
    def __tags__(self) -> str | None:
        return self.git_tags()

    @property
    def __status__(self) -> str | None:
        return self._git("status", "-vv")

    def rev_info(self) -> dict[str, str | None]:
        return {"hash": self.__head__, "branch": self.__current_branch__}

    @staticmethod
    def fn_info(fn: object) -> dict[str, object]:
        """The name, the start of the docstring, the module and the file of a
        function (unwrapping decorators and ``functools.partial``)."""
        import functools

        while True:
            if hasattr(fn, "__wrapped__"):
                fn = fn.__wrapped__  # type: ignore[attr-defined]
            elif isinstance(fn, functools.partial):
                fn = fn.func
            else:
                break
        doc = getattr(fn, "__doc__", None)
        if doc and len(doc) > 46:
            doc = doc[:46] + " ..."
        code = getattr(fn, "__code__", None)
        return {
            "name": getattr(fn, "__name__", repr(fn)),
            "doc": doc,
            "module": getattr(fn, "__module__", None),
            "file": code.co_filename if code is not None else None,
        }

    @property
    def slurm_job_id(self) -> str | None:
        return os.environ.get("SLURM_JOB_ID")

    @property
    def hostname(self) -> str:
        return socket.getfqdn()

    @contextlib.contextmanager
    def capture_error(self, file: str = "error.log", reraise: bool = False):
        """A context that prints an exception raised in it (and its traceback)
        into ``file`` of the run, waits until the server has it, and swallows
        it unless ``reraise``. While the server is away the text stays in
        the run's spool (said on stderr) and the caught exception is what
        is re-raised, never a tracking error in its place."""
        try:
            yield
        except Exception as e:
            self.print("Exception occurred", e, traceback.format_exc(), file=file, flush=True)
            try:
                with self.Sync():
                    pass
            except TrackingError as shipping:
                print(
                    f"ml_logger: the traceback is kept locally and shipped when the server "
                    f"answers ({shipping})",
                    file=sys.stderr,
                )
            if reraise:
                raise

    # --- paths and links -----------------------------------------------------------------------

    def get_dash_url(self, path: str | None = None) -> str:
        """The run's page on the relaunch dashboard (for a local root: its server's)."""
        base = _dashboard_base(self._server)
        return f"{base}/runs/{urllib.parse.quote(self._where()[2])}"

    def abspath(self, *paths: str) -> str:
        return "/" + (pJoin(self._prefix, *paths) or "")

    @staticmethod
    def truncate(path: str, depth: int = -1) -> str:
        return "/".join(path.split("/")[depth:])

    @staticmethod
    def stem(path: str) -> str:
        return os.path.splitext(path)[0]

    def __repr__(self) -> str:
        return f'ML_Logger(root="{self.root}",\n          prefix="{self._prefix}")'


def _install_exit_hook() -> None:
    # Registered after relaunch.init's own hook, so it runs first: the text
    # is queued before the client finishes the run and waits for uploads.
    global _exit_hook
    if not _exit_hook:
        _exit_hook = True
        atexit.register(_at_exit)


def _install_local_exit_hook() -> None:
    # Registered when a local server is first needed, before or after
    # relaunch's own hook: it saves the text and ships the runs itself
    # before leaving the server, so the order does not matter.
    global _local_exit_hook
    if not _local_exit_hook:
        _local_exit_hook = True
        atexit.register(_at_exit_local)


def _at_exit() -> None:
    global _texts_saved
    if _texts_saved:
        return
    _texts_saved = True
    for lg in list(_live):
        left = sum(len(row) for row in lg._kv.values())
        if left:
            builtins.print(
                f"relaunch.compat.ml_logger: {left} metric value(s) logged without a flush were "
                "not recorded; call logger.flush() (ml-logger dropped them too)",
                file=sys.stderr,
            )
        if lg._run is not None:
            try:
                lg._save_texts(force=True, timeout=min(lg.timeout, 10.0))
            except (TrackingError, OSError) as e:
                builtins.print(
                    f"relaunch.compat.ml_logger: the text files of run {lg._run.id} were not "
                    f"uploaded ({e}); they are kept in {lg._text_dir}",
                    file=sys.stderr,
                )
                continue
        if lg._text_dir is not None:
            shutil.rmtree(lg._text_dir, ignore_errors=True)


def _at_exit_local() -> None:
    """Ships everything (the text, then relaunch's runs, as their own hooks
    would), then leaves the local servers: the last process stops each."""
    if not _local.held():
        return
    _at_exit()
    for ship in _local.before_leaving:
        try:
            ship()
        except Exception as e:  # one failure must not keep the servers running
            builtins.print(f"relaunch.compat.ml_logger: at exit: {e}", file=sys.stderr)
    from relaunch import tracking

    tracking._at_exit()
    _local.release_all()
