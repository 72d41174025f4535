"""ml-logger's ``logger`` on relaunch: change one line and keep the script.

    from relaunch.compat.ml_logger import logger    # was: from ml_logger import logger

Written against ml-logger 0.10.36. Everything goes to a relaunch tracking
server through relaunch's own client: metrics through ``run.log`` (spooled
on disk, shipped exactly once, never blocking), files through the chunked
upload that the server verifies, params into the run's config.

Where things go
---------------
``root``
    A relaunch server URL (``http(s)://HOST:PORT``). Default:
    ``RELAUNCH_SERVER``, else ``ML_LOGGER_ROOT`` when it is an http(s) URL.
    A local path (ml-logger's local mode) is refused, saying so: relaunch
    can spool offline (``relaunch.init(offline=True)``), but params, file
    reads and globbing need the server, so the shim does not pretend.
    Several URLs, comma-separated, are replicas of one server (as
    relaunch's client takes them): requests go to the first and move on
    to the next when one does not answer. A server started with
    ``--token`` gets ``RELAUNCH_SERVER_TOKEN`` (or ``access_token=``) as
    ``Authorization: Bearer``; without it, calls raise saying that the
    server needs one.
``prefix``
    ``configure()`` fills in ``{USER}`` and ``{now:...}`` as ml-logger does;
    a part starting with ``$`` is that environment variable. The prefix
    names one relaunch run: its parts joined with ``.`` are the run id
    (``alice/demo/run-3`` is run ``alice.demo.run-3``) when every part is
    letters, digits, ``-`` and ``_`` and the whole fits in 128 characters;
    otherwise the id is a readable form plus 10 hex digits of the
    prefix's SHA-256 (``sweep/lr=0.1`` is ``sweep.lr-0.1-<hash>``), so two
    prefixes never share a run. The project is the first two parts
    (``alice.demo``) when there are three or more, the first when two,
    else relaunch's default (``RELAUNCH_PROJECT`` wins over all of this).
    The run's name is the prefix itself. Under ``relaunch run``
    (``RELAUNCH_RUN_ID`` set) the run is the job's, so restarts continue
    it. ``..`` parts, absolute prefixes and ``//`` (ml-logger's host file
    system) are refused: ml-logger let them escape its root. ``Prefix()``
    below the configured prefix stays in its run (``Prefix("eval")``: files
    under ``eval/``, metric keys ``eval/...``, params under ``eval``);
    ``Prefix("/alice/demo/run-1")`` (a leading ``/``: from the top, as in
    ml-logger's server mode) addresses that other run, to read it.
params
    ``log_params(Args=...)`` deep-merges into the run's config (a PATCH of
    the server's run, blocking, raising when it fails); ``read_params``
    reads the config back from the server and dot-flattens it as
    ml-logger does (``"Args.lr"``). ``job_*`` record ``job.status`` and
    ``job.<x>Time`` there, as ml-logger does.
metrics
    A row is what was logged since the last flush, as in ml-logger; each
    flushed row is one ``run.log(row, step=...)``: the step is the row's
    ``step`` value when it is an int (a single ``.../step`` key under a
    metrics prefix counts too), else relaunch's own counter (one more than
    the previous row's step, 0 first in each process: a resumed run shows
    the newest process's value at a step, so log a ``step`` to keep the
    rows of several processes apart). ``step`` stays a metric as well.
    ``None`` is logged as NaN. Rows flushed with ``file="eval.pkl"`` get
    keys ``eval/...``. An empty flush logs nothing (ml-logger appended
    ``{}``). Rows never wait for the network.
summaries
    ``store_metrics`` + ``log_metrics_summary`` name stats as ml-logger
    does (``loss/mean``, ``k/min``, ``k/max``, ``k/sum``; ``min_max``;
    ``quantile``: ``k/0``, ``k/25``, ``k/mean`` (the median, as in
    ml-logger), ``k/75``, ``k/100``), NaN and None dropped. Fixed: a stat
    containing ``std`` gives ``k/stddev`` (population), ``k/mean`` and
    ``k/mode`` instead of crashing; ``default_stats=`` is honoured; an
    unknown stat name raises instead of giving nothing; histograms raise
    (relaunch metrics are numbers).
files
    ``upload_file``, ``torch_save``, ``save_pkl``, ``save_json``,
    ``upload_buffer`` and ``duplicate`` block until the server has
    committed the file, then check that the server lists it with the
    uploaded size and BLAKE3; any failure raises. Large files travel in
    chunks (no 100 MB limit). ``torch_load`` uses ``weights_only=True``
    unless told otherwise; ``load_pkl`` unpickles only with consent
    (``allow_pickle=True`` or ``RELAUNCH_ALLOW_PICKLE=1``). ``file://``
    paths stay on the local disk; ``s3://`` and ``gs://`` raise. A name
    must be relative, with parts of letters, digits and ``-_.+=@``.
text
    ``print``, ``log_line``, ``log_text`` and the tables that ``flush``
    and ``log_params`` print go to text files of the run (``outputs.log``
    by default), uploaded in the background at most every 5 s and for
    certain at ``Sync()`` exit, ``job_completed``/``job_errored`` and
    interpreter exit; a resumed run's file is continued, not replaced.
status
    ``job_completed`` flushes the pending row, uploads the text, then
    finishes the run: it returns once the server has everything and
    raises otherwise. ``job_errored`` finishes it as failed (with the
    traceback being handled). The other ``job_*`` record an event
    ``job_<status>``. Logging after ``job_completed`` resumes the run.
``Sync()``
    On leaving it, everything logged and saved so far is acknowledged by
    the server, or it raises.

Blocking calls wait at most ``RELAUNCH_ML_LOGGER_TIMEOUT`` seconds (60),
or ``logger.timeout``. Not thread-safe, like ml-logger's singleton.

Layout: ``_names`` (prefixes, run ids, file names), ``_values`` (params and
metric values), ``_summary`` (summary stats), ``_api`` (the server, its
token, its ``/api/v1``), ``_text``, ``_metrics`` and ``_run_files`` (the
logger's methods by job), ``_logger`` (``ML_Logger`` itself).
"""

from __future__ import annotations

from ._api import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
from ._api import TIMEOUT_ENV as TIMEOUT_ENV
from ._logger import METRICS_FILE as METRICS_FILE
from ._logger import PARAMS_FILE as PARAMS_FILE
from ._logger import ML_Logger
from ._names import LOGGER_USER, PREFIX, ROOT, USER, now, pJoin, run_ids, utcnow
from ._run_files import ALLOW_PICKLE_ENV as ALLOW_PICKLE_ENV
from ._summary import summary_stats as summary_stats
from ._text import LOG_FILE as LOG_FILE
from ._text import TEXT_UPLOAD_INTERVAL as TEXT_UPLOAD_INTERVAL

__all__ = [
    "LOGGER_USER",
    "PREFIX",
    "ROOT",
    "USER",
    "ML_Logger",
    "logger",
    "now",
    "pJoin",
    "run_ids",
    "utcnow",
]

logger = ML_Logger()
"""The module-level logger, as ``from ml_logger import logger`` gives."""
