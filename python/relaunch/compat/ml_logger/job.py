"""``ml_logger.job``: ``RUN`` (how a job's prefix is built) and ``instr``
(wrap a training function so that calling it records the job), with
``needs_relaunch`` to check a job's status.

``instr(train)`` configures the logger with ``RUN.prefix`` (by default
``{username}/{project}/{now:%Y/%m-%d}/{file_stem}/{job_name}``, the file
stem being the calling script's path below ``RUN.script_root``), uploads
the calling script, records the job as created (``job``, ``revision``,
``fn``, ``args``, ``kwargs`` in the run's params) and the git diff, and
returns a thunk. Calling the thunk records the job as started (its host and
SLURM job id), calls the function, and records it as completed (the run
finishes) or, when it raises, prints the traceback, saves it as
``traceback.err``, records it as errored (the run fails) and raises again.
ml-logger's jaynes integration (naming cloud launches) is not done here.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from datetime import datetime

from . import logger
from ._names import LOGGER_USER, ROOT, now
from .helpers.color_helpers import colored

__all__ = ["RUN", "instr", "is_stale", "needs_relaunch"]


class RUN:
    """The job's prefix, built from these class attributes (set them, or
    pass them to ``RUN(...)``, which keeps them):

    ``server``: the logger's root (``ML_LOGGER_ROOT``; None: the logger's
    own). ``username`` (``ML_LOGGER_USER``), ``project`` (``scratch``).
    ``script_root``: the folder that script paths are taken below (the
    working directory). ``prefix``, formatted until no ``{`` is left, with
    these attributes and ``file_stem``. ``job_name``: the import time and
    ``{job_counter}``; ``job_counter`` goes up by one with each ``RUN()``
    while it is a number (None: not counted).

    ``RUN(script_path=...)`` returns ``(prefix, job_name, file_stem)``.
    """

    server: str | None = ROOT
    username: str | None = LOGGER_USER
    project = "scratch"
    script_root = os.getcwd()
    script_path: str | None = None
    now = now()
    prefix = "{username}/{project}/{now:%Y/%m-%d}/{file_stem}/{job_name}"
    job_name = f"{now:%H.%M.%S}/{{job_counter}}"
    job_counter: int | float | None = 0
    resume = True
    readme: str | None = None
    debug = "pydevd" in sys.modules
    CUDA_VISIBLE_DEVICES: str | None = None

    def __new__(  # type: ignore[misc]
        cls, deps: object = None, script_path: str | None = None, __count: bool = True, **kwargs
    ) -> tuple[str, str, str]:
        if script_path is not None:
            kwargs["script_path"] = script_path
        cls._update(**kwargs)
        if cls.script_path is None:
            raise TypeError("RUN() needs script_path=, the script whose stem names the job")
        depth = len(str(cls.script_root).split("/"))
        file_stem = logger.stem(logger.truncate(os.path.abspath(cls.script_path), depth=depth))
        counter = cls.job_counter
        if __count and isinstance(counter, int | float) and not isinstance(counter, bool):
            cls.job_counter = counter + 1
        data = {**cls._values(), "file_stem": file_stem}
        for _ in range(16):
            if "{" not in str(data["prefix"]):
                break
            try:
                data = {k: v.format(**data) if isinstance(v, str) else v for k, v in data.items()}
            except (KeyError, IndexError, ValueError) as e:
                raise ValueError(
                    f"RUN.prefix {cls.prefix!r} cannot be filled in ({type(e).__name__}: {e}); "
                    f"it may use {', '.join(sorted(data))}"
                ) from None
        else:
            raise ValueError(f"RUN.prefix {cls.prefix!r} keeps a '{{' after 16 rounds")
        return data["prefix"], data["job_name"], file_stem

    @classmethod
    def _values(cls) -> dict[str, object]:
        return {
            k: getattr(cls, k)
            for k in dir(cls)
            if not k.startswith("_") and not callable(getattr(cls, k))
        }

    @classmethod
    def _update(cls, **values: object) -> None:
        for k, v in values.items():
            setattr(cls, k, v)


def instr(
    fn: Callable,
    *ARGS: object,
    __file: str | bool = False,
    __create_job: bool = True,
    __count: bool = True,
    __diff: bool = True,
    __silent: bool = False,
    **KWARGS: object,
) -> Callable:
    """Configures the logger for a new job of ``fn`` and returns the thunk
    that runs it (see the module doc). ``__file``: the script, when not the
    caller's; ``__create_job=False``: skip the upload and the ``created``
    record (a relaunch); ``__count=False``: keep ``RUN.job_counter``;
    ``__diff=False``: no git diff."""
    if __file:
        script = os.path.join(os.getcwd(), str(__file))
    else:
        caller = sys._getframe(1).f_globals.get("__file__")
        if not caller:
            raise TypeError(
                "instr() is called from no file (an interactive session?); pass the script "
                "as __file='train.py'"
            )
        script = os.path.abspath(caller)
    prefix, job_name, file_stem = RUN(script_path=script, _RUN__count=__count)
    snapshot = {**RUN._values(), "prefix": prefix, "job_name": job_name, "file_stem": file_stem}

    logger.configure(prefix, root=RUN.server, silent=__silent)
    if __create_job:
        logger.upload_file(script)
        logger.job_created(
            job={
                "script_path": RUN.script_path,
                "script_root": RUN.script_root,
                "counter": RUN.job_counter,
                "prefix": prefix,
                "name": job_name,
            },
            revision=logger.rev_info(),
            fn=logger.fn_info(fn),
            args=ARGS,
            kwargs=KWARGS,
            silent=__silent,
        )
        if __diff:
            logger.diff()
        if RUN.readme:
            logger.log_text(RUN.readme, "README.md", dedent=True)

    def thunk(*args: object, **kwargs: object) -> object:
        RUN._update(**snapshot)
        if RUN.CUDA_VISIBLE_DEVICES is not None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible != RUN.CUDA_VISIBLE_DEVICES:
                raise RuntimeError(
                    f"CUDA_VISIBLE_DEVICES={visible}, but RUN.CUDA_VISIBLE_DEVICES is "
                    f"{RUN.CUDA_VISIBLE_DEVICES}"
                )
        if args and ARGS:
            raise TypeError(
                f"positional arguments given both to instr() ({ARGS}) and to the thunk ({args})"
            )
        logger.configure(prefix, root=RUN.server, silent=True)
        logger.job_started(
            job={"job_id": logger.slurm_job_id},
            host={"hostname": logger.hostname},
            silent=__silent,
        )
        try:
            result = fn(*(args or ARGS), **{**KWARGS, **kwargs})
        except Exception:
            tb = traceback.format_exc()
            logger.print(tb, color="red")
            logger.log_text(tb, filename="traceback.err")
            logger.job_errored(silent=True)  # uploads the text and fails the run
            raise
        logger.log_line("========== execution is complete ==========")
        logger.job_completed(silent=True)  # uploads the text and finishes the run
        return result

    return thunk


def is_stale(time_str: str | None, threshold: float = 5.0) -> bool:
    """Whether more than ``threshold`` minutes passed since ``time_str`` (a
    ``job.*Time`` param, UTC); False for None."""
    if time_str is None:
        return False
    then = datetime.fromisoformat(str(time_str))
    return (logger.utcnow() - then).total_seconds() / 60 > threshold  # type: ignore[operator]


def needs_relaunch(
    prefix: str,
    stale_limit: float = 5.0,
    silent: bool = False,
    not_exist_ok: bool = False,
    *args: object,
    **kwargs: object,
) -> bool:
    """Whether the job at ``prefix`` (from the root) should be launched again:
    it does not exist, it errored, or its status is older than
    ``stale_limit`` minutes without completing. Prints the status unless
    ``silent`` (``args``/``kwargs`` go to that ``print``)."""
    with logger.Prefix("/" + prefix.lstrip("/")):
        status, request, run, start, create = logger.read_params(
            "job.status",
            "job.requestTime",
            "job.runTime",
            "job.startTime",
            "job.createTime",
            default=None,
            not_exist_ok=not_exist_ok,
        )
        link = logger.get_dash_url()
    since = {"created": create, "requested": request, "started": start, "running": run}
    stale = status in since and is_stale(since[status], stale_limit)  # type: ignore[arg-type]
    relaunch = status is None or status == "errored"
    color = {None: "red", "errored": "red", "completed": "green"}.get(status, "yellow")
    if not silent:
        shown = colored("not exist" if status is None else str(status), color)
        print(shown, link, colored("is stale", "red") if stale else "", *args, **kwargs)  # type: ignore[call-overload]
    return stale or relaunch
