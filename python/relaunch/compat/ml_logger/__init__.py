"""ml-logger's ``logger`` on relaunch: change one line and keep the script.

    from relaunch.compat.ml_logger import logger    # was: from ml_logger import logger

Written against ml-logger 0.10.36. Everything goes to a relaunch tracking
server through relaunch's own client: metrics through ``run.log`` (spooled
on disk, shipped exactly once, never blocking), files through the chunked
upload that the server verifies, params into the run's config. With a
local directory as root (ml-logger's local mode, and the default), the
server is one this machine starts by itself on that directory.

Where things go
---------------
``root``
    A relaunch server URL (``http(s)://HOST:PORT``), or a local directory
    (a path, ``~`` expanded, or ``file:///PATH``). Default:
    ``RELAUNCH_SERVER``, else ``ML_LOGGER_ROOT`` (a URL or a path), else
    the local directory ``$XDG_DATA_HOME/relaunch/ml-logger``
    (``~/.local/share/relaunch/ml-logger``): one place for every local
    run, instead of ml-logger's working directory. ``logger.root`` is the
    URL or the directory. ``s3://``, ``gs://`` and ``HOST:PORT`` without
    ``http://`` raise, saying what to write.
    Several URLs, comma-separated, are replicas of one server (as
    relaunch's client takes them): requests go to the first and move on
    to the next when one does not answer. A server started with
    ``--token`` gets ``RELAUNCH_SERVER_TOKEN`` (or ``access_token=``) as
    ``Authorization: Bearer``; without it, calls raise saying that the
    server needs one.
local mode
    A local directory is a relaunch data directory: the first use that
    needs the server (not construction, not ``configure(silent=True)``)
    starts ``relaunch server --data-dir ROOT`` on a free port of
    127.0.0.1 (the binary installed with relaunch, without a token, like
    ``relaunch server`` on loopback), in a session of its own, and records
    it in ``ROOT/.ml-logger/server.json``. Another process with the same
    root joins that server (found under a lock, checked alive and
    answering) instead of starting a second one on the same SQLite. Each
    process leaves at its exit once its text and runs (and what registered
    in ``_local.before_leaving``) are shipped; the last to leave stops the
    server (``_local``). Afterwards ``relaunch server --data-dir ROOT``
    (and its dashboard) shows the same runs. A process that dies without
    its exit hooks (SIGKILL, an unhandled SIGTERM, ``os._exit``) cannot
    leave; the server then runs until the next process with that root
    leaves it.
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
    it. A prefix is a path from the root, as on ml-logger's server: a
    leading ``/`` starts from the root (``configure("/alice/demo/run")``
    is ``alice/demo/run``; in ``Prefix(...)`` and ``configure(a, b)`` a
    later part starting with ``/`` starts again, as ``os.path.join``
    does), ``.`` stays, ``..`` goes up (``Prefix("..")``). What would
    leave the root (a ``..`` above it, ``//``: ml-logger's host file
    system) is refused, saying from where. ``Prefix()`` below the
    configured prefix stays in its run (``Prefix("eval")``: files under
    ``eval/``, metric keys ``eval/...``, params under ``eval``); a prefix
    elsewhere (``Prefix("/alice/demo/run-1")``, ``Prefix("..", "run-2")``)
    addresses that other run, to read it or write files and params there.
    File names stay below their run (no ``..``, no leading ``/``).
params
    ``log_params(Args=...)`` deep-merges into the run's config (a PATCH of
    the server's run, blocking, raising when it fails); ``read_params``
    reads the config back from the server and dot-flattens it as
    ml-logger does (``"Args.lr"``). ``job_*`` record ``job.status`` and
    ``job.<x>Time`` there, as ml-logger does.
metrics
    Any value can be logged, as in ml-logger; the row keeps numbers as
    metrics: Python numbers, bools (0/1), numpy scalars, 0-d and
    one-element arrays and tensors. A ``Color`` (``helpers.color_helpers``)
    is its value (a metric when it is a number), printed formatted and in
    colour. An array, tensor or (nested) list of numbers is its mean as the
    metric (NaN and None left out; NaN when nothing is left), printed
    whole: what a chart of the key shows, where ml-logger kept the array
    in its pickle. A string or any other object is text: printed in the
    row's table, and in the run's text file (``outputs.log``: the table,
    without colour; with ``silent=True``, one line ``key: value | ...``
    when the row holds text), never a metric, so reading metrics back
    does not return it. ``None`` is NaN; a nested dict is ``outer/inner``
    keys; a name that is not a str raises.
    A row is what was logged since the last flush, as in ml-logger; the
    numbers of each flushed row are one ``run.log(row, step=...)``: the
    step is the row's ``step`` value when it is an int (a single ``.../step`` key under a
    metrics prefix counts too), else relaunch's own counter (one more than
    the previous row's step, 0 first in each process: a resumed run shows
    the newest process's value at a step, so log a ``step`` to keep the
    rows of several processes apart). ``step`` stays a metric as well.
    Rows flushed with ``file="eval.pkl"`` get keys ``eval/...``; a
    ``file`` that is not a ``.pkl`` (``eval.jsonl``) gets keys ``eval/...``
    too, and the row (even an empty one), every value as logged, as a
    JSON line of that text file, as ml-logger wrote ``.jsonl`` rows. An
    empty flush logs nothing else (ml-logger appended ``{}`` to
    ``metrics.pkl``). Rows never wait for the network.
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
removing and moving
    ``remove(*paths)`` deletes the run's files that each path names under
    the current prefix (a file, a folder: everything below it, a glob,
    ``''``: everything) through the server's ``DELETE
    /runs/{id}/files/{name}``, after the run's queued uploads have landed,
    and returns their names; paths that match nothing are skipped, as in
    ml-logger. ``parameters.pkl`` (and ``''`` at the run's prefix) clears
    the params. A run's metrics cannot be deleted: ``metrics.pkl`` says so
    once on stderr and keeps them. A removed text file (``outputs.log``)
    starts anew with the next line. ``move(source, to)`` copies a file (or
    every file below a folder) on the server, into ``to`` when that is a
    folder (or ends with ``/``), then deletes the source; a missing source
    raises FileNotFoundError, a glob, params or metrics raise saying why.
``ml_logger.job``, ``ml_logger.ml_logger``, ``ml_logger.helpers``
    The same modules here: ``job.RUN`` and ``job.instr`` (see ``job``;
    ``instr`` and ``RUN`` at the top too), ``needs_relaunch``; ``Color``,
    ``metrify``, ``ML_Logger``, ``logger`` in ``ml_logger``; ``Color``,
    ``percent`` (``0.85`` is ``85.00%``; ml-logger's printed ``8500.00%``),
    ``ms``, ``sec`` and the colour shorthands in ``helpers.color_helpers``,
    ``PrintHelper``, ``dot_flatten`` and friends, ``DefaultSet``,
    ``Stream``, ``CwdContext`` and the local pickle/JSON-lines readers. The
    logger has ml-logger's ``fn_info``, ``rev_info``, ``git_rev``,
    ``hostname``, ``slurm_job_id``, ``capture_error`` and ``get_exps``
    (the params of the runs whose prefixes match, from the server's run
    listing).
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
metric values), ``_summary`` (summary stats), ``_api`` (roots, the server,
its token, its ``/api/v1``), ``_local`` (local mode's shared server),
``_text``, ``_metrics`` and ``_run_files`` (the logger's methods by job),
``_logger`` (``ML_Logger`` itself, and what it has no counterpart for);
``job``, ``ml_logger`` and ``helpers`` are ml-logger's modules of those
names.
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
from .helpers.print_utils import PrintHelper

__all__ = [
    "LOGGER_USER",
    "PREFIX",
    "ROOT",
    "RUN",
    "USER",
    "ML_Logger",
    "PrintHelper",
    "instr",
    "logger",
    "now",
    "pJoin",
    "run_ids",
    "utcnow",
]

logger = ML_Logger()
"""The module-level logger, as ``from ml_logger import logger`` gives."""

from .job import RUN, instr  # noqa: E402  (job uses the logger above)
