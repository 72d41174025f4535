"""Experiment tracking: ``relaunch.init`` opens a run, ``run.log`` records metrics.

Every ``log`` call appends one record to a crash-safe spool on local disk and
returns (a few microseconds, no network); a background thread ships the
records to the tracking server, which stores each exactly once. Kill the
process at any point: what ``log`` returned for is in the spool, and the next
``relaunch.init`` of the same run (or ``relaunch sync DIR``) ships it.

Under ``relaunch run`` every rank joins the job's run on its own: the run id,
attempt, rank and server come from the environment the launcher sets.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import enum
import json
import math
import os
import sys
import threading
import traceback
from collections.abc import Iterable, Mapping
from pathlib import PurePath
from types import TracebackType

from relaunch import _native
from relaunch.errors import RelaunchError, TrackingConfigError

__all__ = ["Run", "init"]

EXIT_TIMEOUT_ENV = "RELAUNCH_EXIT_TIMEOUT"
"""Seconds an interpreter exit waits for the server to take what is left (default 30)."""

DEFAULT_EXIT_TIMEOUT = 30.0

# Every run this process opened and has not finished or closed, held
# strongly: the interpreter's exit ships what they logged, also for a run
# the script no longer references (opened in a function that returned, or
# by a framework's logger that was garbage collected before the exit).
_live: set[Run] = set()
_hooks_lock = threading.Lock()
_hooks_installed = False
_uncaught: str | None = None


def init(
    project: str | None = None,
    *,
    name: str | None = None,
    config: object = None,
    id: str | None = None,
    tags: Iterable[str] = (),
    notes: str | None = None,
    server: str | None = None,
    token: str | None = None,
    dir: str | os.PathLike[str] | None = None,
    offline: bool = False,
    rank: int | None = None,
) -> Run:
    """Open a run, or resume it when ``id`` names an existing one.

    ``server`` defaults to ``RELAUNCH_SERVER``; with neither (or with
    ``offline=True``) records stay in the spool under ``dir`` (default
    ``RELAUNCH_DIR``, else ``$XDG_STATE_HOME/relaunch/runs``, else
    ``~/.local/state/relaunch/runs``: out of the working tree) until
    ``relaunch sync`` uploads them. ``id`` defaults to ``RELAUNCH_RUN_ID`` (set by ``relaunch
    run``, the same across restarts), else a new id. ``config`` is any
    JSON-like mapping, a dataclass or an ``argparse.Namespace``; ``rank``
    defaults to ``RANK``. The server is never contacted here: a server that
    is down does not stop training.
    """
    for value, what in ((project, "project"), (name, "name"), (id, "id"), (notes, "notes")):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if isinstance(tags, str):
        raise TypeError("tags must be a list of str, not one str (wrap it: tags=[...])")
    tag_list = list(tags)
    for tag in tag_list:
        if not isinstance(tag, str):
            raise TypeError(f"each tag must be a str, not {type(tag).__name__}: {tag!r}")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
        raise TypeError(f"rank must be an int >= 0, not {rank!r}")
    native = _native.Run(
        project=project,
        id=id,
        name=name,
        config_json=_config_json(config),
        tags=tag_list,
        notes=notes,
        server=server,
        token=token,
        offline=bool(offline),
        dir=os.fspath(dir) if dir is not None else None,
        rank=rank,
    )
    run = Run(native)
    _install_hooks()
    _live.add(run)
    return run


def _holds_media(values: Mapping[str, object]) -> bool:
    from relaunch.media import is_media

    return any(is_media(v) or (isinstance(v, Mapping) and _holds_media(v)) for v in values.values())


def _split_media(
    values: Mapping[str, object], prefix: str, numbers: dict[str, object], media: dict[str, object]
) -> None:
    """Numbers and media apart, nested dicts' keys joined with ``/`` (as
    :meth:`Run.log` names them)."""
    from relaunch.media import is_media

    for key, value in values.items():
        if not isinstance(key, str):
            raise TypeError(f"a logged name is a str, not {type(key).__name__}")
        name = prefix + key
        if is_media(value):
            media[name] = value
        elif isinstance(value, Mapping) and _holds_media(value):
            _split_media(value, name + "/", numbers, media)
        else:
            numbers[name] = value


#: The levels of :meth:`Run.alert`.
ALERT_LEVELS = ("info", "warn", "error")


class Run:
    """An open run of this process. Create it with :func:`relaunch.init`.

    Usable as a context manager: leaving the block finishes the run, as
    failed when an exception left it.
    """

    __slots__ = ("__weakref__", "_log", "_native", "_next", "_state")

    def __init__(self, native: _native.Run) -> None:
        self._native = native
        self._log = native.log
        # The step a log() without one takes next (the client's own counter,
        # mirrored): where media saved between rows belong.
        self._next = 0
        # "open", "finished", "closed" (left unshipped in the spool), or
        # "disowned" (a forked child's copy).
        self._state = "open"

    @property
    def id(self) -> str:
        """The run's id: pass it as ``id=`` to resume the run later."""
        return self._native.id

    @property
    def rank(self) -> int:
        return self._native.rank

    @property
    def dir(self) -> str:
        """This process's spool directory."""
        return self._native.dir

    @property
    def server(self) -> str | None:
        """Where records are shipped; ``None`` when offline."""
        return self._native.server

    @property
    def attempt(self) -> int | None:
        """The attempt number the server gave this attempt, once it answered."""
        return self._native.attempt

    @property
    def pending(self) -> int:
        """Records not yet acknowledged by the server."""
        return self._native.pending

    def log(self, values: Mapping[str, object], step: int | None = None) -> int:
        """Record ``values`` (names to numbers; nested dicts become ``outer/inner``).

        Without ``step``, the step after the previous call's (0 first); with
        it, later calls continue from it. Values are Python numbers, numpy
        scalars or one-element tensors. Returns the step used. Never waits
        for the network.
        """
        try:
            used = self._log(values, step)
        except TypeError:
            if isinstance(values, Mapping) and _holds_media(values):
                used = self._log_media(values, step)
            elif isinstance(values, Mapping) and not isinstance(values, dict):
                used = self._log(dict(values), step)
            elif not isinstance(values, Mapping):
                raise TypeError(
                    f"log() takes a dict of names to numbers, not {type(values).__name__}"
                ) from None
            else:
                raise
        if used >= self._next:
            self._next = used + 1
        return used

    def event(self, kind: str, text: str = "", data: Mapping[str, object] | None = None) -> None:
        """Record an event of the run (``text`` says what happened, ``data`` adds detail)."""
        self._native.event(kind, text, None if data is None else json.dumps(_plain(data, "data")))

    def _log_media(self, values: Mapping[str, object], step: int | None) -> int:
        """:meth:`log` of values some of which are :class:`relaunch.Image`,
        :class:`relaunch.Video` or :class:`relaunch.Histogram`: the numbers as
        usual, then the media at the same step (:meth:`_save_media`)."""
        numbers: dict[str, object] = {}
        media: dict[str, object] = {}
        _split_media(values, "", numbers, media)
        used = self._log(numbers, step)
        self._save_media(media, used)
        return used

    def _save_media(self, media: Mapping[str, object], step: int) -> None:
        """Each image and video saved as a file of the run, named by its
        content (``media/KEY/STEP-DIGEST.FORMAT``), with a ``media`` event at
        ``step``; each histogram a ``histogram`` event. Logs no numbers, so
        the step counter of :meth:`log` is left as it is."""
        import tempfile

        from relaunch.media import Image, Video

        for key, item in media.items():
            if isinstance(item, (Image, Video)):
                name = f"media/{key}/{step}-{item.digest}.{item.format}"
                fd, tmp = tempfile.mkstemp(prefix=".media-", dir=os.path.dirname(self.dir))
                try:
                    with os.fdopen(fd, "wb") as f:
                        f.write(item.data)
                    self._native.save_file(tmp, name, True)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                data: dict[str, object] = {
                    "key": key,
                    "step": step,
                    "type": "image" if isinstance(item, Image) else "video",
                    "file": name,
                    "format": item.format,
                    "width": item.width,
                    "height": item.height,
                    "caption": item.caption,
                }
                if isinstance(item, Video):
                    data["frames"] = item.frames
                    data["fps"] = item.fps
                self._native.event("media", "", json.dumps(data))
            else:
                data = {"key": key, "step": step, **item.data()}  # type: ignore[attr-defined]
                self._native.event("histogram", "", json.dumps(data))

    def alert(self, title: str, text: str = "", level: str = "warn") -> None:
        """Raise an alert: the server posts it to its webhooks (``relaunch server
        --webhook URL``) and records the delivery as an event of the run.

        ``level`` is ``"info"``, ``"warn"`` or ``"error"``. Like :meth:`log`,
        it never waits for the network: the alert is spooled, and posted once
        the server has it.
        """
        if not isinstance(title, str) or not title.strip():
            raise ValueError("alert() needs a title: a short line saying what happened")
        if not isinstance(text, str):
            raise TypeError(f"alert() text must be a str, not {type(text).__name__}")
        if level not in ALERT_LEVELS:
            raise ValueError(
                f"alert() level {level!r} is not one of {', '.join(map(repr, ALERT_LEVELS))}"
            )
        self._native.event("alert", text, json.dumps({"title": title, "level": level}))

    def save_file(self, path: str | os.PathLike[str], name: str | None = None) -> str:
        """Saves the file at ``path`` to the run as ``name`` (a relative path such
        as ``ckpt/model.pt``; default: the file's own name).

        Returns at once: the file is snapshotted into the client directory (a
        hard link, else a copy), then uploaded in the background; only the
        chunks the server lacks travel. :meth:`flush` and :meth:`finish` wait
        for it. A crash before it is uploaded loses nothing: the next
        ``init`` of this run, or ``relaunch sync``, uploads it.
        """
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        return self._native.save_file(os.fspath(path), name, False)

    def save(self, obj: object, name: str) -> str:
        """``torch.save(obj)`` into the client directory, then :meth:`save_file`
        as ``name``: training waits only for the serialization."""
        import tempfile

        import torch

        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        fd, tmp = tempfile.mkstemp(prefix=".save-", dir=os.path.dirname(self.dir))
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(obj, f)
            return self._native.save_file(tmp, name, True)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def flush(self, timeout: float | None = None) -> None:
        """Return once the server has acknowledged everything logged so far.

        Raises :class:`~relaunch.TrackingTimeoutError` after ``timeout``
        seconds, or a :class:`~relaunch.TrackingError` at once when the
        server refuses the records (a wrong token, a size limit); nothing is
        lost either way. Offline, returns once the records are on disk.
        """
        self._native.flush(_timeout(timeout))

    def finish(self, timeout: float | None = None, *, error: str | None = None) -> None:
        """End the run: record it finished (or failed with ``error``) and flush.

        Raises like :meth:`flush`; the records then stay in the spool and the
        next ``init`` of this run or ``relaunch sync`` ships them.
        """
        self._native.finish(_timeout(timeout), error)
        self._state = "finished"
        _live.discard(self)

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Finishes the run, waiting at most ``RELAUNCH_EXIT_TIMEOUT`` seconds (30).

        When the block raised, its exception is what propagates: a server
        that does not take everything in time is reported on stderr, the
        records kept in the spool. Otherwise that failure raises, as
        :meth:`finish` does.
        """
        error = None
        if kind is not None:
            error = "".join(traceback.format_exception(kind, value, tb))[-8000:]
        try:
            self.finish(_exit_timeout(), error=error)
        except RelaunchError as e:
            if kind is None:
                raise
            _report_unshipped(self, e)

    def __repr__(self) -> str:
        where = self.server or f"offline in {self.dir}"
        return f"<relaunch.Run {self.id} rank {self.rank} -> {where}>"


def _timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be seconds (int or float), not {type(timeout).__name__}")
    if not math.isfinite(timeout) or timeout < 0:
        raise TrackingConfigError(
            f"timeout must be a finite number of seconds >= 0, got {timeout!r}"
        )
    return float(timeout)


def _config_json(config: object) -> str | None:
    if config is None:
        return None
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    elif isinstance(config, argparse.Namespace):
        config = vars(config)
    if not isinstance(config, Mapping):
        raise TypeError(
            "config must be a mapping, a dataclass or an argparse.Namespace, "
            f"not {type(config).__name__}"
        )
    return json.dumps(_plain(config, "config"))


def _plain(value: object, path: str, depth: int = 0) -> object:
    """``value`` as plain JSON data; what JSON cannot hold becomes its ``str``."""
    if depth > 64:
        raise ValueError(f"{path} is nested deeper than 64 levels; is a container inside itself?")
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{path}.{k}", depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value), path, depth + 1)
    if isinstance(value, enum.Enum):
        return _plain(value.value, path, depth + 1)
    if isinstance(value, PurePath):
        return str(value)
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        try:
            return _plain(item(), path, depth + 1)
        except (TypeError, ValueError):
            pass
    return str(value)


def _install_hooks() -> None:
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        _hooks_installed = True
    previous = sys.excepthook

    def excepthook(kind, value, tb):  # type: ignore[no-untyped-def]
        global _uncaught
        _uncaught = "".join(traceback.format_exception(kind, value, tb))[-8000:]
        previous(kind, value, tb)

    sys.excepthook = excepthook
    atexit.register(_at_exit)
    os.register_at_fork(after_in_child=_after_fork)


def _after_fork() -> None:
    for run in list(_live):
        if run._state == "open":
            run._native._disown()
            run._state = "disowned"
        _live.discard(run)


def _exit_timeout() -> float:
    text = os.environ.get(EXIT_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_EXIT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not math.isfinite(seconds) or seconds < 0:
        print(
            f"relaunch: {EXIT_TIMEOUT_ENV}={text!r} is not seconds >= 0; "
            f"using {DEFAULT_EXIT_TIMEOUT:g}",
            file=sys.stderr,
        )
        return DEFAULT_EXIT_TIMEOUT
    return seconds


def _at_exit() -> None:
    """Finish runs the script left open; leave what cannot be shipped in the spool, loudly."""
    runs = [run for run in list(_live) if run._state == "open"]
    if not runs:
        return
    timeout = _exit_timeout()
    for run in runs:
        try:
            run._native.finish(timeout, _uncaught)
            run._state = "finished"
            _live.discard(run)
        except (RelaunchError, KeyboardInterrupt) as e:
            _report_unshipped(run, e)


def _report_unshipped(run: Run, error: BaseException) -> None:
    """Says on stderr why the server does not have everything and where the rest is."""
    client_dir = os.path.dirname(os.path.dirname(run.dir))
    print(
        f"relaunch: run {run.id}: {error}\n"
        f"relaunch: what was not shipped is kept in {run.dir}; the next init of run "
        f"{run.id} ships it, or run `relaunch sync {client_dir}`",
        file=sys.stderr,
    )
    run._native.close()
    run._state = "closed"
    _live.discard(run)
