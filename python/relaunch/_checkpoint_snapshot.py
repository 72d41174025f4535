"""Memory snapshots written in place: what ``Checkpointer.save_async``
writes into the memory tier, and how :meth:`Checkpoint.load_file` reads it.

``torch.save`` into shared memory costs far more than the copy itself: a
fresh file's every page is faulted in, and the zip writer computes a CRC
over every byte (60 ms for 100 MB on a 2-core machine, against 5 ms for
the copy). So a snapshot file is laid out for one copy:

    "RELAUNCH-SNAP/1\\n"  u64 header offset  u64 header length  (zero padding)
    tensor bytes, each contiguous, 64-byte aligned, from offset 4096
    header: a pickle of the state with every tensor replaced by its
            (offset, dtype, shape) and its requires_grad

and its pages are reused: when a snapshot is pruned, its large files move
to the tier's ``spare/`` directory instead of being deleted, and the next
snapshot of the same name takes one, still mapped in this process, and
writes over it. The tier thus holds two snapshots (the newest and the one
being written), as ``--snapshot-memory`` allows for.

Read back with :func:`load` (``Checkpoint.load_file`` does), which copies
every tensor out, so the file may be reused at once.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
from pathlib import Path
from typing import Any

from relaunch._checkpoint_stage import rebuild

MAGIC = b"RELAUNCH-SNAP/1\n"
_PREFIX = struct.Struct("<16sQQ")
_DATA_START = 4096
_ALIGN = 64
# Files at least this big are kept for the next snapshot when pruned.
RECYCLE_MIN = 1 << 20
# Mappings kept open per writer (two files alternate per name).
_MAPPINGS = 8


class _Ref:
    """A tensor's place in the file, in the pickled header."""

    __slots__ = ("dtype", "offset", "requires_grad", "shape")

    def __init__(self, offset: int, dtype: str, shape: tuple, requires_grad: bool) -> None:
        self.offset, self.dtype, self.shape, self.requires_grad = (
            offset,
            dtype,
            shape,
            requires_grad,
        )

    def __getstate__(self) -> tuple:
        return (self.offset, self.dtype, self.shape, self.requires_grad)

    def __setstate__(self, state: tuple) -> None:
        self.offset, self.dtype, self.shape, self.requires_grad = state


def is_snapshot(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


class Writer:
    """Writes states into snapshot files, reusing files and their mappings."""

    def __init__(self) -> None:
        # inode -> (mapping, its length); the oldest dropped past _MAPPINGS.
        self._maps: dict[int, tuple[mmap.mmap, int]] = {}

    def close(self) -> None:
        for mapping, _ in self._maps.values():
            try:
                mapping.close()
            except BufferError:  # a view still exported: the GC closes it
                pass
        self._maps.clear()

    def write(self, state: Any, file: Path, spare: Path | None, torch: Any) -> int:
        """Writes ``state`` as ``file`` (taking ``spare/NAME`` to write over
        if there is one); returns the file's size."""
        plan = _Plan(torch)
        header_state = plan.walk(state)
        header = pickle.dumps(header_state, protocol=pickle.HIGHEST_PROTOCOL)
        size = plan.end + len(header)
        if spare is not None:
            try:
                os.rename(spare / file.name, file)
            except FileNotFoundError:
                pass
        fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            st = os.fstat(fd)
            held = self._maps.get(st.st_ino)
            if held is not None and held[1] == size == st.st_size:
                mapping = held[0]  # written before at this size: allocated, mapped
            else:
                if st.st_size > size:
                    os.ftruncate(fd, size)
                # Allocated before it is mapped: a full tmpfs says ENOSPC
                # here, where a write through the mapping would be SIGBUS.
                os.posix_fallocate(fd, 0, size)
                mapping = self._mapping(fd, st.st_ino, size)
        finally:
            os.close(fd)
        _PREFIX.pack_into(mapping, 0, MAGIC, plan.end, len(header))
        _copy_in(mapping, plan, header, size, torch)
        return size

    def _mapping(self, fd: int, inode: int, size: int) -> mmap.mmap:
        held = self._maps.get(inode)
        if held is not None and held[1] == size:
            return held[0]
        if held is not None:
            self._drop(inode)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapping = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self._maps[inode] = (mapping, size)
        while len(self._maps) > _MAPPINGS:
            self._drop(next(iter(self._maps)))
        return mapping

    def _drop(self, inode: int) -> None:
        mapping, _ = self._maps.pop(inode)
        try:
            mapping.close()
        except BufferError:
            pass


def _copy_in(mapping: mmap.mmap, plan: _Plan, header: bytes, size: int, torch: Any) -> None:
    """The tensors and the header into the mapping (its views end here)."""
    buffer = torch.frombuffer(mapping, dtype=torch.uint8, count=size)
    for tensor, offset, nbytes in plan.tensors:
        if nbytes:
            dst = buffer[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape)
            dst.copy_(tensor.detach())
    buffer[plan.end : size].copy_(torch.frombuffer(bytearray(header), dtype=torch.uint8))


class _Plan:
    """The header's state and where each tensor goes (tied tensors once)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.tensors: list[tuple[Any, int, int]] = []
        self.end = _DATA_START
        self._memo: dict[tuple, _Ref] = {}

    def walk(self, obj: Any) -> Any:
        return rebuild(obj, self._leaf)

    def _leaf(self, obj: Any) -> Any:
        torch = self.torch
        if not isinstance(obj, torch.Tensor):
            return obj
        if (
            obj.layout == torch.strided
            and not obj.is_quantized
            and obj.device.type
            in (
                "cpu",
                "cuda",
            )
        ):
            return self._tensor(obj)
        return obj.detach().to("cpu", copy=True)

    def _tensor(self, t: Any) -> _Ref:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride(), t.dtype)
        if key in self._memo:
            return self._memo[key]
        nbytes = t.numel() * t.element_size()
        offset = self.end
        self.end = -(-(offset + nbytes) // _ALIGN) * _ALIGN
        self.tensors.append((t, offset, nbytes))
        dtype = str(t.dtype).removeprefix("torch.")
        ref = _Ref(offset, dtype, tuple(t.shape), bool(t.requires_grad))
        self._memo[key] = ref
        return ref


def load(path: Path, map_location: Any, torch: Any) -> Any:
    """The state in snapshot file ``path``, every tensor copied out of it."""
    with open(path, "rb") as f:
        # Private and writable (copy on write, never written): torch's
        # frombuffer wants a writable buffer.
        mapping = mmap.mmap(
            f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
        )
    try:
        magic, header_at, header_len = _PREFIX.unpack_from(mapping, 0)
        if magic != MAGIC or header_at + header_len != len(mapping):
            raise ValueError(f"{path} is not a whole relaunch memory snapshot")
        state = pickle.loads(mapping[header_at : header_at + header_len])
        return _restore(state, mapping, map_location, torch, {})
    finally:
        mapping.close()


def _restore(obj: Any, data: mmap.mmap, map_location: Any, torch: Any, memo: dict) -> Any:
    def leaf(obj: Any) -> Any:
        if not isinstance(obj, _Ref):
            return obj
        if id(obj) in memo:  # tied tensors: one _Ref, kept one by pickle
            return memo[id(obj)]
        dtype = getattr(torch, obj.dtype)
        count = 1
        for n in obj.shape:
            count *= n
        itemsize = torch.empty((), dtype=dtype).element_size()
        tensor = torch.empty(obj.shape, dtype=dtype)
        if count:
            _copy_out(tensor, data, obj.offset, count * itemsize, torch)
        if map_location is not None:
            tensor = tensor.to(map_location)
        tensor.requires_grad_(obj.requires_grad)
        memo[id(obj)] = tensor
        return tensor

    return rebuild(obj, leaf)


def _copy_out(tensor: Any, data: mmap.mmap, offset: int, nbytes: int, torch: Any) -> None:
    source = torch.frombuffer(data, dtype=torch.uint8, count=nbytes, offset=offset)
    tensor.view(-1).view(torch.uint8).copy_(source)


def recycle(step_dir: Path, spare: Path) -> None:
    """Moves ``step_dir``'s large files into ``spare`` (replacing what is
    there) for the next snapshot to write over."""
    try:
        entries = list(os.scandir(step_dir))
    except FileNotFoundError:
        return
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False) and entry.stat().st_size >= RECYCLE_MIN:
                spare.mkdir(exist_ok=True)
                os.replace(entry.path, spare / entry.name)
        except OSError:
            continue
