"""Start processes from Python the way ``relaunch run`` starts its workers.

:func:`start_processes` is torch's (and llutil's)
``elastic.multiprocessing.start_processes``: ``nprocs`` copies of a Python
function or of a program, each with its own arguments and environment,
their output in per-process log files and, where asked, on the console
with a prefix, whole lines only::

    ctx = relaunch.start_processes(
        "trainer", train, args={0: (cfg,), 1: (cfg,)},
        envs={0: {"RANK": "0"}, 1: {"RANK": "1"}}, tee=Std.ALL)
    result = ctx.wait()                 # all done, or the first failure
    result.return_values[0]             # what train(cfg) returned on rank 0
    result.failures                     # {rank: ProcessFailure} of those that failed

The processes are the launcher's own (``relaunch_launch::processes``, in the
native module): each in a session of its own with the parent-death signal,
so none outlives this interpreter, even killed with SIGKILL; signals go to
each process group; :meth:`ProcessContext.close` gives them a grace period,
then SIGKILL. A failing function's traceback is in its error file (torch's
format, read by ``ProcessFailure.message``), a program's where torch's
``@record`` writes it (``TORCHELASTIC_ERROR_FILE``, set for each process).

Start methods: ``spawn`` (the default) starts a new interpreter that imports
the main module as ``__mp_main__`` and unpickles the function and its
arguments, as ``multiprocessing``'s spawn does; ``fork`` forks this
process, so the function and its arguments need not be picklable (only the
return value); ``forkserver`` has spawn's contract (a picklable function
and arguments) and runs as spawn: a new interpreter per process, no server
kept.
"""

from __future__ import annotations

import enum
import json
import multiprocessing.spawn
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relaunch import _native

__all__ = ["ProcessContext", "ProcessFailure", "RunProcsResult", "Std", "start_processes"]

_START_METHODS = ("spawn", "fork", "forkserver")
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


class Std(enum.IntFlag):
    """Which streams: torch's values (``0`` none, ``1`` stdout, ``2``
    stderr, ``3`` both)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3


@dataclass
class ProcessFailure:
    """A process that did not exit 0. ``exitcode`` is negative for a
    signal (``-9``: SIGKILL), as in torch."""

    local_rank: int
    pid: int
    exitcode: int
    error_file: str
    message: str = ""
    traceback: str = ""
    timestamp: int = field(default_factory=lambda: int(time.time()))

    def signal_name(self) -> str:
        if self.exitcode < 0:
            try:
                return signal.Signals(-self.exitcode).name
            except ValueError:
                return f"signal {-self.exitcode}"
        return "<N/A>"


@dataclass
class RunProcsResult:
    """How the processes ended: what each function returned (by local rank;
    programs return nothing), the failures, and each one's log files."""

    return_values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, ProcessFailure] = field(default_factory=dict)
    stdouts: dict[int, str] = field(default_factory=dict)
    stderrs: dict[int, str] = field(default_factory=dict)

    def is_failed(self) -> bool:
        return len(self.failures) > 0


def _streams(spec: Std | int | Mapping[int, Std | int], nprocs: int, what: str) -> dict[int, Std]:
    if isinstance(spec, Mapping):
        unknown = set(spec) - set(range(nprocs))
        if unknown:
            raise ValueError(f"{what} names local ranks {sorted(unknown)}, not in 0..{nprocs - 1}")
        return {rank: _std(spec.get(rank, Std.NONE), what) for rank in range(nprocs)}
    return dict.fromkeys(range(nprocs), _std(spec, what))


def _std(value: object, what: str) -> Std:
    if isinstance(value, bool) or value not in (0, 1, 2, 3):
        raise ValueError(f"{what}={value!r}: give 0 (none), 1 (stdout), 2 (stderr) or 3 (both)")
    return Std(value)


def start_processes(
    name: str,
    entrypoint: Callable[..., Any] | str,
    args: Mapping[int, tuple],
    envs: Mapping[int, Mapping[str, str]],
    log_dir: str | os.PathLike[str] | None = None,
    start_method: str = "spawn",
    redirects: Std | int | Mapping[int, Std | int] = Std.NONE,
    tee: Std | int | Mapping[int, Std | int] = Std.NONE,
    log_line_prefixes: Mapping[int, str] | None = None,
) -> ProcessContext:
    """Starts ``len(args)`` processes of ``entrypoint`` (a function, or a
    program's path) and returns their context.

    ``args`` and ``envs`` map each local rank (``0..n-1``) to its arguments
    and to the variables added to its environment. Every stream of every
    process is written to ``LOG_DIR/NAME_XXXXXX/RANK/{stdout,stderr}.log``
    (``log_dir`` defaults to a new private temporary directory);
    ``redirects`` keeps streams off the console, ``tee`` (the default for
    every stream) shows them there too, each line prefixed
    (``log_line_prefixes``, default ``[NAME RANK]:``).
    """
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty str (it names the log directory)")
    if start_method not in _START_METHODS:
        raise ValueError(
            f"start_method={start_method!r}: choose one of {', '.join(_START_METHODS)}"
        )
    nprocs = len(args)
    if nprocs == 0:
        raise ValueError("args is empty: give one tuple of arguments per process, {0: (...), ...}")
    ranks = set(range(nprocs))
    for what, mapping in (("args", args), ("envs", envs)):
        if set(mapping) != ranks:
            raise ValueError(f"{what} must have the keys 0..{nprocs - 1}, got {sorted(mapping)}")
    if log_line_prefixes is not None and set(log_line_prefixes) - ranks:
        raise ValueError(f"log_line_prefixes names ranks outside 0..{nprocs - 1}")
    if isinstance(entrypoint, str):
        if start_method != "spawn":
            pass  # a program always runs in a new process; the method is for functions
    elif not callable(entrypoint):
        raise TypeError(
            f"entrypoint must be a function or a program's path, not {type(entrypoint).__name__}"
        )
    redirected = _streams(redirects, nprocs, "redirects")
    _streams(tee, nprocs, "tee")  # checked; every stream not redirected is shown
    root = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="relaunch_"))
    root.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix=f"{name}_", dir=root))  # new, mode 0700
    context = ProcessContext(name, entrypoint, base, nprocs)
    try:
        for rank in range(nprocs):
            prefix = (
                log_line_prefixes.get(rank, f"[{name}{rank}]:")
                if log_line_prefixes is not None
                else f"[{name}{rank}]:"
            )
            shown = (Std.OUT not in redirected[rank], Std.ERR not in redirected[rank])
            context._start(rank, tuple(args[rank]), dict(envs[rank]), prefix, shown, start_method)
    except BaseException:
        context.close(signal.SIGKILL, 0)
        raise
    return context


class ProcessContext:
    """The processes of one :func:`start_processes` call."""

    def __init__(self, name: str, entrypoint: Any, log_dir: Path, nprocs: int) -> None:
        self.name = name
        self.entrypoint = entrypoint
        self.log_dir = log_dir
        self.nprocs = nprocs
        self._native = _native.Processes()
        self._result: RunProcsResult | None = None
        self._pids: list[int] = []

    def _dir(self, rank: int) -> Path:
        return self.log_dir / str(rank)

    def _start(
        self,
        rank: int,
        args: tuple,
        env: dict[str, str],
        prefix: str,
        shown: tuple[bool, bool],
        start_method: str,
    ) -> None:
        where = self._dir(rank)
        where.mkdir(parents=True, exist_ok=True)
        error_file = where / "error.json"
        env = {**env, ERROR_FILE_ENV: str(error_file)}
        if isinstance(self.entrypoint, str):
            program, argv = self.entrypoint, [str(a) for a in args]
        elif start_method == "fork":
            self._fork(rank, args, env, prefix, shown)
            return
        else:
            payload = where / "call.pickle"
            prep = multiprocessing.spawn.get_preparation_data(self.name)
            # multiprocessing's own connections' key: nothing here uses it, and
            # it refuses to be pickled outside multiprocessing's spawn.
            prep.pop("authkey", None)
            with open(payload, "wb") as f:
                pickle.dump(
                    {
                        "prep": prep,
                        "call": pickle.dumps((self.entrypoint, args)),
                        "result": str(where / "result.pickle"),
                    },
                    f,
                )
            program = sys.executable
            argv = ["-u", "-c", "from relaunch._spawn import main; main()", str(payload)]
        self._native.spawn(program, argv, list(env.items()), str(where), prefix, *shown)
        self._pids = self._native.pids()

    def _fork(
        self, rank: int, args: tuple, env: dict[str, str], prefix: str, shown: tuple[bool, bool]
    ) -> None:
        from relaunch import _spawn

        where = self._dir(rank)
        out, err = self._native.prepare_fork()
        parent = os.getpid()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.dup2(out, 1)
                os.dup2(err, 2)
                _native.become_worker(parent)
                os.environ.update(env)
                code = _spawn.call(self.entrypoint, args, str(where / "result.pickle"))
            except BaseException:
                traceback.print_exc()
            finally:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except Exception:
                        pass
                os._exit(code)
        self._native.adopt(pid, str(where), prefix, *shown)
        self._pids = self._native.pids()

    def pids(self) -> dict[int, int]:
        """Each local rank's pid."""
        return dict(enumerate(self._pids))

    def wait(self, timeout: float = -1, period: float = 1) -> RunProcsResult | None:
        """Waits until every process exited 0, or one failed (then the others
        are stopped: SIGTERM, 30 s, SIGKILL), and returns how they ended;
        None if that did not happen within ``timeout`` seconds (``-1``:
        however long it takes; ``0``: just look). ``period`` is accepted for
        torch's signature: exits are reported as they happen."""
        if self._result is not None:
            return self._result
        deadline = None if timeout < 0 else time.monotonic() + timeout
        while True:
            exits = self._native.exits()
            failed = [e for e in exits if e is not None and e != ("code", 0)]
            if failed or all(e is not None for e in exits):
                stopped = set()
                if failed:
                    # As torch: the first failure ends the others, which are
                    # then neither failures nor results.
                    stopped = {rank for rank, e in enumerate(exits) if e is None}
                    self._native.stop(signal.SIGTERM, 30.0)
                self._result = self._collect(self._native.exits(), stopped)
                self._native.close()
                return self._result
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            self._native.wait_change(1.0 if left is None else min(left, 1.0))

    def _collect(
        self, exits: list[tuple[str, int] | None], stopped: set[int] = frozenset()
    ) -> RunProcsResult:
        result = RunProcsResult()
        pids = self._pids
        for rank, exit in enumerate(exits):
            where = self._dir(rank)
            result.stdouts[rank] = str(where / "stdout.log")
            result.stderrs[rank] = str(where / "stderr.log")
            if rank in stopped:
                continue
            kind, value = exit if exit is not None else ("signal", signal.SIGKILL)
            if (kind, value) == ("code", 0):
                returned = where / "result.pickle"
                if returned.exists():
                    with open(returned, "rb") as f:
                        result.return_values[rank] = pickle.load(f)
                elif not isinstance(self.entrypoint, str):
                    result.return_values[rank] = None
                continue
            failure = ProcessFailure(
                local_rank=rank,
                pid=pids[rank],
                exitcode=value if kind == "code" else -value,
                error_file=str(where / "error.json"),
            )
            failure.message, failure.traceback = _read_error_file(Path(failure.error_file))
            if not failure.message:
                failure.message = (
                    f"exit code {value}" if kind == "code" else f"killed by {failure.signal_name()}"
                )
            result.failures[rank] = failure
        return result

    def close(self, death_sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Sends ``death_sig`` to every process still running, waits up to
        ``timeout`` seconds, then SIGKILL; returns once all have exited."""
        if self._result is None:
            self._native.stop(int(death_sig), float(timeout))
            self._result = self._collect(self._native.exits())
        self._native.close()

    def __enter__(self) -> ProcessContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_error_file(path: Path) -> tuple[str, str]:
    """The message and traceback of torch's error file format, if written."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return "", ""
    message = data.get("message", "")
    if isinstance(message, dict):
        info = message.get("extraInfo", {})
        return str(message.get("message", "")), str(info.get("py_callstack", ""))
    return str(message), ""
