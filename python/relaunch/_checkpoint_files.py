"""The checkpointer's disk side: durable writes (fsync, atomic replace, the
``latest`` pointer), manifests and their verification, and which
checkpoints retention keeps. No agreement between ranks here; see
:mod:`relaunch.checkpoint` for the layout and the commit protocol."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from relaunch import _native
from relaunch.errors import CheckpointError

MANIFEST = "manifest.json"
LATEST = "latest"
FORMAT = "relaunch-checkpoint/1"
STEP_DIR = re.compile(r"^step_(\d+)$")
# Temporaries at the top of DIR: step dirs being written or deleted, and the
# `latest` symlink being swapped. TOKEN is SESSION-RANDOM.
TEMPORARY = re.compile(r"^(?:step_\d+|latest)\.(?:tmp|old)-([0-9a-f]+)-[0-9a-f]+$")
# Files hashed at once by one rank; the native hash releases the GIL.
_HASH_THREADS = 8


# --- durable file operations -------------------------------------------------


def fsync(path: Path | str) -> None:
    """fsync a file or a directory (a directory's fsync makes its entries durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Writes ``path`` whole or not at all: temporary name, fsync, rename.
    The caller fsyncs the directory."""
    temp = path.with_name(f"{path.name}.tmp-{os.urandom(4).hex()}")
    with open(temp, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def point_latest(root: Path, target: str, token: str) -> None:
    """Swaps ``root/latest`` to point at ``target``: a new symlink under a
    temporary name renamed over the old one (a file naming the target where
    the file system has no symlinks). The caller fsyncs ``root``."""
    temp = root / f"{LATEST}.tmp-{token}"
    try:
        os.symlink(target, temp)
    except OSError:
        with open(temp, "x") as f:
            f.write(target + "\n")
            f.flush()
            os.fsync(f.fileno())
    os.replace(temp, root / LATEST)


def remove(path: Path) -> None:
    """Removes a directory (or file) for good; first renamed out of the way by callers."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def walk(root: Path) -> dict[str, int]:
    """Every regular file under ``root``: relative ``/`` name -> size."""
    files: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*filenames, *dirnames]:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError(
                    f"{full} is not a regular file (a symlink or special file); a checkpoint "
                    "holds regular files only: write the file itself into the directory"
                )
            files[rel] = st.st_size
    return files


def subdirs(root: Path) -> list[str]:
    """Every directory below ``root`` (not itself), deepest first."""
    out = [dirpath for dirpath, _, _ in os.walk(root) if dirpath != str(root)]
    return sorted(out, key=lambda p: p.count(os.sep), reverse=True)


def _fsync_size(path: Path) -> int:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        return os.fstat(f.fileno()).st_size


def fsync_and_hash(root: Path, names: list[str], durable: bool = True) -> dict[str, list]:
    """fsync and hash ``names``: name -> [size, blake3]; only their sizes,
    with no hash (None), where not ``durable`` (the memory tier: nothing to
    sync, and the commit's rename is what makes a snapshot whole).

    Each file's fsync runs beside its hash, not before it: the disk writes
    the file out while the CPUs hash it from the page cache, so a commit
    costs about the longer of the two, not their sum. Both release the GIL;
    several files go at once."""
    if not names:
        return {}
    if not durable:
        return {name: [os.stat(root / name).st_size, None] for name in names}
    from concurrent.futures import ThreadPoolExecutor  # not at import: it loads logging

    with ThreadPoolExecutor(min(2 * len(names), _HASH_THREADS)) as pool:
        # Interleaved, so that the first files' hashes do not queue behind
        # every fsync.
        jobs = [
            (
                name,
                pool.submit(_fsync_size, root / name),
                pool.submit(_native.hash_file, root / name),
            )
            for name in names
        ]
        return {name: [size.result(), digest.result()] for name, size, digest in jobs}


# --- manifests ---------------------------------------------------------------


def gather(
    root: Path, reports: list[dict[str, Any]], shared: str, writer: str, durable: bool = True
) -> dict[str, list]:
    """The committer's view of a checkpoint directory ``root``: every
    rank's report (``seen`` names, ``hashed`` entries) merged, what no rank
    hashed fsynced and hashed here, each file checked to be there with the
    size it was hashed at, and the subdirectories fsynced (``root``'s own
    entry is the caller's, after the manifest). ``shared`` names the
    directory in the message for a file only another rank sees; ``writer``
    the call after which nothing may still write."""
    files: dict[str, list] = {}
    seen: set[str] = set()
    for report in reports:
        seen.update(report["seen"])
        files.update(report["hashed"])
    if MANIFEST in seen:
        raise CheckpointError(
            f"{root / MANIFEST} was written by the training code, but {MANIFEST} is the "
            "checkpoint's own manifest: name that file differently"
        )
    missing = sorted(seen - set(files))
    files.update(fsync_and_hash(root, [n for n in missing if (root / n).exists()], durable))
    for name in sorted(seen):
        if name not in files:
            raise CheckpointError(
                f"rank 0 does not see {root / name}, which another rank wrote: the {shared} "
                "must be on a file system shared by every rank"
            )
        try:
            size = os.stat(root / name).st_size
        except FileNotFoundError:
            size = -1
        if size != files[name][0]:
            raise CheckpointError(
                f"{root / name} changed while it was committed ({files[name][0]} bytes "
                f"hashed, {size} now): is something still writing it after {writer}?"
            )
    if durable:
        for directory in subdirs(root):
            fsync(directory)
    return files


def canonical(manifest: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in manifest.items() if k != "blake3"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def safe_name(name: object) -> bool:
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name:
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def read_manifest(path: Path, step: int) -> tuple[dict[str, Any] | None, str]:
    """The manifest of checkpoint ``path`` if it is intact, else why not."""
    try:
        raw = (path / MANIFEST).read_bytes()
    except FileNotFoundError:
        return None, f"it has no {MANIFEST} (its commit did not finish)"
    except OSError as e:
        return None, f"its {MANIFEST} cannot be read: {e}"
    try:
        manifest = json.loads(raw)
    except ValueError:
        return None, f"its {MANIFEST} is not valid JSON (truncated or overwritten)"
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None, f"its {MANIFEST} is not a relaunch checkpoint manifest ({FORMAT})"
    if manifest.get("blake3") != _native.hash_bytes(canonical(manifest)):
        return None, f"its {MANIFEST} does not match its own BLAKE3 (it was altered)"
    if manifest.get("step") != step:
        return None, f"its {MANIFEST} is of step {manifest.get('step')!r}, not {step}"
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(safe_name(n) for n in files):
        return None, f"its {MANIFEST} names a file outside the checkpoint"
    return manifest, ""


def verify_checkpoint(path: Path, step: int, full: bool) -> tuple[dict[str, Any] | None, str]:
    """The manifest if the checkpoint verifies (sizes; BLAKE3 too if ``full``)."""
    manifest, problem = read_manifest(path, step)
    if manifest is None:
        return None, problem
    files = manifest["files"]
    for name, entry in sorted(files.items()):
        try:
            st = os.stat(path / name)
        except FileNotFoundError:
            return None, f"{name} is missing"
        if not stat.S_ISREG(st.st_mode):
            return None, f"{name} is not a regular file"
        if st.st_size != entry.get("size"):
            return None, f"{name} has {st.st_size} bytes, the manifest says {entry.get('size')}"
    if full:
        from concurrent.futures import ThreadPoolExecutor

        names = sorted(n for n in files if files[n].get("blake3") is not None)
        with ThreadPoolExecutor(max(1, min(len(names), _HASH_THREADS))) as pool:
            hashes = pool.map(lambda n: _native.hash_file(path / n), names)
            for name, digest in zip(names, hashes, strict=True):
                if digest != files[name].get("blake3"):
                    return None, f"{name} does not match its BLAKE3 hash (its contents changed)"
    return manifest, ""


# --- retention -----------------------------------------------------------------


def kept(
    committed: Mapping[int, dict[str, Any] | None],
    keep_last: int | None,
    keep_every: int | None,
    keep_best: tuple[str, str, int] | None,
) -> set[int]:
    """Steps that retention keeps among ``committed`` (step -> manifest, None
    when unreadable: those are never deleted); the newest is always kept."""
    steps = sorted(committed)
    keep = set(steps[-1:])
    keep |= set(steps if keep_last is None else steps[-keep_last:])
    if keep_every is not None:
        keep |= {s for s in steps if s % keep_every == 0}
    keep |= {s for s, m in committed.items() if m is None or m.get("forced")}
    if keep_best is not None:
        metric, mode, count = keep_best
        scored = []
        for s, m in committed.items():
            value = ((m or {}).get("metrics") or {}).get(metric)
            if isinstance(value, int | float) and not isinstance(value, bool):
                if math.isfinite(value):
                    scored.append((value if mode == "min" else -value, -s, s))
        keep |= {s for _, _, s in sorted(scored)[:count]}
    return keep
