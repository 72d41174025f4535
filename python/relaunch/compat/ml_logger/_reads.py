"""Reading back the ml-logger way: ``parameters.pkl`` and ``metrics.pkl`` as
ml-logger's run folders had them, ``glob`` over runs, ``read_metrics`` /
``get_dataframe`` and ``get_exps``.

A relaunch run keeps its params as its config and its metrics as series,
not as files, so they are read as the files they were in ml-logger:

``parameters.pkl`` (under a ``Prefix`` of the run: that part of the params)
    one record, the params as a dict (``load_pkl`` gives ``[params]``,
    which ``functools.reduce(assign, ...)`` reads as before).
``metrics.pkl``, ``eval.pkl``, ``eval/metrics.pkl`` ...
    the rows logged into it (``flush(file="eval.pkl")`` or under
    ``Prefix("eval")`` logged keys ``eval/...``), one dict a row, the rows
    in step order (then rank). A real file of the run with that name is
    read instead, when there is one.

``glob`` lists the run's files and folders and these two, and looks across
runs: a prefix above runs (``Prefix("..")``, ``wd="/alice/demo"``, a query
starting with ``/``) lists every run below it (by its name, which is its
prefix) with its files, ``parameters.pkl`` and ``metrics.pkl``.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from relaunch.errors import TrackingConfigError

from ._api import _Api, _token
from ._metrics import ROW_TEXTS
from ._names import (
    _file_name,
    _file_scope,
    _glob_regex,
    _key,
    _parts,
    _prefix_parts,
    pJoin,
    run_ids,
)
from ._values import _dot_flatten

if TYPE_CHECKING:
    import pandas

PARAMS_NAME = "parameters.pkl"
METRICS_NAME = "metrics.pkl"
METRICS_REMOVED = "ml-logger.metrics-removed"
"""The event ``remove("metrics.pkl")`` records (data: the scope, a key prefix
of the run): ml-logger's reads of the scope skip the rows logged before it."""
_PAGE = 10_000


@dataclass
class _Entry:
    """What a path of a glob is: a ``file`` (``name`` in run ``run_id``), a
    ``folder``, or the run's ``params`` / ``metrics`` (``scope``: the parts
    of the run they are under)."""

    kind: str
    run_id: str
    name: str | None = None
    scope: list[str] = field(default_factory=list)
    config: dict | None = None


def _get(api: _Api, what: str, path: str, query: list[tuple[str, str]]) -> Any:
    status, answer = api._answer(api.client.get, path, query)
    if status == 404:
        return None
    return api.expect(status, answer, what)


def _subtree(config: object, parts: Iterable[str]) -> dict | None:
    for part in parts:
        config = config.get(part) if isinstance(config, dict) else None
    return config if isinstance(config, dict) and config else None


def _after_removals(long: pandas.DataFrame, events: list[dict]) -> pandas.DataFrame:
    """The rows of ``long`` (a run's history) that no later
    ``remove("metrics.pkl")`` of their scope hid (see ``METRICS_REMOVED``)."""
    keys = None
    for event in events:
        data = event.get("data")
        if event.get("kind") != METRICS_REMOVED or not isinstance(data, dict):
            continue
        if keys is None:
            keys = long["key"].astype(str)
        scope = str(data.get("scope") or "")
        hidden = long["wall"] < float(event["wall"])
        if scope:
            hidden &= keys.str.startswith(scope + "/")
        long, keys = long[~hidden], keys[~hidden]
    return long


def _row_texts(events: list[dict], long: pandas.DataFrame) -> pandas.DataFrame:
    """The text values of the metrics rows (``ROW_TEXTS`` events) in
    ``long``'s layout, each at the wall time of the row its numbers were
    logged in (the newest of its step and rank logged before the event),
    or at its own for a row without numbers."""
    import pandas

    rows = []
    for event in events:
        data = event.get("data")
        if event.get("kind") != ROW_TEXTS or not isinstance(data, dict):
            continue
        texts, step, rank = data.get("texts"), data.get("step"), data.get("rank")
        if not isinstance(texts, dict) or not isinstance(step, int) or not isinstance(rank, int):
            continue
        wall, alone = float(event["wall"]), bool(data.get("alone"))
        rows.extend((wall, step, rank, str(key), value, alone) for key, value in texts.items())
    columns = ["wall", "step", "rank", "key", "value", "alone"]
    texts_long = pandas.DataFrame(rows, columns=columns)
    if texts_long.empty or long.empty:
        return texts_long.drop(columns="alone")
    logged = long[["wall", "step", "rank"]].drop_duplicates().rename(columns={"wall": "row"})
    logged = logged.astype({"step": "int64", "rank": "int64"}).sort_values("row")
    attached = texts_long[~texts_long["alone"]].astype({"step": "int64", "rank": "int64"})
    attached = pandas.merge_asof(
        attached.sort_values("wall"), logged, left_on="wall", right_on="row",
        by=["step", "rank"], direction="backward",
    )  # fmt: skip
    attached["wall"] = attached["row"].fillna(attached["wall"])
    out = pandas.concat([attached.drop(columns="row"), texts_long[texts_long["alone"]]])
    return out.drop(columns="alone")


class _ReadsMixin:
    """The reading methods of ``ML_Logger`` that see params and metrics as files."""

    # --- where a key is ----------------------------------------------------------------

    def _locate(self, keys: tuple[object, ...], path: object = None) -> tuple[bool, str, str]:
        """(own run, run id, name in the run) of a file key, like ``_target``;
        when the prefix names no run, the run is the longest part of prefix
        and key that names one (``Prefix("/alice/demo")`` then
        ``"run-1/metrics.pkl"`` is ``metrics.pkl`` of run ``alice/demo/run-1``)."""
        own, run_id, name = self._target(keys, path)
        if own:
            return own, run_id, name
        api = self._api()
        if api.run(run_id) is not None:
            return own, run_id, name
        key = _key(keys, path)
        _, key_parts = _parts(key, "file name")
        base = self._prefix.split("/") if self._prefix else []
        whole = [*base, *key_parts]
        mine = self._run_prefix.split("/")
        if whole[: len(mine)] == mine and len(whole) > len(mine):
            return True, self._own_id(), _file_name(whole[len(mine) :], key)
        for i in range(len(whole) - 1, len(base), -1):
            candidate = run_ids("/".join(whole[:i]))[1]
            if api.run(candidate) is not None:
                return False, candidate, _file_name(whole[i:], key)
        return own, run_id, name

    def _fresh(self, own: bool) -> None:
        """For the logger's own run: what it logged and saved is on the server first."""
        if own and self._run is not None:
            self._on_server()
            self._run.flush(self.timeout)

    # --- params and metrics as files ----------------------------------------------------------

    @staticmethod
    def _virtual(name: str) -> tuple[str, list[str]] | None:
        """``("params", parts)`` or ``("metrics", scope)`` when ``name`` is
        ml-logger's params or metrics file (its real file aside)."""
        parts = name.split("/")
        if parts[-1] == PARAMS_NAME:
            return "params", parts[:-1]
        if parts[-1] == METRICS_NAME:
            return "metrics", parts[:-1]
        return None

    def _params_of(self, run_id: str, parts: list[str]) -> dict | None:
        info = self._api().run(run_id)
        return _subtree(info.get("config") if info else None, parts)

    def _history(self, run_id: str, scope: list[str]) -> pandas.DataFrame | None:
        """The metrics of ``run_id`` under ``scope`` (keys without it), a row
        per row logged (one ``run.log`` record: its points share their wall
        time), in the order logged, indexed by (step, rank), a column per
        key; None when none. Rows are never merged by step: one logged
        without a step (numbered by relaunch) and a later one logged with
        that step are two rows, as in ml-logger's file."""
        import relaunch

        api = relaunch.Api(self._server, _token(self._token), timeout=self.timeout)
        try:
            record = api.run(run_id)
        except LookupError:
            return None
        long = record.history(layout="long")
        events = record.events()
        texts = _row_texts(events, long)
        wides = []
        for part in (long, texts):
            if part.empty:
                continue
            part = _after_removals(part, events)
            keys = part["key"].astype(str)
            if scope:
                prefix = "/".join(scope) + "/"
                below = keys.str.startswith(prefix)
                part, keys = part[below], keys[below].str.slice(len(prefix))
            if part.empty:
                continue
            part = part.assign(key=keys.to_numpy())
            part = part.drop_duplicates(["wall", "step", "rank", "key"], keep="last")
            wides.append(part.pivot(index=["wall", "step", "rank"], columns="key", values="value"))
        if not wides:
            return None
        # A key logged as a number in some rows and as text in others is one column.
        wide = wides[0] if len(wides) == 1 else wides[0].combine_first(wides[1])
        wide = wide.sort_index().reset_index(level="wall", drop=True)
        wide.columns.name = None
        return wide

    def _rows(self, run_id: str, scope: list[str]) -> list[dict] | None:
        wide = self._history(run_id, scope)
        if wide is None:
            return None
        names = list(wide.columns)
        return [
            {
                k: v
                for k, v in zip(names, values, strict=True)
                if not (isinstance(v, float) and math.isnan(v))
            }
            for values in wide.itertuples(index=False, name=None)
        ]

    def _virtual_records(self, own: bool, run_id: str, name: str) -> list | None:
        """``parameters.pkl`` / a metrics file as the records ml-logger's file held."""
        kind = self._virtual(name)
        if kind is None:
            return None
        self._fresh(own)
        if kind[0] == "params":
            if own:
                self._deliver_queued()
            params = self._params_of(run_id, kind[1])
            return None if params is None else [params]
        return self._rows(run_id, kind[1])

    def _deliver_queued(self) -> None:
        from ._outbox import Box, _deliver_now

        _deliver_now(self, Box(self._own_id()), "reading the params")

    # --- globbing across runs ----------------------------------------------------------------

    def _runs_below(self, base: list[str]) -> list[tuple[list[str], dict]]:
        """Every run whose name (its prefix) is below ``base``: (its parts, its info)."""
        api = self._api()
        found, offset = [], 0
        query = [("q", "/".join(base))] if base else []
        while True:
            page = _get(
                api,
                "listing runs",
                "/runs",
                [*query, ("limit", str(_PAGE)), ("offset", str(offset))],
            )
            for info in page or []:
                try:
                    parts = _prefix_parts(str(info.get("name") or ""))
                except TrackingConfigError:
                    continue
                if len(parts) > len(base) and parts[: len(base)] == base:
                    found.append((parts, info))
            if not page or len(page) < _PAGE:
                return found
            offset += len(page)

    def _run_holding(self, base: list[str]) -> tuple[str, list[str], dict] | None:
        """The run that ``base`` is in: (its id, the parts of ``base`` below it, its info)."""
        api = self._api()
        mine = self._run_prefix.split("/")
        if base[: len(mine)] == mine:
            if self._run is not None:
                self._on_server()
            run_id = self._own_id()
            info = api.run(run_id)
            return None if info is None else (run_id, base[len(mine) :], info)
        for i in range(len(base), 0, -1):
            run_id = run_ids("/".join(base[:i]))[1]
            info = api.run(run_id)
            if info is not None:
                return run_id, base[i:], info
        return None

    def _tree(
        self, base: list[str], wanted: Callable[[str], object], files: bool = True
    ) -> dict[str, _Entry] | None:
        """Every path below ``base`` that a glob sees (``wanted`` says which
        virtual metrics files are worth asking the server about); None when
        nothing is there (no run holds ``base``, none is below it)."""
        api = self._api()
        holding = self._run_holding(base) if base else None
        below = self._runs_below(base)
        if holding is None and not below:
            return None
        runs: list[tuple[list[str], str, list[str], dict]] = []  # (rel, run id, sub, info)
        if holding is not None:
            runs.append(([], holding[0], holding[1], holding[2]))
        for parts, info in below:
            if holding is None or info.get("id") != holding[0]:
                runs.append((parts[len(base) :], info["id"], [], info))
        entries: dict[str, _Entry] = {}

        def add(path: list[str], entry: _Entry) -> None:
            for i in range(1, len(path)):
                entries.setdefault("/".join(path[:i]), _Entry("folder", entry.run_id))
            entries["/".join(path)] = entry

        for rel, run_id, sub, info in runs:
            if files:
                for f in api.files(run_id) or []:
                    parts = f["name"].split("/")
                    if parts[: len(sub)] == sub and len(parts) > len(sub):
                        add([*rel, *parts[len(sub) :]], _Entry("file", run_id, f["name"]))
            params = _subtree(info.get("config"), sub)
            if params is not None:
                add([*rel, PARAMS_NAME], _Entry("params", run_id, scope=sub, config=params))
            metrics = "/".join([*rel, METRICS_NAME])
            if metrics not in entries and wanted(metrics):
                latest = _get(api, "reading the metrics' names", f"/runs/{run_id}/latest", [])
                prefix = "".join(p + "/" for p in sub)
                if any(str(row.get("key", "")).startswith(prefix) for row in latest or []):
                    add([*rel, METRICS_NAME], _Entry("metrics", run_id, scope=sub))
            if rel:
                entries.setdefault("/".join(rel), _Entry("folder", run_id))
        return entries

    def _glob_entries(
        self, query: str, wd: str | None, recursive: bool, files: bool = True
    ) -> tuple[str, dict[str, _Entry]] | None:
        """(what to put before each path, the matching entries), or None."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, not {type(query).__name__}")
        if wd is not None and not isinstance(wd, str):
            raise TypeError(f"wd must be a str, not {type(wd).__name__}")
        current = self._prefix.split("/") if self._prefix else []
        lead = ""
        if query.startswith("/") and not query.startswith("//") and not wd:
            base, query, lead = [], query.lstrip("/"), "/"
        else:
            base = _prefix_parts(wd, current, "wd") if wd else current
        _, query_parts = _parts(query, "glob query")
        pattern = _glob_regex("/".join(query_parts), recursive)
        tree = self._tree(base, pattern.fullmatch, files=files)
        if tree is None:
            return None
        return lead, {p: e for p, e in tree.items() if pattern.fullmatch(p)}

    def glob(
        self,
        query: str,
        wd: str | None = None,
        recursive: bool = True,
        start: int | None = None,
        stop: int | None = None,
    ) -> list[str] | None:
        """The paths under the current prefix (and ``wd``: a path below it, or
        from the root with a leading ``/``) that match ``query``: the runs'
        files and folders, and each run's ``parameters.pkl`` and
        ``metrics.pkl`` (see the module doc); runs below the prefix are
        looked into too. A query starting with ``/`` (and no ``wd``) globs
        from the root and returns paths starting with ``/``. With a local
        root, an absolute ``wd`` that holds no run is the folder of this
        machine that ml-logger's local mode globbed there (where absolute
        keys are written: see ``_host_path``). Sorted; None when nothing
        is there."""
        found = self._glob_entries(query, wd, recursive)
        if found is None:
            return self._glob_host(query, wd, recursive, start, stop)
        lead, entries = found
        return [lead + p for p in sorted(entries)][start:stop]

    def _glob_host(
        self, query: str, wd: str | None, recursive: bool, start: int | None, stop: int | None
    ) -> list[str] | None:
        if not (wd and self._host_path(wd) and self._root_spec().local is not None):
            return None
        import glob as globbing

        _parts(query, "glob query")  # no '..' out of wd
        found = globbing.glob(query.lstrip("/"), root_dir=wd, recursive=recursive)
        return sorted(found)[start:stop] or None

    def _glob_files(self, query: str, wd: str | None = None) -> list[str]:
        """The run files (no folders, no params or metrics) that match, sorted."""
        found = self._glob_entries(query, wd, True)
        if found is None:
            return []
        return sorted(p for p, e in found[1].items() if e.kind == "file")

    # --- experiments and metrics ----------------------------------------------------------

    def get_exps(
        self, *prefixes: str, as_dataframe: bool = True, show_progress: bool = True
    ) -> pandas.DataFrame | list[dict]:
        """The params of the runs ``prefixes`` name (globs allowed, below the
        current prefix or from the root with ``/``), dot-flattened, one row
        a run with its ``prefix`` (the ``parameters.pkl`` path, as
        ml-logger gave it): a DataFrame, or a list of dicts."""
        rows: list[dict] = []
        for prefix in _progress(prefixes, "glob", show_progress):
            if not isinstance(prefix, str):
                raise TypeError(f"prefixes are str, not {type(prefix).__name__}: {prefix!r}")
            full = prefix if prefix.endswith(PARAMS_NAME) else pJoin(prefix, PARAMS_NAME)
            if any(c in full for c in "*?["):
                found = self._glob_entries(full, None, True, files=False)
                matches = [
                    (found[0] + p, e.config)
                    for p, e in sorted((found[1] if found else {}).items())
                    if e.kind == "params"
                ]
            else:
                own, run_id, name = self._locate((full,))
                records = self._virtual_records(own, run_id, name)
                if not records:
                    raise FileNotFoundError(
                        f"get_exps: no params at {full!r} (run {run_id} has none, or is not on "
                        "the server)"
                    )
                matches = [(full, records[0])]
            for path, params in _progress(matches, "loading", show_progress):
                row = _dot_flatten(params or {})
                row["prefix"] = path
                rows.append(row)
        if as_dataframe:
            import pandas

            return pandas.DataFrame(rows)
        return rows

    def read_metrics(
        self,
        *keys: str,
        x_key: str | None = None,
        path: str = METRICS_NAME,
        wd: str | None = None,
        num_bins: int | None = None,
        bin_size: int = 1,
        dropna: bool = False,
        silent: bool = False,
        default: object = None,
        verbose: bool = False,
    ):
        """The rows logged into ``path`` (a glob reads every match) as pandas:
        without keys, ``{path: DataFrame}`` (a column per metric, a row per
        logged row, in the order logged); with keys, the rows that have them
        (NaN dropped), grouped by their number (the k-th such row of each
        file together) or by ``x_key`` bins (``num_bins`` by value, else bins
        of ``bin_size`` distinct values) across the files: ``"loss"`` gives an
        array per group, ``"loss@mean"`` (any pandas aggregation, or
        ``"loss@25%"``) one number per group, ``"loss@median"`` too; one key
        gives one Series, several a list. ``step`` as a key or ``x_key`` is
        relaunch's step when no ``step`` metric was logged. None (``silent``)
        or FileNotFoundError when a file has no rows."""
        import numpy
        import pandas

        wanted: dict[str, list[str]] = {}
        query_keys = [*keys, *([x_key] if x_key else [])]
        for k in query_keys:
            if not isinstance(k, str):
                raise TypeError(f"metric keys are str, not {type(k).__name__}: {k!r}")
            name, *aggs = k.split("@")
            wanted.setdefault(name, []).extend(aggs)
        x_name = x_key.split("@")[0] if x_key else None
        scope = self.Prefix(wd) if wd else contextlib.nullcontext()
        with scope:
            paths = self.glob(path) if any(c in path for c in "*?[") else [path]
            if verbose:
                builtins.print(*(paths or []), sep="\n")
            if not paths:
                return None
            frames: dict[str, pandas.DataFrame] = {}
            for p in paths:
                frame = self._metrics_frame(p)
                if frame is None:
                    if silent:
                        return None
                    raise FileNotFoundError(
                        f"read_metrics: no metrics at {p!r} under prefix {self._prefix!r}; pass "
                        "path= (a keyword) to name the file, e.g. path='eval.pkl'"
                    )
                if "step" in wanted and "step" not in frame.columns:
                    frame["step"] = frame.index.get_level_values("step").to_numpy()
                frame = frame.reset_index(drop=True)
                if wanted:
                    missing = [k for k in wanted if k not in frame.columns]
                    if missing:
                        builtins.print(
                            f"read_metrics: {p} has no {missing}; it has {list(frame.columns)}",
                            file=sys.stderr,
                        )
                        continue
                    frame = frame[list(wanted)].dropna().reset_index(drop=True)
                    if x_name is not None:
                        frame = _binned(frame, x_name, num_bins, bin_size)
                frames[p] = frame
        if not wanted:
            return frames
        if not frames:
            return None if len(query_keys) == 1 else [None for _ in query_keys]
        table = pandas.concat(frames.values())
        if x_name is not None:
            table = table.sort_values(x_name, kind="stable").reset_index(drop=True)
            count = num_bins or math.ceil(table[x_name].nunique() / (bin_size or 1))
            groups = pandas.qcut(table[x_name], max(1, count), duplicates="drop")
            grouped = table.groupby(groups, observed=True)
        else:
            grouped = table.groupby(level=0)
        out: dict[str, pandas.Series] = {}
        for k, aggs in wanted.items():
            out[k] = grouped[k].apply(lambda items: numpy.asarray(items))
            if pandas.api.types.is_numeric_dtype(table[k]):  # text has no median
                out[k + "@median"] = grouped[k].median()
            for agg in aggs:
                if agg.endswith("%"):
                    out[f"{k}@{agg}"] = grouped[k].quantile(float(agg[:-1]) / 100)
                else:
                    out[f"{k}@{agg}"] = grouped[k].agg(agg)
        result = pandas.DataFrame(out)
        if x_name is not None:
            result = result.reset_index(drop=True)
        if dropna:
            result = result.dropna()
        picked = [result.get(k, default) for k in query_keys]
        return picked if len(picked) > 1 else picked[0]

    get_dataframe = read_metrics

    def _metrics_frame(self, path: str) -> pandas.DataFrame | None:
        """The rows of the metrics file ``path`` (see the module doc): a real
        file of the run when there is one, else the run's metrics."""
        import pandas

        local = self._host_path(path)
        own, run_id, name = (False, "", "") if local else self._locate((path,))
        if local or self._exists(own, run_id, name):
            if path.endswith(".jsonl"):
                rows = self.load_jsonl(path)
            elif path.endswith(".csv"):
                text = self.load_text(path)
                import io

                return None if text is None else pandas.read_csv(io.StringIO(text))
            else:
                rows = self.load_pkl(path)
            if rows is None:
                return None
            frame = pandas.DataFrame(rows)
            frame.index = pandas.MultiIndex.from_arrays(
                [range(len(frame)), [0] * len(frame)], names=["step", "rank"]
            )
            return frame
        self._fresh(own)
        return self._history(run_id, _file_scope(name))


def _binned(frame: pandas.DataFrame, x: str, num_bins: int | None, bin_size: int):
    """One row a bin of ``x``: ``x`` its least value, the others their mean."""
    import math as _math

    import pandas

    if frame.empty:
        return frame
    if num_bins:
        bins = pandas.cut(frame[x], num_bins)
    else:
        count = _math.ceil(frame[x].nunique() / (bin_size or 1))
        bins = pandas.qcut(frame[x], count, duplicates="drop")
    grouped = frame.groupby(bins, observed=True)
    out = {k: grouped[k].min() if k == x else grouped[k].mean() for k in frame.columns}
    return pandas.DataFrame(out).reset_index(drop=True)


def _progress(items: Iterable, what: str, show: bool) -> Iterable:
    items = list(items)
    if show and len(items) > 1:
        try:
            from tqdm import tqdm
        except ImportError:
            return items
        return tqdm(items, desc=what)
    return items
