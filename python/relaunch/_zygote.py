"""A warm interpreter for restarts: ``relaunch run`` starts this module
(``python -u -m relaunch._zygote``) while a job runs, with the
environment every local rank shares. It imports torch (with ``torch._dynamo``,
which DistributedDataParallel loads when built), the modules
``RELAUNCH_WARM_IMPORTS`` names and the installed modules the script
imports at its top level, says it is ready, then waits.
When workers fail and the launcher restarts them, it asks this process to
fork one per rank instead of starting a new interpreter: the replacement
skips the imports, so a restart costs the backoff and joining the process
group.

The zygote never runs training code: each request forks it twice (the
middle process exits at once, so the worker is reparented to the launcher,
a subreaper, which waits on it as on any worker), and the worker, not the
zygote, takes the rank's environment and output and runs the script. A
failed rank's state is never in it, and a restart after the next failure
forks the same clean interpreter again.

What a warm worker does not carry: anything the launcher gives a rank that
a module read at import time (``RANK``, ``LOCAL_RANK``: the zygote imports
third-party modules before any rank's environment exists, and the script's
own modules are imported by the worker, as in a cold start); a CUDA context
(CUDA cannot be used across ``fork``: the zygote never initialises it, and
the worker does, after the fork, as a cold one would).

Protocol, over a ``SOCK_SEQPACKET`` socket the launcher passes as
``RELAUNCH_ZYGOTE_FD``, one JSON object per message: the zygote sends
``{"ready": ...}`` or ``{"unfit": why}`` once; then for each
``{"env": {...}, "launcher": pid}`` with the worker's stdout and stderr
attached (``SCM_RIGHTS``), it answers ``{"pid": n}`` or ``{"error": why}``.
An empty read (the launcher is gone) ends it.
"""

from __future__ import annotations

import ast
import ctypes
import importlib.machinery
import importlib.util
import json
import os
import runpy
import socket
import sys
import threading
import time

ENV_FD = "RELAUNCH_ZYGOTE_FD"
ENV_SCRIPT = "RELAUNCH_ZYGOTE_SCRIPT"
ENV_MODULE = "RELAUNCH_ZYGOTE_MODULE"
# More modules to import before forking, comma-separated (from the
# launcher's environment): ones the job imports lazily, after start-up.
ENV_IMPORTS = "RELAUNCH_WARM_IMPORTS"
# Set in every worker the zygote forks: the script can tell (and say) that
# it started warm.
ENV_WARM = "RELAUNCH_WARM_START"

# The niceness the imports run at: behind the job's own workers.
IMPORT_NICENESS = 10

_PR_SET_PDEATHSIG = 1
# How long a worker waits to be reparented to the launcher: the middle
# process exits right after the fork, so this is microseconds unless the
# machine is very loaded.
_REPARENT_PATIENCE = 30.0


def _say(text: str) -> None:
    print(f"relaunch zygote {os.getpid()}: {text}", file=sys.stderr, flush=True)


def top_level_imports(source: str) -> list[str]:
    """Absolute module names imported by a file's top-level statements
    (and inside its top-level ``try`` blocks, the usual optional-import
    pattern), in order, without duplicates. Imports inside functions, and
    under ``if`` (often ``if __name__ == "__main__"``), are left to the
    worker."""
    names: list[str] = []

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                names.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.append(node.module)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(ast.parse(source).body)
    return list(dict.fromkeys(names))


def _installed_dirs() -> list[str]:
    """Where installed code lives: the standard library and site-packages
    (a virtual environment inside the job's folder included)."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    dirs = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    dirs += [*site.getsitepackages(), site.getusersitepackages()]
    return [os.path.realpath(d) for d in dict.fromkeys(dirs)]


def _is_third_party(name: str, installed: list[str]) -> bool:
    """Whether ``name`` is installed code (the standard library or
    site-packages) rather than the job's own, found without importing it."""
    top = name.partition(".")[0]
    if top in sys.builtin_module_names:
        return True
    spec = importlib.machinery.PathFinder.find_spec(top)
    if spec is None:
        return False
    where = spec.origin if spec.origin not in (None, "namespace") else None
    paths = [where] if where else list(spec.submodule_search_locations or [])
    if not paths:
        return False
    for path in paths:
        real = os.path.realpath(path)
        if not any(real.startswith(d + os.sep) for d in installed):
            return False
    return True


def preload(script: str | None, module: str | None) -> tuple[list[str], list[str]]:
    """Imports torch and the target's third-party top-level imports.
    Returns what was imported and what was not (with why)."""
    installed = _installed_dirs()
    source = None
    if script is not None:
        here = os.path.dirname(os.path.realpath(script))
        # As `python script.py` has it: the script's directory first, in
        # place of the current one that `-m` put there.
        sys.path[0] = here
        try:
            with open(script, "rb") as f:
                source = f.read()
        except OSError as e:
            _say(f"cannot read {script} ({e}); preloading torch only")
    elif module is not None:
        spec = importlib.machinery.PathFinder.find_spec(module.partition(".")[0])
        if spec is not None and "." not in module and spec.origin and spec.origin.endswith(".py"):
            with open(spec.origin, "rb") as f:
                source = f.read()
    # torch, and what torch imports lazily on a training job's first steps:
    # DistributedDataParallel (and FSDP, torch.compile) import torch._dynamo
    # when built, a second in this machine's worker. Then what the user
    # names, then the script's own imports.
    extra = [m.strip() for m in os.environ.get(ENV_IMPORTS, "").split(",") if m.strip()]
    wanted = ["torch", "torch._dynamo", *extra]
    if source is not None:
        try:
            wanted += top_level_imports(source.decode("utf-8", "replace"))
        except SyntaxError as e:
            _say(f"cannot parse the script ({e}); preloading torch only")
    done: list[str] = []
    skipped: list[str] = []
    for name in dict.fromkeys(wanted):
        if name == "__future__" or name in sys.modules:
            continue
        if not _is_third_party(name, installed):
            skipped.append(f"{name} (the job's own code, or not installed)")
            continue
        # Whatever a module raises here (even SystemExit), the worker
        # raises again when the script imports it.
        try:
            importlib.import_module(name)
        except BaseException as e:
            skipped.append(f"{name} ({type(e).__name__}: {e})")
            continue
        done.append(name)
    return done, skipped


def _preload_gently(script: str | None, module: str | None) -> tuple[list[str], list[str]]:
    """:func:`preload` in a thread of low CPU priority (``nice`` is per
    thread on Linux), so the job's own workers, starting at the same time,
    come first; the main thread, which forks the workers, keeps the
    launcher's priority (raising it back would need privileges)."""
    result: list[tuple[list[str], list[str]]] = []

    def imports() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), IMPORT_NICENESS)
        except OSError:
            pass
        result.append(preload(script, module))

    thread = threading.Thread(target=imports, name="relaunch-zygote-imports")
    thread.start()
    thread.join()
    return result[0] if result else ([], ["(the imports failed; see above)"])


def _send(sock: socket.socket, message: dict) -> None:
    sock.send(json.dumps(message).encode())


def _become_worker(launcher: int, middle: int, fds: list[int], env: dict[str, str]) -> None:
    """In the forked worker: wait to be the launcher's child, then take a
    session of its own, SIGKILL at the launcher's death, the rank's output
    and environment, as a worker the launcher starts itself."""
    deadline = time.monotonic() + _REPARENT_PATIENCE
    while os.getppid() == middle and time.monotonic() < deadline:
        time.sleep(0.0002)
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() != launcher:
        # The launcher died, or is not a subreaper: nobody would wait on
        # this process, so it must not run.
        os._exit(70)
    stdout, stderr = fds
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    for fd in {stdout, stderr}:
        if fd > 2:
            os.close(fd)
    for name in (ENV_FD, ENV_SCRIPT, ENV_MODULE):
        os.environ.pop(name, None)
    os.environ.update(env)
    os.environ[ENV_WARM] = "1"
    # As a cold start decides it: line-buffered on a terminal.
    if os.isatty(1):
        sys.stdout.reconfigure(line_buffering=True)
    relaunch = sys.modules.get("relaunch")
    if relaunch is not None:
        # `import relaunch` registered nothing in the zygote (no rank
        # environment then); this rank's stack dump, as a cold import does.
        relaunch._stacks.install()


def serve(sock: socket.socket) -> dict | None:
    """Forks a worker for each request. Returns in a forked worker (its
    request); returns ``None`` in the zygote when the launcher is gone."""
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 22, 2)
        except OSError as e:
            _say(f"cannot read from the launcher ({e}); exiting")
            return None
        if not data:
            return None
        try:
            request = json.loads(data)
            env = {str(k): str(v) for k, v in request["env"].items()}
            launcher = int(request["launcher"])
            if len(fds) != 2:
                raise ValueError(f"expected 2 descriptors (stdout, stderr), got {len(fds)}")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            for fd in fds:
                os.close(fd)
            _send(sock, {"error": f"bad request: {e}"})
            continue
        report_r, report_w = os.pipe()
        try:
            middle = os.fork()
        except OSError as e:
            for fd in (*fds, report_r, report_w):
                os.close(fd)
            _send(sock, {"error": f"cannot fork: {e}"})
            continue
        if middle == 0:
            # The middle process: fork the worker and exit at once, so the
            # worker is reparented to the launcher.
            try:
                os.close(report_r)
                worker = os.fork()
            except BaseException:
                os._exit(1)  # nothing written: the zygote reports the failure
            if worker == 0:
                os.close(report_w)
                sock.close()
                _become_worker(launcher, os.getppid(), fds, env)
                return request
            try:
                os.write(report_w, str(worker).encode())
            finally:
                os._exit(0)
        os.close(report_w)
        for fd in fds:
            os.close(fd)
        with os.fdopen(report_r, "rb") as report:
            pid_text = report.read()
        os.waitpid(middle, 0)
        if pid_text:
            _send(sock, {"pid": int(pid_text)})
        else:
            _send(sock, {"error": "the second fork failed"})


def run(request: dict, script: str | None, module: str | None) -> None:
    """Runs the target in a forked worker, as ``python -u`` would."""
    argv = [str(a) for a in request.get("argv", [])]
    if module is not None:
        sys.argv = [module, *argv]
        sys.path[0] = os.getcwd()
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        assert script is not None
        sys.argv = [script, *argv]
        sys.path[0] = os.path.dirname(os.path.realpath(script))
        runpy.run_path(script, run_name="__main__")


def main() -> None:
    fd = int(os.environ.pop(ENV_FD))
    script = os.environ.pop(ENV_SCRIPT, None)
    module = os.environ.pop(ENV_MODULE, None)
    sock = socket.socket(fileno=fd)
    started = time.monotonic()
    done, skipped = _preload_gently(script, module)
    seconds = round(time.monotonic() - started, 3)
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if others:
        why = (
            f"importing {', '.join(done)} started Python threads ({', '.join(others)}), "
            "which a fork would not carry"
        )
        _say(f"unfit for warm restarts: {why}")
        _send(sock, {"unfit": why})
        return
    _say(f"ready in {seconds} s: imported {', '.join(done) or 'nothing'}")
    for line in skipped:
        _say(f"not preloaded: {line}")
    _send(sock, {"ready": {"imported": done, "seconds": seconds}})
    sys.stderr.flush()
    request = serve(sock)
    if request is None:
        return
    run(request, script, module)


if __name__ == "__main__":
    main()
