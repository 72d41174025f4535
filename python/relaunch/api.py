"""Reading runs back: ``relaunch.Api`` lists runs (filtered on status, tags,
config and latest metric values) and reads a run's config, summary, full
history (into pandas or polars, every point exact), events, console lines and
files, through relaunch's client (its server list, token, replicas and
failover).

    api = relaunch.Api()                      # RELAUNCH_SERVER, RELAUNCH_SERVER_TOKEN
    for run in api.runs("vision", {"config.lr": 0.01, "status": "finished"}):
        df = run.history(["loss", "acc"])     # one row per (rank, step)

A history is read in the server's column format (``relaunch_api::columns``:
28 bytes a point, mapped by numpy without parsing), never sampled: NaN and
the infinities stay what was logged, steps stay int64.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relaunch import _native
from relaunch.errors import (
    TrackingConfigError,
    TrackingConnectionError,
    TrackingRejectedError,
    TrackingTimeoutError,
)

if TYPE_CHECKING:
    import pandas

SERVER_ENV = "RELAUNCH_SERVER"
TOKEN_ENV = "RELAUNCH_SERVER_TOKEN"
STATUSES = ("running", "preempted", "restarting", "failed", "finished")
OPERATORS = ("$eq", "$ne", "$lt", "$lte", "$gt", "$gte", "$in")
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _number(value: object) -> float:
    """A metric value as the server's JSON carries it (non-finite as strings)."""
    if isinstance(value, str):
        return _NON_FINITE[value]
    return math.nan if value is None else float(value)  # type: ignore[arg-type]


def _matches(actual: object, condition: object) -> bool:
    """``condition`` is a value (equality) or ``{"$lt": 3, ...}``, all of which must hold."""
    if not (
        isinstance(condition, Mapping) and condition and all(k in OPERATORS for k in condition)
    ):
        return actual == condition
    for op, operand in condition.items():
        if op == "$in":
            if actual not in operand:
                return False
            continue
        if op in ("$eq", "$ne"):
            if (actual == operand) != (op == "$eq"):
                return False
            continue
        if actual is None or isinstance(actual, bool) or not isinstance(actual, (int, float)):
            return False
        ok = {
            "$lt": actual < operand,
            "$lte": actual <= operand,
            "$gt": actual > operand,
            "$gte": actual >= operand,
        }[op]
        if not ok:
            return False
    return True


# Runs a listing reads a request.
_PAGE = 10_000

# How the server writes each operator of a filter.
_SIGNS = {"$eq": "=", "$ne": "!=", "$lt": "<", "$lte": "<=", "$gt": ">", "$gte": ">="}


def _server_terms(name: str, condition: object, *, config: bool) -> list[str] | None:
    """``condition`` on config path or metric ``name`` as the server's
    ``param=``/``metric=`` terms, or ``None`` when the server cannot apply
    it (``$in``, NaN, an order on a non-number, a metric that is not a
    number), and it is applied here instead."""
    if any(c in name for c in "=<>!"):
        return None
    ops = condition if isinstance(condition, Mapping) and condition else {"$eq": condition}
    if not all(op in _SIGNS for op in ops):
        return None
    terms = []
    for op, operand in ops.items():
        number = isinstance(operand, (int, float)) and not isinstance(operand, bool)
        if number and operand != operand:
            return None
        if config:
            if number and operand in (float("inf"), float("-inf")):
                return None
            if not number and not (op in ("$eq", "$ne") and isinstance(operand, (str, bool))):
                return None
            if isinstance(operand, bool) and op != "$eq" and op != "$ne":
                return None
            terms.append(f"{name}{_SIGNS[op]}{json.dumps(operand)}")
        else:
            if not number:
                return None
            terms.append(f"{name}{_SIGNS[op]}{float(operand)!r}")
    return terms


def _dotted(config: object, path: str) -> object:
    for part in path.split("."):
        if not isinstance(config, Mapping) or part not in config:
            return None
        config = config[part]
    return config


class Api:
    """The runs of one relaunch server (or several replicas of it).

    ``server`` defaults to ``RELAUNCH_SERVER`` and ``token`` to
    ``RELAUNCH_SERVER_TOKEN``; ``timeout`` is how long one call may take."""

    def __init__(
        self, server: str | None = None, token: str | None = None, *, timeout: float = 60.0
    ) -> None:
        server = server or os.environ.get(SERVER_ENV, "").strip()
        if not server:
            raise TrackingConfigError(
                f"no relaunch server: pass Api(server='http://HOST:8765') or set {SERVER_ENV}"
            )
        if token is None:
            token = os.environ.get(TOKEN_ENV, "").strip() or None
        if not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout={timeout!r} is not a number of seconds > 0")
        self.server = ",".join(_native.server_list(server))
        self.token = token
        self.timeout = float(timeout)
        self._client = _native.ServerApi(self.server, token)

    def __repr__(self) -> str:
        return f"relaunch.Api({self._client.url!r})"

    # -- calls --------------------------------------------------------------

    def _call(self, what: str, call: Any, *args: object) -> tuple[int, Any]:
        try:
            return call(*args, self.timeout)
        except TrackingTimeoutError as e:
            raise TrackingTimeoutError(f"{e}; pass Api(timeout=...) if it is just slow") from None
        except TrackingConnectionError as e:
            raise TrackingConnectionError(
                f"{e}; is `relaunch server` running there, and is {SERVER_ENV} its address?"
            ) from None

    def _expect(self, status: int, body: str | bytes | bytearray, what: str) -> None:
        if 200 <= status < 300:
            return
        text = body.decode(errors="replace") if isinstance(body, (bytes, bytearray)) else body
        try:
            text = json.loads(text).get("error", text)
        except (ValueError, AttributeError):
            pass
        if status in (401, 403):
            hint = (
                f"set {TOKEN_ENV} or pass Api(token=...) to the server's --token"
                if not self.token
                else f"the token is not the server's --token ({TOKEN_ENV} or Api(token=...))"
            )
            raise TrackingRejectedError(f"{what}: {text}; {hint}")
        if status == 404:
            raise LookupError(f"{what}: {text}")
        raise TrackingRejectedError(f"{what}: the server answered {status}: {text}")

    def _get(self, what: str, path: str, query: Iterable[tuple[str, str]] = ()) -> Any:
        status, body = self._call(what, self._client.get, path, list(query))
        self._expect(status, body, what)
        return json.loads(body)

    # -- runs ---------------------------------------------------------------

    def runs(
        self,
        project: str | None = None,
        filters: Mapping[str, object] | None = None,
        *,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """The runs of ``project`` (every project when ``None``), newest first,
        that pass every filter:

        - ``"status"``: one of running, preempted, restarting, failed,
          finished (or ``{"$in": [...]}``);
        - ``"tags"`` (or ``"tag"``): a tag the run has;
        - ``"config.PATH"``: a config value at a dotted path;
        - ``"summary.KEY"``: the newest value of metric KEY (lowest rank).

        A value means equality; ``{"$lt": 0.5}`` (also ``$lte``, ``$gt``,
        ``$gte``, ``$ne``, ``$eq``, ``$in``) compares. The server applies
        every filter it can (all but ``$in``, NaN equality and orders on
        non-numbers, which are applied here), and the listing is read a page
        of 10,000 runs at a time however many runs match."""
        filters = dict(filters or {})
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f"limit={limit!r} is not a whole number >= 1")
        query: list[tuple[str, str]] = []
        if project is not None:
            query.append(("project", str(project)))
        local: list[tuple[str, object]] = []
        summary_keys: list[str] = []
        for name, condition in filters.items():
            if not isinstance(name, str):
                raise TypeError(f"a filter's name must be a str, not {type(name).__name__}")
            operator = isinstance(condition, Mapping)
            if name == "status":
                statuses = condition.get("$in", []) if operator else [condition]  # type: ignore[union-attr]
                bad = [s for s in statuses if s not in STATUSES]
                if bad or (operator and set(condition) - {"$in", "$eq", "$ne"}):  # type: ignore[arg-type]
                    raise ValueError(
                        f"status filter {condition!r}: a status is one of {', '.join(STATUSES)}"
                    )
                if operator:
                    local.append(("status", condition))
                else:
                    query.append(("status", str(condition)))
            elif name in ("tags", "tag"):
                if operator or not isinstance(condition, str):
                    raise ValueError(f"{name} filter {condition!r}: give one tag, as a str")
                query.append(("tag", condition))
            elif name.startswith("config.") and len(name) > len("config."):
                terms = _server_terms(name[len("config.") :], condition, config=True)
                if terms is None:
                    local.append((name, condition))
                else:
                    query.extend(("param", t) for t in terms)
            elif name.startswith("summary.") and len(name) > len("summary."):
                terms = _server_terms(name[len("summary.") :], condition, config=False)
                if terms is None:
                    summary_keys.append(name[len("summary.") :])
                    local.append((name, condition))
                else:
                    query.extend(("metric", t) for t in terms)
            else:
                raise ValueError(
                    f"unknown filter {name!r}: filter on 'status', 'tags', 'config.PATH' "
                    "or 'summary.KEY'"
                )
        wanted = None if local else limit
        infos = self._pages("listing runs", "/runs", query, wanted)
        listing = _Listing(self, query, len(infos))
        summaries: dict[str, dict[str, float]] = {}
        for key in dict.fromkeys(summary_keys):
            for row in listing.pages(
                f"reading the newest {key!r} of every run", "/latest", [("key", key)]
            ):
                summaries.setdefault(row["run"], {})[key] = _number(row["value"])
        runs = []
        for info in infos:
            record = RunRecord(self, info, listing)
            ok = True
            for name, condition in local:
                if name == "status":
                    actual: object = info["status"]
                elif name.startswith("config."):
                    actual = _dotted(info.get("config"), name[len("config.") :])
                else:
                    actual = summaries.get(info["id"], {}).get(name[len("summary.") :])
                if not _matches(actual, condition):
                    ok = False
                    break
            if ok:
                runs.append(record)
            if limit is not None and len(runs) == limit:
                break
        return runs

    def _pages(
        self, what: str, path: str, query: list[tuple[str, str]], limit: int | None
    ) -> list[Any]:
        """Every run of a listing (at most ``limit``), a page at a time; a
        run created meanwhile shifts the pages, so one seen twice is kept
        once."""
        rows: list[Any] = []
        seen: set[str] = set()
        offset = 0
        while limit is None or len(rows) < limit:
            size = _PAGE if limit is None else min(_PAGE, limit - len(rows))
            page = self._get(what, path, [*query, ("limit", str(size)), ("offset", str(offset))])
            for row in page:
                if row["id"] not in seen:
                    seen.add(row["id"])
                    rows.append(row)
            if len(page) < size:
                break
            offset += len(page)
        return rows

    def run(self, id: str) -> RunRecord:
        """Run ``id``; ``LookupError`` if the server has none of that id."""
        if not isinstance(id, str):
            raise TypeError(f"a run id is a str, not {type(id).__name__}")
        return RunRecord(self, self._get(f"reading run {id}", f"/runs/{id}"))


class RunRecord:
    """A run as the server keeps it: read with :meth:`Api.run` or :meth:`Api.runs`.

    The attributes are those of the moment it was read; :meth:`refresh` reads
    them again. ``config`` is the run's config, ``summary`` the newest value
    of each metric."""

    def __init__(self, api: Api, info: Mapping[str, Any], listing: _Listing | None = None) -> None:
        self._api = api
        self._listing = listing
        self._set(info)

    def _set(self, info: Mapping[str, Any]) -> None:
        self.id: str = info["id"]
        self.project: str = info["project"]
        self.name: str = info["name"]
        self.status: str = info["status"]
        self.tags: list[str] = list(info.get("tags", []))
        self.notes: str = info.get("notes", "")
        self.config: dict[str, Any] = dict(info.get("config") or {})
        self.created_at: float = info["created_at"]
        self.updated_at: float = info["updated_at"]
        self.attempts: int = info["attempts"]
        self._summary: dict[str, float] | None = None

    def __repr__(self) -> str:
        return f"<relaunch run {self.id} ({self.project}, {self.status})>"

    def refresh(self) -> RunRecord:
        self._set(self._api._get(f"reading run {self.id}", f"/runs/{self.id}"))
        self._listing = None
        return self

    @property
    def summary(self) -> dict[str, float]:
        """The newest value of each metric (of the lowest rank that logged it).

        For runs from one :meth:`Api.runs` call, the first ``summary`` read
        fetches every listed run's at once (a few requests however many
        runs), so reading all their summaries costs about what one does."""
        if self._summary is None and self._listing is not None:
            self._summary = self._listing.summary(self.id)
        if self._summary is None:
            latest = self._api._get(
                f"reading the newest values of run {self.id}", f"/runs/{self.id}/latest"
            )
            summary: dict[str, float] = {}
            for row in sorted(latest, key=lambda r: r["rank"], reverse=True):
                summary[row["key"]] = _number(row["value"])
            self._summary = dict(sorted(summary.items()))
        return self._summary

    def history(
        self,
        keys: str | Iterable[str] | None = None,
        *,
        rank: int | None = None,
        attempt: int | None = None,
        min_step: int | None = None,
        max_step: int | None = None,
        layout: str = "wide",
        format: str = "pandas",
    ) -> Any:
        """Every point of ``keys`` (every metric when ``None``), unsampled.

        By default each step holds the value of the newest attempt that
        logged it (a resumed run's history reads as one); ``attempt=N`` reads
        that attempt's points only. ``layout="wide"``: one row per (rank,
        step), a column per key (NaN where a key has no point; the last value
        when one step was logged twice). ``layout="long"``: one row per point,
        columns rank, step, key, value, wall (seconds since the epoch),
        attempt. ``format``: ``"pandas"`` or ``"polars"``."""
        if isinstance(keys, str):
            keys = [keys]
        keys = list(keys) if keys is not None else []
        for key in keys:
            if not isinstance(key, str):
                raise TypeError(f"a key is a str, not {type(key).__name__}")
        for name, value in (("rank", rank), ("attempt", attempt)):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0
            ):
                raise ValueError(f"{name}={value!r} is not a whole number >= 0")
        for name, value in (("min_step", min_step), ("max_step", max_step)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"{name}={value!r} is not a whole number")
        if layout not in ("wide", "long"):
            raise ValueError(f"layout={layout!r}: use 'wide' or 'long'")
        if format not in ("pandas", "polars"):
            raise ValueError(f"format={format!r}: use 'pandas' or 'polars'")
        what = f"reading the history of run {self.id}"
        status, body = self._api._call(
            what, self._api._client.history, self.id, keys, rank, attempt, min_step, max_step
        )
        self._api._expect(status, body, what)
        frame = _frame(_columns(body), layout)
        if format == "polars":
            try:
                import polars
            except ImportError:
                raise ImportError("format='polars' needs polars: pip install polars") from None
            return polars.from_pandas(frame, include_index=False)
        return frame

    def events(self) -> list[dict[str, Any]]:
        """What happened to the run (start, preemption, failure and its root
        cause, restart, finish, alerts), oldest first."""
        return self._api._get(f"reading the events of run {self.id}", f"/runs/{self.id}/events")

    def goodput(self) -> dict[str, Any]:
        """Where the run's wall time went, as the server computes it now from
        the run's events and the times its steps were logged.

        ``goodput`` is productive time over wall time (0 to 1; None when no
        step was ever logged), ``wall_s`` the first attempt's start to the
        last one's end (now while ``running``), ``productive_s`` the time on
        steps no later attempt redid; the rest is ``startup_s`` (starts to
        first steps), ``rerun_s`` (steps a later attempt did again,
        ``steps_re_run`` of them), ``stop_s`` (last steps to ends) and
        ``restart_s`` (ends to the next starts), in seconds. ``attempts``
        has one flat dict per attempt, oldest first, with the same
        durations (they add up to ``wall_s``), so
        ``pandas.DataFrame(run.goodput()["attempts"])`` is a table of them;
        ``interruptions`` one per restart or relaunch, with ``lost_s``."""
        return self._api._get(f"reading the goodput of run {self.id}", f"/runs/{self.id}/goodput")

    def media(self, key: str | None = None) -> list[dict[str, Any]]:
        """The images and videos logged (of ``key`` only, when given), oldest
        first: ``{"key", "step", "type", "file", "format", "width", "height",
        "caption", "attempt", "wall"}``, ``type`` being ``"image"`` or
        ``"video"`` (a video also has ``"frames"`` and ``"fps"``, None for a
        file logged as it was); :meth:`image` and :meth:`video` read one."""
        return self._logged("media", key)

    def histograms(self, key: str | None = None) -> list[dict[str, Any]]:
        """The histograms logged (of ``key`` only, when given), oldest first:
        ``{"key", "step", "counts", "edges", "nonfinite", "attempt", "wall"}``."""
        return self._logged("histogram", key)

    def _logged(self, kind: str, key: str | None) -> list[dict[str, Any]]:
        if key is not None and not isinstance(key, str):
            raise TypeError(f"key is a str, not {type(key).__name__}")
        out = []
        for event in self.events():
            data = event.get("data")
            if event["kind"] != kind or not isinstance(data, dict):
                continue
            if key is None or data.get("key") == key:
                out.append({**data, "attempt": event["attempt"], "wall": event["wall"]})
        return out

    def image(self, entry: dict[str, Any] | str) -> bytes:
        """The encoded bytes (PNG, JPEG or GIF) of an image :meth:`media`
        listed, or of its ``file``; ``PIL.Image.open(io.BytesIO(...))`` opens
        them. A video's entry gives its bytes too."""
        name = entry["file"] if isinstance(entry, dict) else entry
        if not isinstance(name, str) or not name.startswith("media/"):
            raise ValueError(f"{name!r} is not a media file of the run (one media() lists)")
        import tempfile

        with tempfile.TemporaryDirectory(prefix="relaunch-media-") as tmp:
            path = self.download(name, Path(tmp) / "media")
            return path.read_bytes()

    def video(self, entry: dict[str, Any] | str) -> bytes:
        """The encoded bytes (GIF, MP4 or WebM, as its ``format`` says) of a
        video :meth:`media` listed, or of its ``file``."""
        return self.image(entry)

    def logs(self, rank: int | None = None) -> list[dict[str, Any]]:
        """Every console line of the run (of one rank when given), oldest
        first: ``{"id", "rank", "stream", "attempt", "wall", "text"}``."""
        lines: list[dict[str, Any]] = []
        after = 0
        while True:
            query = [("after", str(after)), ("limit", "10000")]
            if rank is not None:
                query.append(("rank", str(rank)))
            page = self._api._get(
                f"reading the console of run {self.id}", f"/runs/{self.id}/logs", query
            )
            # A page also ends at the server's byte budget (8 MiB of text):
            # read on until a page comes back empty.
            if not page:
                return lines
            lines.extend(page)
            after = page[-1]["id"]

    def files(self) -> list[dict[str, Any]]:
        """The run's files: name, size, BLAKE3 and when each was committed."""
        return self._api._get(f"listing the files of run {self.id}", f"/runs/{self.id}/files")

    def download(self, name: str, path: str | os.PathLike[str] | None = None) -> Path:
        """Downloads file ``name`` to ``path`` (see :func:`relaunch.download`:
        verified, resumable); returns where it is."""
        from relaunch.files import download

        return download(self.id, name, path, server=self._api.server, token=self._api.token).path


class _Listing:
    """The runs one :meth:`Api.runs` call selected on the server, whose
    summaries are read together when the first is wanted: the metric names
    of those runs (``/keys``), then the newest value of each in every run
    (``/latest``, at most ``_LATEST_KEYS`` names a request), a page of runs
    at a time."""

    _LATEST_KEYS = 100

    def __init__(self, api: Api, query: list[tuple[str, str]], runs: int) -> None:
        self._api = api
        self._query = query
        self._runs = runs
        self._summaries: dict[str, dict[str, float]] | None = None

    def pages(self, what: str, path: str, extra: list[tuple[str, str]]) -> list[Any]:
        """``path`` (``/keys`` or ``/latest``) read for each page of the
        listing's runs, in the listing's order; the answers concatenated."""
        rows: list[Any] = []
        for offset in range(0, max(self._runs, 1), _PAGE):
            page = [("limit", str(_PAGE)), ("offset", str(offset))]
            rows.extend(self._api._get(what, path, [*self._query, *extra, *page]))
        return rows

    def summary(self, run: str) -> dict[str, float]:
        if self._summaries is None:
            keys = sorted(set(self.pages("listing the runs' metrics", "/keys", [])))
            found: dict[str, dict[str, float]] = {}
            for at in range(0, len(keys), self._LATEST_KEYS):
                chunk = keys[at : at + self._LATEST_KEYS]
                rows = self.pages(
                    "reading the runs' newest values", "/latest", [("key", k) for k in chunk]
                )
                for row in rows:
                    found.setdefault(row["run"], {})[row["key"]] = _number(row["value"])
            self._summaries = {run: dict(sorted(v.items())) for run, v in found.items()}
        return dict(self._summaries.get(run, {}))


def _columns(body: bytearray) -> list[tuple[str, int, Any, Any, Any, Any]]:
    """The series of a column body: (key, rank, steps, values, walls, attempts),
    numpy arrays over ``body`` itself (no copy; writable, as ``body`` is)."""
    import numpy

    if body[:4] != b"RLC1":
        raise TrackingRejectedError("the history is not in relaunch's column format")
    (count,) = struct.unpack_from("<I", body, 4)
    at = 8
    series = []
    for _ in range(count):
        (length,) = struct.unpack_from("<H", body, at)
        key = body[at + 2 : at + 2 + length].decode()
        rank, n = struct.unpack_from("<IQ", body, at + 2 + length)
        at = (at + 2 + length + 12 + 7) // 8 * 8
        arrays = []
        for dtype, size in (("<i8", 8), ("<f8", 8), ("<f8", 8), ("<u4", 4)):
            arrays.append(numpy.frombuffer(body, dtype=dtype, count=n, offset=at))
            at += n * size
        steps, values, walls, attempts = arrays
        at = (at + 7) // 8 * 8
        series.append((key, rank, steps, values, walls, attempts))
    return series


def _frame(series: list[tuple[str, int, Any, Any, Any, Any]], layout: str) -> pandas.DataFrame:
    import numpy
    import pandas

    if layout == "long":
        if not series:
            return pandas.DataFrame(
                {
                    "rank": numpy.array([], "u4"),
                    "step": numpy.array([], "i8"),
                    "key": pandas.Categorical([]),
                    "value": numpy.array([], "f8"),
                    "wall": numpy.array([], "f8"),
                    "attempt": numpy.array([], "u4"),
                }
            )
        names = sorted({s[0] for s in series})
        codes = {name: i for i, name in enumerate(names)}
        return pandas.DataFrame(
            {
                "rank": numpy.concatenate([numpy.full(len(s[2]), s[1], "u4") for s in series]),
                "step": numpy.concatenate([s[2] for s in series]),
                "key": pandas.Categorical.from_codes(
                    numpy.concatenate([numpy.full(len(s[2]), codes[s[0]], "i4") for s in series]),
                    names,
                ),
                "value": numpy.concatenate([s[3] for s in series]),
                "wall": numpy.concatenate([s[4] for s in series]),
                "attempt": numpy.concatenate([s[5] for s in series]),
            }
        )
    by_rank: dict[int, dict[str, tuple[Any, Any]]] = {}
    for key, rank, steps, values, _, _ in series:
        by_rank.setdefault(rank, {})[key] = (steps, values)
    frames = []
    for rank in sorted(by_rank):
        columns = by_rank[rank]
        keys = sorted(columns)
        steps = columns[keys[0]][0]
        # The usual case, keys logged together: one step array, no join.
        if all(numpy.array_equal(columns[k][0], steps) for k in keys[1:]):
            # Views of the answer's buffer (a bytearray of this call's own),
            # not copies.
            ranks = numpy.full(len(steps), rank, "u4")
            wide = pandas.DataFrame(
                {"rank": ranks, "step": steps, **{k: columns[k][1] for k in keys}}, copy=False
            )
            frames.append(wide)
            continue
        joined = []
        for k in keys:
            column = pandas.Series(columns[k][1], index=columns[k][0], name=k)
            if not column.index.is_unique:
                column = column[~column.index.duplicated(keep="last")]
            joined.append(column)
        wide = pandas.concat(joined, axis=1, sort=True)
        wide.index.name = "step"
        wide = wide.reset_index()
        wide.insert(0, "rank", numpy.full(len(wide), rank, "u4"))
        frames.append(wide)
    if not frames:
        return pandas.DataFrame({"rank": numpy.array([], "u4"), "step": numpy.array([], "i8")})
    if len(frames) == 1:
        return frames[0]
    return pandas.concat(frames, ignore_index=True, sort=False)
