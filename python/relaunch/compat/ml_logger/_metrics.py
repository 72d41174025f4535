"""Metrics: the row that ``log``/``log_metrics`` build and ``flush`` logs as
one ``run.log`` (its numbers; its text goes to the printed table and the
run's text file, and as a ``ROW_TEXTS`` event of the run, which reads put
back into the row), and the stored values that ``log_metrics_summary`` turns
into one row of stats."""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping

from relaunch.errors import TrackingConfigError

from ._names import _file_scope
from ._summary import _SummaryCache, summary_stats
from ._text import _row_line, _row_table
from ._values import _json_row, _metric_row, _numbers, _Shown, _step_of, _texts

# The event that keeps a metrics row's text values (strings and other
# objects that are not numbers), so that reading the run's metrics back
# gives them in their row: ``data`` is ``{"step", "rank", "texts": {key:
# text}, "alone"}``, ``step`` the one the row's numbers were logged at
# (``alone``: a row without numbers, placed at the event's time).
ROW_TEXTS = "ml-logger.row-texts"


class _MetricsMixin:
    """The metric methods of ``ML_Logger``: the pending rows are ``_kv`` (per
    cache), the stored values ``_summaries``; a row goes to its run
    (``_ensure_run``), never waiting for the network."""

    def _metrics_prefix(self, _prefix: str | bool | None) -> str:
        if _prefix:
            return f"{_prefix}/"
        if _prefix is False:
            return ""
        return self.metrics_prefix

    def log_metrics(
        self,
        metrics: Mapping | None = None,
        _prefix: str | bool | None = None,
        silent: bool | None = None,
        cache: object = None,
        file: str | None = None,
        flush: bool | None = None,
        **_key_values: object,
    ) -> None:
        """Adds to the current row (a later value for a key wins); ``flush``
        logs the row."""
        values = dict(metrics) if metrics else {}
        values.update(_key_values)
        row = _metric_row(values, self._metrics_prefix(_prefix))
        self._kv.setdefault(cache, {}).update(row)
        if flush:
            self.flush_metrics(cache=cache, file=file, silent=silent)

    def log_key_value(self, key: str, value: object, cache: object = None) -> None:
        self._kv.setdefault(cache, {}).update(_metric_row({key: value}))

    def log(
        self,
        *args: object,
        metrics: Mapping | None = None,
        silent: bool = False,
        sep: str = " ",
        end: str = "\n",
        flush: bool | None = None,
        cache: object = None,
        file: str | None = None,
        _prefix: str | bool | None = None,
        **_key_values: object,
    ) -> None:
        """Positional args are text (to ``outputs.log``, not printed); keyword
        args and ``metrics`` are metrics of the current row."""
        if args:
            self.log_line(*args, sep=sep, end=end, flush=False)
        if metrics:
            _key_values.update(metrics)
        self.log_metrics(
            metrics=_key_values, silent=silent, _prefix=_prefix, cache=cache, file=file, flush=flush
        )

    def flush_metrics(
        self, cache: object = None, file: str | None = None, silent: bool | None = None
    ) -> None:
        """Logs the current row's numbers as one ``run.log`` (nothing when it has
        none) and prints the row (``silent``: text values go to the text file
        on one line, unprinted). A ``file`` that is not a ``.pkl`` also gets
        the row (even an empty one) as a JSON line, as ml-logger wrote rows
        into ``.jsonl`` files."""
        own, sub, _ = self._where()
        row = self._kv.get(cache) or {}
        as_text = bool(file) and not str(file).endswith(".pkl")
        if not row and not as_text:
            return
        if not own:
            raise TrackingConfigError(
                f"metrics go to the run of the configured prefix {self._run_prefix!r}, not to "
                f"{self._prefix!r}; configure() that prefix to log to it"
            )
        key_prefix = "".join(f"{p}/" for p in [*sub, *_file_scope(file)])
        metrics = _numbers(row)
        logged_at = None
        if metrics:
            step = _step_of(metrics)
            logged_at = self._ensure_run().log(
                {key_prefix + k: v for k, v in metrics.items()}, step=step
            )
            self._last_row_step = logged_at
        texts = {
            key_prefix + k: v.data
            for k, v in row.items()
            if isinstance(v, _Shown) and v.number is None
        }
        if texts and not as_text:
            run = self._ensure_run()
            alone = logged_at is None
            step = self._last_row_step if alone else logged_at
            data = {"step": step, "rank": run.rank, "texts": texts, "alone": alone}
            run.event(ROW_TEXTS, "", data=data)
        self._kv.pop(cache, None)
        if as_text:
            self._write_text(file, json.dumps(_json_row(row)) + "\n")
            self._save_texts(force=False)
        shown = {k: v for k, v in row.items() if k not in self.do_not_print}
        if not silent and shown:
            builtins.print(_row_table(shown, color=True), flush=True)
            self.log_line(_row_table(shown), flush=False)
        elif _texts(row):
            # Text is not a metric: the text file keeps it even when nothing is printed.
            self.log_line(_row_line(row), flush=False)
        self.do_not_print = {"__timestamp"}

    def flush(self, cache: object = None, file: str | None = None) -> None:
        """Logs the current row and uploads text that is due (in the background)."""
        self.flush_metrics(cache=cache, file=file)
        self._save_texts(force=False)

    def store_metrics(
        self,
        metrics: Mapping | None = None,
        silent: bool | None = None,
        cache: object = None,
        _prefix: str | bool | None = None,
        **key_values: object,
    ) -> None:
        """Keeps values for the next ``log_metrics_summary``."""
        if metrics:
            key_values.update(metrics)
        prefix = self._metrics_prefix(_prefix)
        values = {prefix + k: v for k, v in key_values.items()}
        if silent:
            self.do_not_print.update(values)
        if cache not in self._summaries:
            self._summaries[cache] = _SummaryCache(**self._summary_opts)
        self._summaries[cache].store(values)

    store = store_metrics

    def store_key_value(
        self, key: str, value: object, silent: bool | None = None, cache: object = None
    ) -> None:
        self.store_metrics({key: value}, silent=silent, cache=cache)

    @property
    def summary_cache(self) -> _SummaryCache:
        if None not in self._summaries:
            self._summaries[None] = _SummaryCache(**self._summary_opts)
        return self._summaries[None]

    def peek_stored_metrics(self, *keys: str, len: int = 5, print_only: bool = True, cache=None):
        data = self._summaries.get(cache)
        shown = {
            k: list(v)[-len:]
            for k, v in (data.data.items() if data else [])
            if not keys or k in keys
        }
        if print_only:
            builtins.print(_row_table(shown))
            return None
        return shown

    def log_metrics_summary(
        self,
        key_values: Mapping | None = None,
        cache: object = None,
        key_stats: Mapping[str, str] | None = None,
        default_stats: str | None = None,
        silent: bool = False,
        flush: bool = True,
        _prefix: str | bool | None = None,
        **_key_modes: str,
    ) -> None:
        """Logs the stored values' stats (see the package doc) plus ``key_values``
        as one row, then clears the store (``tiled``)."""
        stats = {**(key_stats or {}), **_key_modes}
        summaries = self._summaries.get(cache) or _SummaryCache(**self._summary_opts)
        default = default_stats or summaries.default_stats
        for key, wanted in [*stats.items(), ("default_stats", default)]:
            summary_stats(key, [], wanted)  # a bad name fails before the store is cleared
        summary = summaries.summarize(stats, default)
        if key_values:
            prefix = self._metrics_prefix(_prefix)
            summary.update(_metric_row(key_values, prefix))
        with self.Prefix(metrics=False):
            self.log_metrics(metrics=summary, silent=silent, flush=flush, cache=cache)
