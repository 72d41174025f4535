"""Files: the run's files on the server, written and read the ml-logger way
(``upload_file``, ``save_pkl``, ``torch_save``, ``load_json``, ``glob``, ...)
through relaunch's chunked, hash-checked transfers. A write returns once the
server lists the file with the uploaded size and BLAKE3, and raises
otherwise; ``file://`` keys stay on the local disk.

When the server cannot be reached (refused, reset, timed out), a write to
the logger's own run is not lost and does not raise: the file goes to
relaunch's crash-safe upload queue (``run.save_file``: a snapshot in the
client's directory, uploaded in the background once the server answers;
``Sync()`` and ``job_completed()`` wait for it, and what a dead process
left is shipped by the next ``relaunch.init`` of the run or by ``relaunch
sync``). The queue is bounded (``RELAUNCH_ML_LOGGER_OUTBOX_MB``, 10240 MiB
of pending uploads a run): past it, the write raises saying so.

Pickles: ``load_pkl`` unpickles a file without consent only when its bytes
are, byte for byte, a pickle that a logger of this machine wrote
(``save_pkl``/``log_data``: its BLAKE3 is recorded locally, see ``_state``);
anything else needs ``allow_pickle=True`` or ``RELAUNCH_ALLOW_PICKLE=1``.
"""

from __future__ import annotations

import builtins
import fnmatch
import io
import json
import os
import pickle
import random
import shutil
import sys
import tarfile
import tempfile
import time
import zipfile

from relaunch import files as _files
from relaunch.errors import (
    TrackingConnectionError,
    TrackingError,
    TrackingTimeoutError,
)

from . import _state
from ._helpers import _HelpersMixin, _mib_env
from ._media import _MediaMixin
from ._names import _key, _parts, _remote_scheme
from ._outbox import _OutboxMixin
from ._reads import _ReadsMixin
from ._values import _jsonable

ALLOW_PICKLE_ENV = "RELAUNCH_ALLOW_PICKLE"
"""``1`` lets ``load_pkl`` unpickle what the server holds without ``allow_pickle=True``."""
OUTBOX_ENV = "RELAUNCH_ML_LOGGER_OUTBOX_MB"
"""MiB of uploads a run may have waiting for the server (default 10240)."""
DEFAULT_OUTBOX_MB = 10240

_UNREACHABLE = (TrackingConnectionError, TrackingTimeoutError)
_ARCHIVES = {
    "tar": ("w", ".tar"),
    "gztar": ("w:gz", ".tar.gz"),
    "bztar": ("w:bz2", ".tar.bz2"),
    "xztar": ("w:xz", ".tar.xz"),
    "zip": (None, ".zip"),
}


def _consent() -> bool:
    return os.environ.get(ALLOW_PICKLE_ENV, "").strip().lower() in ("1", "true", "yes")


def _outbox_limit() -> int:
    return _mib_env(OUTBOX_ENV, DEFAULT_OUTBOX_MB)


def _pending_bytes(run_dir: str) -> int:
    total = 0
    uploads = os.path.join(run_dir, ".uploads")
    if os.path.isdir(uploads):
        for entry in os.scandir(uploads):
            data = os.path.join(entry.path, "data")
            if os.path.isfile(data):
                total += os.path.getsize(data)
    return total


class _FilesMixin(_ReadsMixin, _MediaMixin, _HelpersMixin, _OutboxMixin):
    """The file methods of ``ML_Logger``: a key names a file of the current
    prefix's run (``_target``); the logger's own run is made sure to exist on
    the server first (``_on_server``), another run must exist already."""

    # --- writing ------------------------------------------------------------------------

    def _upload(
        self, local: str, own: bool, run_id: str, name: str, tries: int = 1, backup: float = 0
    ) -> _files.Uploaded | None:
        """Uploads ``local`` as ``name``: returns once the server committed it and
        lists it with the same size and BLAKE3; raises otherwise. A file of
        the own run that cannot reach the server is queued (None)."""
        if own:
            try:
                self._on_server()
            except _UNREACHABLE as e:
                return self._spool(local, name, e)
        else:
            self._other_run(run_id)
        if own and self.__dict__.get("_spooled"):
            tries = 1  # the server was away a moment ago: no waiting between tries
        for attempt in range(max(1, tries)):
            try:
                done = _files.upload_file(
                    local, run_id, name, server=self._server, token=self._token
                )
                break
            except _UNREACHABLE as e:
                if attempt + 1 >= max(1, tries):
                    if own:
                        return self._spool(local, name, e)
                    raise
                time.sleep(random.random() * backup)
        size = os.path.getsize(local)
        listed = {f["name"]: f for f in self._api().files(run_id) or []}.get(name)
        if (
            done.size != size
            or not listed
            or (listed["size"], listed["blake3"]) != (done.size, done.blake3)
        ):
            raise TrackingError(
                f"{name} of run {run_id} is not on the server as uploaded (local {size} bytes, "
                f"sent {done.size}, server lists {listed}); upload it again"
            )
        if own:
            self._on_server_files.add(name)
        return done

    def _spool(self, local: str, name: str, error: BaseException) -> None:
        """``local`` as it is now, into relaunch's upload queue of the own run."""
        run = self._ensure_run()
        run_dir = os.path.dirname(run.dir)
        limit = _outbox_limit()
        waiting = _pending_bytes(run_dir)
        if waiting + os.path.getsize(local) > limit:
            raise TrackingConnectionError(
                f"{error}; and {name} cannot be queued: run {run.id} already has {waiting} bytes "
                f"of files waiting for the server in {run_dir} (the most is {limit}, "
                f"{OUTBOX_ENV}). Bring the server back, or raise {OUTBOX_ENV}"
            )
        fd, copy = tempfile.mkstemp(prefix=".ml-logger-", dir=os.path.dirname(run_dir))
        os.close(fd)
        try:
            shutil.copyfile(local, copy)
            run._native.save_file(copy, name, True)
        finally:
            if os.path.exists(copy):
                os.unlink(copy)
        if not self.__dict__.get("_spooled"):
            builtins.print(
                f"relaunch.compat.ml_logger: cannot reach the server ({error}); {name} and the "
                f"files saved after it until it answers are kept in {run_dir} and uploaded in "
                "the background (Sync() and job_completed() wait for them; what is left at "
                "exit, the next run of this prefix or `relaunch sync` ships)",
                file=sys.stderr,
            )
        self.__dict__.setdefault("_spooled", set()).add(name)
        return None

    def _landed(self) -> None:
        """Files queued while the server was away are on it (waits for them)."""
        if self.__dict__.get("_spooled") and self._run is not None:
            self._run.flush(self.timeout)
            self._on_server_files |= self.__dict__.pop("_spooled")

    def _write_host(self, key: str, data: bytes) -> bool:
        """``data`` into the host file that ``key`` names (see ``_host_path``),
        replaced atomically; False when the key names a file of a run."""
        local = self._host_path(key)
        if local is None:
            return False
        os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
        temp = f"{local}.{os.getpid()}.tmp"
        with open(temp, "wb") as f:
            f.write(data)
        os.replace(temp, local)
        return True

    def _put(self, key: str, data: bytes) -> str:
        """``data`` as the file ``key``: a host file or the run's; returns its name."""
        if self._write_host(key, data):
            return key
        own, run_id, name = self._target((key,))
        self._upload_bytes(data, own, run_id, name)
        return name

    def _upload_bytes(self, data: bytes, own: bool, run_id: str, name: str) -> None:
        with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
            path = os.path.join(tmp, "data")
            with open(path, "wb") as f:
                f.write(data)
            self._upload(path, own, run_id, name)

    # --- reading ------------------------------------------------------------------------

    def _exists(self, own: bool, run_id: str, name: str) -> bool:
        if own and self._run is not None:
            self._landed()
            self._on_server()
        listed = self._api().files(run_id)
        return listed is not None and any(f["name"] == name for f in listed)

    def _download(self, own: bool, run_id: str, name: str, dest: str) -> None:
        if not self._exists(own, run_id, name):
            raise FileNotFoundError(f"run {run_id} has no file {name!r} on {self._server}")
        _files.download(run_id, name, dest, server=self._server, token=self._token)

    def _text_now(self, own: bool, name: str) -> None:
        """A text file this logger writes (``log_line``, ``log_jsonl``, ...) is
        uploaded as it is now before it is read back."""
        if own and name in self._texts and self._run is not None:
            self._save_texts(force=True)
            self._run.flush(self.timeout)

    def _read_at(self, own: bool, run_id: str, name: str) -> bytes | None:
        self._text_now(own, name)
        if not self._exists(own, run_id, name):
            return None
        with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
            dest = os.path.join(tmp, "data")
            _files.download(run_id, name, dest, server=self._server, token=self._token)
            with open(dest, "rb") as f:
                return f.read()

    def _read_bytes(self, keys: tuple[object, ...], path: object = None) -> bytes | None:
        key = _key(keys, path)
        local = self._host_path(key)
        if local is not None:
            if not os.path.exists(local):
                return None
            with open(local, "rb") as f:
                return f.read()
        return self._read_at(*self._locate(keys, path))

    def _retrying(self, read, tries: int, delay: float):
        for attempt in range(max(1, tries)):
            try:
                return read()
            except _UNREACHABLE:
                if attempt + 1 >= max(1, tries):
                    raise
                time.sleep(delay)
        return None

    def upload_file(self, file_path: str | None = None, target_path: str = "files/") -> str:
        """Uploads the file at ``file_path`` to ``target_path`` (ending in ``/``:
        into that folder); returns the name once the server has it."""
        if file_path is None or not isinstance(file_path, str | os.PathLike):
            raise TypeError(f"file_path must be a path, not {file_path!r}")
        file_path = os.fspath(file_path)
        if not os.path.isfile(file_path):
            raise FileNotFoundError(f"{file_path} is not a file; upload_file uploads one file")
        if isinstance(target_path, os.PathLike):
            target_path = os.fspath(target_path)
        if not isinstance(target_path, str):
            raise TypeError(f"target_path must be a str, not {type(target_path).__name__}")
        target = target_path + os.path.basename(file_path) if target_path.endswith("/") else None
        local = self._host_path(target or target_path)
        if local is not None:
            os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
            shutil.copyfile(file_path, local)
            return target or target_path
        own, run_id, name = self._target((target or target_path,))
        self._upload(file_path, own, run_id, name)
        return name

    def upload_buffer(self, buffer: bytes, key: str) -> str:
        if not isinstance(buffer, bytes | bytearray | memoryview):
            raise TypeError(f"buffer must be bytes, not {type(buffer).__name__}")
        return self._put(key, bytes(buffer))

    def save_json(self, data: object, key: str) -> str:
        return self._put(key, json.dumps(_jsonable(data)).encode())

    def save_yaml(self, data: object, file: str) -> str:
        """``data`` as YAML (safe types: what JSON holds) into the run's file."""
        yaml = _yaml()
        return self._put(file, yaml.safe_dump(_jsonable(data), sort_keys=False).encode())

    def load_yaml(self, *keys: str, Loader: object = None) -> object:
        """The run's YAML file (``yaml.SafeLoader`` unless ``Loader`` says
        otherwise); None when it is absent."""
        yaml = _yaml()
        data = self._read_bytes(keys)
        return None if data is None else yaml.load(data.decode(), Loader=Loader or yaml.SafeLoader)

    def log_jsonl(self, data: object, key: str, **kwargs: object) -> None:
        """Appends ``data`` as one JSON line to the run's text file ``key``
        (uploaded as the run's other text is: see ``log_line``)."""
        self.log_line(json.dumps(_jsonable(data or {})), file=key, **kwargs)

    def load_jsonl(
        self,
        *keys: str,
        start: int | None = None,
        stop: int | None = None,
        tries: int = 1,
        delay: float = 1,
    ) -> list | None:
        """Each JSON line of the run's file (records ``start:stop``); None when absent."""
        data = self._retrying(lambda: self._read_bytes(keys), tries, delay)
        if data is None:
            return None
        records = []
        for number, line in enumerate(data.decode().splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError as e:
                    raise ValueError(f"{_key(keys)} line {number} is not JSON ({e})") from None
        return records[start:stop]

    def download_file(self, *path: str, to: str, relative: bool = False) -> str:
        """Downloads the run's file ``path`` to ``to`` (ending in ``/``: into that
        folder; ``relative``: at ``to/path``), checked against the server's hash."""
        if not isinstance(to, str | os.PathLike):
            raise TypeError(f"to must be a path, not {to!r}")
        to = os.fspath(to)
        own, run_id, name = self._locate(path)
        key = _key(path)
        if relative:
            dest = os.path.join(to, key)
        elif to.endswith("/") or os.path.isdir(to):
            dest = os.path.join(to, os.path.basename(key))
        else:
            dest = to
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        self._download(own, run_id, name, dest)
        return dest

    def load_file(self, *keys: str, path: str | None = None) -> io.BytesIO | None:
        data = self._read_bytes(keys, path)
        return None if data is None else io.BytesIO(data)

    def load_text(self, *keys: str) -> str | None:
        data = self._read_bytes(keys)
        return None if data is None else data.decode()

    def load_json(self, *keys: str) -> object:
        data = self._read_bytes(keys)
        return None if data is None else json.loads(data)

    def duplicate(self, source: str, to: str, exists_ok: bool = True, **kwargs: object) -> None:
        """Copies the run's file ``source`` to ``to``, or every file below the
        folder ``source`` to the same names below ``to`` (the server has
        their chunks, so only the downloads travel). Text logged to the run
        and not uploaded yet is uploaded first."""
        if isinstance(source, str) and isinstance(to, str) and not any(c in source for c in "*?["):
            _, _, found, _ = self._matching((source,))
            _, sub, _ = self._where()
            _, src = _parts(source, "path")
            if src and found and found != ["/".join([*sub, *src])]:  # a folder
                _, dst = _parts(to, "path")
                for name in found:
                    below = name.split("/")[len(sub) :]
                    target = "/".join([*dst, *below[len(src) :]])
                    self._duplicate_file("/".join(below), target, exists_ok)
                return
        self._duplicate_file(source, to, exists_ok)

    def _duplicate_file(self, source: str, to: str, exists_ok: bool) -> None:
        own, run_id, name = self._target((source,))
        own_to, run_to, name_to = self._target((to,))
        if not exists_ok and self._exists(own_to, run_to, name_to):
            raise FileExistsError(f"run {run_to} already has {name_to!r}")
        with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
            dest = os.path.join(tmp, "data")
            self._download(own, run_id, name, dest)
            self._upload(dest, own_to, run_to, name_to)

    # --- pickles ---------------------------------------------------------------------------

    def save_pkl(
        self,
        data: object,
        *keys: str,
        path: str | None = None,
        append: bool = False,
        use_dill: bool = False,
    ) -> str:
        """Pickles ``data`` into the run's file (``append``: one more record after
        those there); returns the name once the server has it. The bytes are
        recorded as this machine's (see ``load_pkl``)."""
        if use_dill:
            import dill

            record = dill.dumps(data)
        else:
            record = pickle.dumps(data)
        key = _key(keys, path)
        local = self._host_path(key)
        earlier = b""
        if append:
            earlier = self._read_bytes(keys, path) or b""
        whole = earlier + record
        # Appended to bytes that are not this machine's, the whole is not either.
        if not earlier or _state.trusted(earlier):
            _state.remember(whole)
        if local is not None:
            self._write_host(key, whole)
            return key
        own, run_id, name = self._target(keys, path)
        self._upload_bytes(whole, own, run_id, name)
        return name

    def log_data(self, data: object, path: str | None = None, overwrite: bool = False) -> str:
        return self.save_pkl(data, path, append=not overwrite)

    def load_pkl(
        self,
        *keys: str,
        start: int | None = None,
        stop: int | None = None,
        tries: int = 1,
        delay: float = 1,
        allow_pickle: bool = False,
    ) -> list | None:
        """Every pickle record of the file, as a list (None when it is absent).
        ``parameters.pkl`` and ``metrics.pkl`` are the run's params and
        metrics (no pickle involved) unless the run has a real file of
        that name.

        Unpickling runs code the file names, so a file is unpickled only
        when its bytes are exactly a pickle that a logger of this machine
        wrote (``save_pkl``/``log_data`` record each one's BLAKE3 in the
        client directory, ``RELAUNCH_DIR``; the hash is checked here on the
        bytes downloaded, so neither the server nor anyone who can write to
        it can pass other bytes off as those), or with consent:
        ``allow_pickle=True`` or ``RELAUNCH_ALLOW_PICKLE=1``.
        """
        key = _key(keys)
        local = self._host_path(key)

        def read() -> tuple[bytes | None, list | None]:
            if local is not None:
                if not os.path.exists(local):
                    return None, None
                with open(local, "rb") as f:
                    return f.read(), None
            own, run_id, name = self._locate(keys)
            data = self._read_at(own, run_id, name)
            if data is None:
                return None, self._virtual_records(own, run_id, name)
            return data, None

        data, records = self._retrying(read, tries, delay)
        if data is None:
            return None if records is None else records[start:stop]
        if not (allow_pickle or _consent() or _state.trusted(data)):
            raise PermissionError(
                f"load_pkl({key!r}) refused: unpickling runs whatever code the pickle names, and "
                "these bytes are not a pickle that a logger of this machine wrote (save_pkl and "
                "log_data record theirs). Pass allow_pickle=True (or set "
                f"{ALLOW_PICKLE_ENV}=1) if you trust whoever wrote it; prefer "
                "save_json()/load_json() or torch_save() for new data"
            )
        found, stream = [], io.BytesIO(data)
        while stream.tell() < len(data):
            found.append(pickle.load(stream))
        return found[start:stop]

    def iload_pkl(self, key: str, **kwargs: object):
        """The records of ``load_pkl(key)``, one at a time."""
        yield from self.load_pkl(key, **kwargs) or []

    # --- torch -----------------------------------------------------------------------------

    def torch_save(
        self, obj: object, *keys: str, path: str | None = None, tries: int = 3, backup: float = 3.0
    ) -> str:
        """``torch.save`` into the run's file; returns the name once the server
        has it (connection failures are retried ``tries`` times, then the
        file is queued for when the server answers)."""
        import torch

        return self._save_with(lambda f: torch.save(obj, f), keys, path, tries, backup)

    save_torch = torch_save

    def torch_jit_save(
        self, obj: object, *keys: str, path: str | None = None, tries: int = 3, backup: float = 3.0
    ) -> str:
        """``torch.jit.script(obj)`` (a scripted or traced module as it is)
        saved into the run's file, as ``torch_save`` saves."""
        import torch

        scripted = obj
        if not isinstance(obj, torch.jit.ScriptModule | torch.jit.ScriptFunction):
            scripted = torch.jit.script(obj)
        return self._save_with(lambda f: torch.jit.save(scripted, f), keys, path, tries, backup)

    def _save_with(self, save, keys: tuple, path: str | None, tries: int, backup: float) -> str:
        key = _key(keys, path)
        local = self._host_path(key)
        if local is not None:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            save(local)
            return key
        own, run_id, name = self._target(keys, path)
        with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
            tmp_path = os.path.join(tmp, "data.pt")
            save(tmp_path)
            self._upload(tmp_path, own, run_id, name, tries=tries, backup=backup)
        return name

    def _load_with(self, load, keys: tuple, path: str | None) -> object:
        key = _key(keys, path)
        local = self._host_path(key)
        if local is not None:
            return load(local)
        own, run_id, name = self._locate(keys, path)
        with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
            dest = os.path.join(tmp, "data.pt")
            self._download(own, run_id, name, dest)
            return load(dest)

    def torch_load(
        self,
        *keys: str,
        path: str | None = None,
        map_location: object = None,
        weights_only: bool = True,
        **kwargs: object,
    ) -> object:
        """``torch.load`` of the run's file with ``weights_only=True`` (tensors
        and plain containers only); pass ``weights_only=False`` to unpickle
        anything, for files you trust."""
        import torch

        return self._load_with(
            lambda f: torch.load(f, map_location=map_location, weights_only=weights_only, **kwargs),
            keys,
            path,
        )

    load_torch = torch_load

    def torch_jit_load(
        self, *keys: str, path: str | None = None, map_location: object = None, **kwargs: object
    ) -> object:
        """``torch.jit.load`` of the run's file (TorchScript, not a pickle of
        Python objects)."""
        import torch

        return self._load_with(
            lambda f: torch.jit.load(f, map_location=map_location, **kwargs), keys, path
        )

    def save_module(
        self, module: object, path: str = "weights.pkl", tries: int = 3, backup: float = 3.0
    ) -> str:
        state = module.module.state_dict() if hasattr(module, "module") else module.state_dict()  # type: ignore[attr-defined]
        return self.torch_save(state, path=path, tries=tries, backup=backup)

    def load_module(
        self,
        module: object,
        path: str = "weights.pkl",
        wd: str | None = None,
        map_location: object = None,
        **kwargs: object,
    ) -> None:
        """Loads a state dict saved with ``save_module`` (``*`` in ``path``: the
        last match, sorted) into ``module``."""
        if "*" in path:
            matches = self._glob_files(path, wd=wd)
            if not matches:
                raise FileNotFoundError(f"no file of the run matches {path!r}")
            path = matches[-1]
        elif wd:
            path = f"{wd}/{path}"
        state = self.torch_load(path, map_location=map_location)
        if not state:
            raise ValueError(f"{path} holds an empty state dict")
        module.load_state_dict(state)  # type: ignore[attr-defined]

    # --- folders and archives ----------------------------------------------------------------

    def upload_dir(
        self,
        dir_path: str,
        target: str,
        excludes: tuple[str, ...] | list[str] = (),
        archive: str | None = "tar",
        temp_dir: str | None = None,
    ) -> str:
        """Uploads the folder ``dir_path``: as one archive (``archive``: tar,
        gztar, bztar, xztar or zip) named ``target`` (ending in ``/``: into
        that folder, named after the folder), or with ``archive=None`` file
        by file below ``target``. ``excludes`` are glob patterns (``*.pyc``,
        ``.git``) matched against each file's and folder's name and path
        below ``dir_path``; ``temp_dir`` is where the archive is made. A
        ``file://`` target is a local path. Returns the name (or path)."""
        for what, value in (("dir_path", dir_path), ("target", target)):
            if not isinstance(value, str | os.PathLike):
                raise TypeError(f"{what} must be a path, not {value!r}")
        dir_path, target = os.fspath(dir_path), os.fspath(target)
        if not os.path.isdir(dir_path):
            raise NotADirectoryError(f"{dir_path} is not a folder; upload_file() uploads a file")
        if isinstance(excludes, str):
            excludes = (excludes,)
        _remote_scheme(target)
        local = self._host_path(target)
        chosen = _walk(dir_path, tuple(excludes))
        if not archive:
            if local is not None:
                for rel in chosen:
                    dest = os.path.join(local, rel)
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    shutil.copy2(os.path.join(dir_path, rel), dest)
                return target
            folder = target.rstrip("/")
            for rel in chosen:
                self.upload_file(os.path.join(dir_path, rel), f"{folder}/{rel}")
            return folder
        if archive not in _ARCHIVES:
            raise ValueError(f"archive={archive!r}: use one of {', '.join(_ARCHIVES)}, or None")
        suffix = _ARCHIVES[archive][1]
        if target.endswith("/"):
            target += os.path.basename(os.path.abspath(dir_path)) + suffix
        with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-", dir=temp_dir) as tmp:
            made = os.path.join(tmp, "archive" + suffix)
            _archive(made, archive, dir_path, chosen)
            if local is not None:
                os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
                shutil.copyfile(made, local)
                return target
            return self.upload_file(made, target)

    def download_dir(self, source_path: str, to: str, unpack: str | None = "tar") -> str:
        """Downloads the archive ``source_path`` of the run and unpacks it
        (``unpack``: tar, gztar, bztar, xztar or zip) into the folder ``to``;
        with ``unpack=None``, downloads the run's folder ``source_path``
        (every file below it, or the one file it names) into ``to``.
        Archive members that would land outside ``to`` (``..``, absolute
        paths, links out) are refused. Returns ``to``."""
        for what, value in (("source_path", source_path), ("to", to)):
            if not isinstance(value, str | os.PathLike):
                raise TypeError(f"{what} must be a path, not {value!r}")
        source_path, to = os.fspath(source_path), os.path.abspath(os.fspath(to))
        _remote_scheme(source_path)
        local = self._host_path(source_path)
        if unpack:
            if unpack not in _ARCHIVES:
                raise ValueError(f"unpack={unpack!r}: use one of {', '.join(_ARCHIVES)}, or None")
            with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
                archive = local or self.download_file(source_path, to=os.path.join(tmp, "archive"))
                os.makedirs(to, exist_ok=True)
                _unpack(archive, to, unpack)
            return to
        if local is not None:
            if os.path.isdir(local):
                shutil.copytree(local, to, dirs_exist_ok=True)
            else:
                shutil.copy2(local, to)
            return to
        own, run_id, name = self._locate((source_path,))
        if self._exists(own, run_id, name):
            self._download(own, run_id, name, to)
            return to
        below = [
            f["name"] for f in self._api().files(run_id) or [] if f["name"].startswith(name + "/")
        ]
        if not below:
            raise FileNotFoundError(f"run {run_id} has no file or folder {name!r}")
        for file_name in below:
            dest = os.path.join(to, file_name[len(name) + 1 :])
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            _files.download(run_id, file_name, dest, server=self._server, token=self._token)
        return to

    def make_archive(
        self,
        base_name: str | None = None,
        format: str = "tar",
        root_dir: str | None = None,
        base_dir: str | None = None,
        **archive_kwargs: object,
    ) -> str:
        """An archive of the run's files under ``root_dir`` (under the current
        prefix; all of them by default), with paths below ``root_dir``
        (``base_dir``: only that folder of it), uploaded as ``base_name``
        plus the format's suffix (``target`` becomes ``target.tar``), as
        ``shutil.make_archive`` names it. Made here: the files are
        downloaded, archived and uploaded (ml-logger's server made it in
        place). Params and metrics are not files: ``save_json`` them first.
        Returns ``base_name``."""
        if not isinstance(base_name, str) or not base_name:
            raise TypeError(
                f"base_name must name the archive (e.g. 'checkpoints'), not {base_name!r}"
            )
        if format not in _ARCHIVES:
            raise ValueError(f"format={format!r}: use one of {', '.join(_ARCHIVES)}")
        if archive_kwargs:
            raise TypeError(
                f"make_archive() takes no {sorted(archive_kwargs)}: the archive is made here, "
                "from the run's files"
            )
        own, sub, run_id = self._where()
        root = "/".join([*sub, *(_parts(root_dir, "root_dir")[1] if root_dir else [])])
        inner = "/".join(_parts(base_dir, "base_dir")[1]) if base_dir else ""
        self._fresh(own)
        names = [f["name"] for f in self._api().files(run_id) or []]
        prefix = root + "/" if root else ""
        chosen = [n for n in names if n.startswith(prefix)]
        if inner:
            chosen = [n for n in chosen if n[len(prefix) :].startswith(inner + "/")]
        if not chosen:
            raise FileNotFoundError(
                f"run {run_id} has no file under {(prefix + inner) or 'its prefix'!r} to archive"
            )
        with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
            files = os.path.join(tmp, "files")
            rels = []
            for name in chosen:
                rel = name[len(prefix) :]
                dest = os.path.join(files, rel)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                _files.download(run_id, name, dest, server=self._server, token=self._token)
                rels.append(rel)
            suffix = _ARCHIVES[format][1]
            made = os.path.join(tmp, "archive" + suffix)
            _archive(made, format, files, rels)
            own_to, run_to, target = self._target((base_name + suffix,))
            self._upload(made, own_to, run_to, target)
        return base_name


def _yaml():
    try:
        import yaml
    except ImportError:
        raise ImportError("save_yaml/load_yaml need PyYAML: pip install pyyaml") from None
    return yaml


def _excluded(rel: str, patterns: tuple[str, ...]) -> bool:
    parts = rel.split("/")
    return any(
        fnmatch.fnmatch(rel, p) or any(fnmatch.fnmatch(part, p) for part in parts) for p in patterns
    )


def _walk(root: str, excludes: tuple[str, ...]) -> list[str]:
    """The files below ``root`` (paths with ``/``), sorted, without ``excludes``;
    links are followed only when they stay inside ``root``."""
    real_root = os.path.realpath(root)
    chosen = []
    for folder, dirs, names in os.walk(root):
        rel_folder = os.path.relpath(folder, root).replace(os.sep, "/")
        rel_folder = "" if rel_folder == "." else rel_folder + "/"
        dirs[:] = sorted(d for d in dirs if not _excluded(rel_folder + d, excludes))
        for name in sorted(names):
            rel = rel_folder + name
            path = os.path.join(folder, name)
            inside = os.path.realpath(path).startswith(real_root + os.sep)
            if not _excluded(rel, excludes) and os.path.isfile(path) and inside:
                chosen.append(rel)
    return chosen


def _archive(dest: str, format: str, root: str, rels: list[str]) -> None:
    mode = _ARCHIVES[format][0]
    if mode is None:
        with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
            for rel in rels:
                z.write(os.path.join(root, rel), rel)
        return
    with tarfile.open(dest, mode) as t:
        for rel in rels:
            t.add(os.path.join(root, rel), arcname=rel, recursive=False)


def _unpack(archive: str, to: str, format: str) -> None:
    """Unpacks ``archive`` into ``to``, refusing members that would land outside it."""
    real_to = os.path.realpath(to)

    def inside(name: str) -> bool:
        target = os.path.realpath(os.path.join(real_to, name))
        return target == real_to or target.startswith(real_to + os.sep)

    if _ARCHIVES[format][0] is None:
        with zipfile.ZipFile(archive) as z:
            bad = [n for n in z.namelist() if os.path.isabs(n) or not inside(n)]
            if bad:
                raise ValueError(f"{archive}: members outside the folder: {bad[:5]}; not unpacked")
            z.extractall(to)
        return
    with tarfile.open(archive, "r:*") as t:
        members = t.getmembers()
        bad = [
            m.name
            for m in members
            if os.path.isabs(m.name)
            or not inside(m.name)
            or (
                (m.issym() or m.islnk())
                and not inside(os.path.join(os.path.dirname(m.name), m.linkname))
            )
            or m.isdev()
        ]
        if bad:
            raise ValueError(f"{archive}: members outside the folder: {bad[:5]}; not unpacked")
        if hasattr(tarfile, "data_filter"):
            t.extractall(to, filter="data")
        else:
            t.extractall(to)
