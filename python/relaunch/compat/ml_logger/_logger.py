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
import sys
import time
import traceback
import urllib.parse
import weakref
from collections.abc import Mapping

import relaunch
from relaunch.errors import TrackingConfigError, TrackingError

from ._api import _Api, _dashboard_base, _resolve_server, _timeout_from_env
from ._metrics import _MetricsMixin
from ._names import (
    PREFIX,
    _file_name,
    _format,
    _interpolate,
    _key,
    _parts,
    _remote_scheme,
    now,
    pJoin,
    run_ids,
    utcnow,
)
from ._run_files import _FilesMixin
from ._summary import _SummaryCache
from ._text import LOG_FILE, _params_table, _TextFile, _TextMixin
from ._values import _assign, _dot_flatten, _jsonable, _namespace

METRICS_FILE = "metrics.pkl"
PARAMS_FILE = "parameters.pkl"

_live: weakref.WeakSet[ML_Logger] = weakref.WeakSet()
_exit_hook = False


def _unsupported(name: str, why: str):
    def method(self, *args, **kwargs):
        raise NotImplementedError(f"logger.{name}() has no relaunch counterpart: {why}")

    method.__name__ = name
    method.__doc__ = f"Not available on relaunch: {why}"
    return method


_NO_DELETE = (
    "the relaunch server never deletes a run's files (a committed file is replaced only by "
    "uploading another under the same name)"
)


class ML_Logger(_MetricsMixin, _TextMixin, _FilesMixin):
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
        self._server: str | None = None if root is None else _resolve_server(root)
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
        self._summary_opts = dict(summary_cache_opts or {})
        _SummaryCache(**self._summary_opts)  # bad options fail here, not at the first store
        self._summaries: dict[object, _SummaryCache] = {}
        self._timers: dict[str, float] = {}
        self.counter: dict[str, int] = {}
        parts = [_interpolate(p, "prefix") for p in (prefix, *prefixae) if p]
        self._run_prefix = self._checked(_format("/".join(parts) if parts else PREFIX))
        self._prefix = self._run_prefix
        _live.add(self)

    # --- configuration --------------------------------------------------------

    @staticmethod
    def _checked(prefix: str) -> str:
        _, parts = _parts(prefix, "prefix")
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
    def root(self) -> str | None:
        """The relaunch server, once known."""
        return self._server

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
        server = _resolve_server(root) if root is not None else self._server
        server = server or _resolve_server(None)
        if server != self._server and self._run is not None:
            self._finish(error=None)
        self._server = server
        if access_token is not None:
            self._token = access_token
        if summary_cache_opts is not None:
            _SummaryCache(**summary_cache_opts)
            self._summary_opts = dict(summary_cache_opts)
            self._kv.clear()
            self._summaries.clear()
        parts = [_interpolate(p, "prefix") for p in (prefix, *prefixae) if p]
        if parts:
            new = self._checked(_format("/".join(parts)))
            self._switch(new)
            self._prefix = new
        if not silent:
            builtins.print(f"Dashboard: {self.get_dash_url()}")
            builtins.print(f"Log_directory: {self._server}")

    def _switch(self, prefix: str) -> None:
        if prefix != self._run_prefix and self._run is not None:
            self._finish(error=None)
            self._texts.clear()
        self._run_prefix = prefix

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
        if self._server is None:
            self._server = _resolve_server(None)
        return _Api(self._server, self._token, timeout or self.timeout)

    def _ensure_run(self) -> relaunch.Run:
        """This logger's run, opened on first use (never contacts the server)."""
        if self._run is not None:
            return self._run
        if self._server is None:
            self._server = _resolve_server(None)
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
                    f"run {run.id} is not on {self._server} although everything was shipped; "
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
                f"no run {run_id} (prefix {self._prefix!r}) on {self._server}; configure() that "
                "prefix to create it"
            )

    # --- contexts -------------------------------------------------------------

    @contextlib.contextmanager
    def Prefix(self, *praefixa: str, metrics: str | bool | None = None, sep: str = "/"):
        """A context with the prefix extended by ``praefixa`` (a first part
        starting with ``/`` starts from the top instead: another run) and,
        with ``metrics``, metric keys prefixed ``metrics + sep``."""
        if metrics not in (None, False) and not isinstance(metrics, str):
            raise TypeError(f"metrics must be a str, False or None, not {metrics!r}")
        base = self._prefix.split("/") if self._prefix else []
        for i, part in enumerate(praefixa):
            absolute, parts = _parts(_interpolate(part, "prefix"), "prefix", absolute_ok=i == 0)
            base = parts if absolute else [*base, *parts]
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
                    f"no run {run_id} (prefix {self._prefix!r}) on {self._server}, so no params"
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

    # --- what relaunch does not do ----------------------------------------------

    remove = _unsupported("remove", _NO_DELETE)
    move = _unsupported("move", _NO_DELETE + "; use duplicate() to copy")
    read_metrics = _unsupported(
        "read_metrics",
        "read the run's series from the server (`relaunch metrics RUN KEY --format json`, or "
        "GET /api/v1/runs/RUN/series?key=KEY)",
    )
    get_dataframe = read_metrics
    ping = _unsupported(
        "ping", "relaunch run watches liveness itself (relaunch.heartbeat under relaunch run)"
    )
    upload_dir = _unsupported("upload_dir", "archive the folder and upload_file() the archive")
    download_dir = _unsupported("download_dir", "download_file() each file from glob()")
    savefig = _unsupported("savefig", "fig.savefig(path), then upload_file(path, 'figures/')")
    save_pyplot = savefig
    save_image = _unsupported("save_image", "save the image to a file, then upload_file() it")
    save_images = save_image
    save_video = _unsupported("save_video", "write the video to a file, then upload_file() it")
    make_video = save_video
    shell = _unsupported("shell", "the relaunch server runs no commands")
    memoize = _unsupported("memoize", "use functools.cache or joblib.Memory locally")

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

    # --- paths and links -----------------------------------------------------------------------

    def get_dash_url(self, path: str | None = None) -> str:
        """The run's page on the relaunch dashboard."""
        if self._server is None:
            self._server = _resolve_server(None)
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
        return f'ML_Logger(root="{self._server}",\n          prefix="{self._prefix}")'


def _install_exit_hook() -> None:
    # Registered after relaunch.init's own hook, so it runs first: the text
    # is queued before the client finishes the run and waits for uploads.
    global _exit_hook
    if not _exit_hook:
        _exit_hook = True
        atexit.register(_at_exit)


def _at_exit() -> None:
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
