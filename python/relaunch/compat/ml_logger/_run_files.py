"""Files: the run's files on the server, written and read the ml-logger way
(``upload_file``, ``save_pkl``, ``torch_save``, ``load_json``, ``glob``, ...)
through relaunch's chunked, hash-checked transfers. A write returns once the
server lists the file with the uploaded size and BLAKE3, and raises
otherwise; ``file://`` keys stay on the local disk."""

from __future__ import annotations

import io
import json
import os
import pickle
import tempfile
import time

from relaunch import files as _files
from relaunch.errors import TrackingConnectionError, TrackingError, TrackingTimeoutError

from ._names import _glob_regex, _key, _local_path, _parts
from ._values import _jsonable

ALLOW_PICKLE_ENV = "RELAUNCH_ALLOW_PICKLE"
"""``1`` lets ``load_pkl`` unpickle what the server holds without ``allow_pickle=True``."""


class _FilesMixin:
    """The file methods of ``ML_Logger``: a key names a file of the current
    prefix's run (``_target``); the logger's own run is made sure to exist on
    the server first (``_on_server``), another run must exist already."""

    def _upload(
        self, local: str, own: bool, run_id: str, name: str, tries: int = 1, backup: float = 0
    ) -> _files.Uploaded:
        """Uploads ``local`` as ``name``: returns once the server committed it and
        lists it with the same size and BLAKE3; raises otherwise."""
        if own:
            self._on_server()
        else:
            self._other_run(run_id)
        for attempt in range(max(1, tries)):
            try:
                done = _files.upload_file(
                    local, run_id, name, server=self._server, token=self._token
                )
                break
            except (TrackingConnectionError, TrackingTimeoutError):
                if attempt + 1 >= max(1, tries):
                    raise
                time.sleep(backup)
        size = os.path.getsize(local)
        listed = {f["name"]: f for f in self._api().files(run_id) or []}.get(name)
        if (
            done.size != size
            or not listed
            or (listed["size"], listed["blake3"])
            != (
                done.size,
                done.blake3,
            )
        ):
            raise TrackingError(
                f"{name} of run {run_id} is not on the server as uploaded (local {size} bytes, "
                f"sent {done.size}, server lists {listed}); upload it again"
            )
        if own:
            self._on_server_files.add(name)
        return done

    def _upload_bytes(self, data: bytes, own: bool, run_id: str, name: str) -> None:
        with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
            path = os.path.join(tmp, "data")
            with open(path, "wb") as f:
                f.write(data)
            self._upload(path, own, run_id, name)

    def _exists(self, own: bool, run_id: str, name: str) -> bool:
        if own and self._run is not None:
            self._on_server()
        listed = self._api().files(run_id)
        return listed is not None and any(f["name"] == name for f in listed)

    def _download(self, own: bool, run_id: str, name: str, dest: str) -> None:
        if not self._exists(own, run_id, name):
            raise FileNotFoundError(f"run {run_id} has no file {name!r} on {self._server}")
        _files.download(run_id, name, dest, server=self._server, token=self._token)

    def _read_bytes(self, keys: tuple[object, ...], path: object = None) -> bytes | None:
        key = _key(keys, path)
        local = _local_path(key)
        if local is not None:
            if not os.path.exists(local):
                return None
            with open(local, "rb") as f:
                return f.read()
        own, run_id, name = self._target(keys, path)
        if not self._exists(own, run_id, name):
            return None
        with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
            dest = os.path.join(tmp, "data")
            _files.download(run_id, name, dest, server=self._server, token=self._token)
            with open(dest, "rb") as f:
                return f.read()

    def upload_file(self, file_path: str | None = None, target_path: str = "files/") -> str:
        """Uploads the file at ``file_path`` to ``target_path`` (ending in ``/``:
        into that folder); returns the name once the server has it."""
        if file_path is None or not isinstance(file_path, str | os.PathLike):
            raise TypeError(f"file_path must be a path, not {file_path!r}")
        file_path = os.fspath(file_path)
        if not os.path.isfile(file_path):
            raise FileNotFoundError(f"{file_path} is not a file; upload_file uploads one file")
        if not isinstance(target_path, str):
            raise TypeError(f"target_path must be a str, not {type(target_path).__name__}")
        target = target_path + os.path.basename(file_path) if target_path.endswith("/") else None
        own, run_id, name = self._target((target or target_path,))
        self._upload(file_path, own, run_id, name)
        return name

    def upload_buffer(self, buffer: bytes, key: str) -> str:
        if not isinstance(buffer, bytes | bytearray | memoryview):
            raise TypeError(f"buffer must be bytes, not {type(buffer).__name__}")
        own, run_id, name = self._target((key,))
        self._upload_bytes(bytes(buffer), own, run_id, name)
        return name

    def save_json(self, data: object, key: str) -> str:
        own, run_id, name = self._target((key,))
        self._upload_bytes(json.dumps(_jsonable(data)).encode(), own, run_id, name)
        return name

    def download_file(self, *path: str, to: str, relative: bool = False) -> str:
        """Downloads the run's file ``path`` to ``to`` (ending in ``/``: into that
        folder; ``relative``: at ``to/path``), checked against the server's hash."""
        if not isinstance(to, str | os.PathLike):
            raise TypeError(f"to must be a path, not {to!r}")
        to = os.fspath(to)
        own, run_id, name = self._target(path)
        key = _key(path)
        if relative:
            dest = os.path.join(to, key)
        elif to.endswith("/"):
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

    def glob(
        self,
        query: str,
        wd: str | None = None,
        recursive: bool = True,
        start: int | None = None,
        stop: int | None = None,
    ) -> list[str] | None:
        """The run's files and folders under the current prefix (and ``wd``)
        that match ``query``; None when the run is not on the server."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, not {type(query).__name__}")
        _, query_parts = _parts(query, "glob query")
        own, sub, run_id = self._where()
        base = [*sub, *(_parts(wd, "wd")[1] if wd else [])]
        if own and self._run is not None:
            self._on_server()
        listed = self._api().files(run_id)
        if listed is None:
            return None
        below = []
        for f in listed:
            parts = f["name"].split("/")
            if parts[: len(base)] == base and len(parts) > len(base):
                below.append(parts[len(base) :])
        found = {"/".join(p[:i]) for p in below for i in range(1, len(p) + 1)}
        pattern = _glob_regex("/".join(query_parts), recursive)
        return sorted(p for p in found if pattern.fullmatch(p))[start:stop]

    def duplicate(self, source: str, to: str, exists_ok: bool = True, **kwargs: object) -> None:
        """Copies the run's file ``source`` to ``to`` (the server has its chunks,
        so only the download travels)."""
        own, run_id, name = self._target((source,))
        own_to, run_to, name_to = self._target((to,))
        if not exists_ok and self._exists(own_to, run_to, name_to):
            raise FileExistsError(f"run {run_to} already has {name_to!r}")
        with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
            dest = os.path.join(tmp, "data")
            self._download(own, run_id, name, dest)
            self._upload(dest, own_to, run_to, name_to)

    def save_pkl(
        self,
        data: object,
        *keys: str,
        path: str | None = None,
        append: bool = False,
        use_dill: bool = False,
    ) -> str:
        """Pickles ``data`` into the run's file (``append``: one more record after
        those there); returns the name once the server has it."""
        if use_dill:
            import dill

            record = dill.dumps(data)
        else:
            record = pickle.dumps(data)
        key = _key(keys, path)
        local = _local_path(key)
        if local is not None:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with open(local, "ab" if append else "wb") as f:
                f.write(record)
            return key
        own, run_id, name = self._target(keys, path)
        earlier = self._read_bytes(keys, path) if append else None
        self._upload_bytes((earlier or b"") + record, own, run_id, name)
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

        Unpickling runs code the file names, so it needs consent:
        ``allow_pickle=True`` or ``RELAUNCH_ALLOW_PICKLE=1``.
        """
        if not (allow_pickle or os.environ.get(ALLOW_PICKLE_ENV, "").strip() in ("1", "true")):
            raise PermissionError(
                f"load_pkl({_key(keys)!r}) refused: unpickling runs whatever code the pickle "
                "names, so a file from a server is only unpickled with consent. Pass "
                f"allow_pickle=True (or set {ALLOW_PICKLE_ENV}=1) if you trust whoever wrote "
                "it; prefer save_json()/load_json() or torch_save() for new data"
            )
        data = None
        for attempt in range(max(1, tries)):
            try:
                data = self._read_bytes(keys)
                break
            except (TrackingConnectionError, TrackingTimeoutError):
                if attempt + 1 >= max(1, tries):
                    raise
                time.sleep(delay)
        if data is None:
            return None
        records, stream = [], io.BytesIO(data)
        while stream.tell() < len(data):
            records.append(pickle.load(stream))
        return records[start:stop]

    def torch_save(
        self, obj: object, *keys: str, path: str | None = None, tries: int = 3, backup: float = 3.0
    ) -> str:
        """``torch.save`` into the run's file; returns the name once the server
        has it (connection failures are retried ``tries`` times)."""
        import torch

        key = _key(keys, path)
        local = _local_path(key)
        if local is not None:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            torch.save(obj, local)
            return key
        own, run_id, name = self._target(keys, path)
        with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
            tmp_path = os.path.join(tmp, "data.pt")
            torch.save(obj, tmp_path)
            self._upload(tmp_path, own, run_id, name, tries=tries, backup=backup)
        return name

    save_torch = torch_save

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

        key = _key(keys, path)
        local = _local_path(key)
        if local is None:
            own, run_id, name = self._target(keys, path)
            with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
                dest = os.path.join(tmp, "data.pt")
                self._download(own, run_id, name, dest)
                return torch.load(
                    dest, map_location=map_location, weights_only=weights_only, **kwargs
                )
        return torch.load(local, map_location=map_location, weights_only=weights_only, **kwargs)

    load_torch = torch_load

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
            matches = self.glob(path, wd=wd)
            if not matches:
                raise FileNotFoundError(f"no file of the run matches {path!r}")
            path = matches[-1]
        elif wd:
            path = f"{wd}/{path}"
        state = self.torch_load(path, map_location=map_location)
        if not state:
            raise ValueError(f"{path} holds an empty state dict")
        module.load_state_dict(state)  # type: ignore[attr-defined]
