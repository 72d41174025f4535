"""`relaunch._native.hash_file`, which the Checkpointer's manifests rely on:
the BLAKE3 of the whole file, whatever its size falls on (the native side
reads 8 MiB at a time and hashes each read on every core)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from relaunch import _native

MIB = 1 << 20


@pytest.mark.parametrize(
    "size",
    [
        0,
        1,
        1024,
        128 * 1024 - 1,
        128 * 1024,
        8 * MIB - 1,
        8 * MIB,
        8 * MIB + 1,
        16 * MIB,
        19 * MIB + 7,
    ],
)
def test_hash_file_is_the_blake3_of_the_whole_file(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    assert _native.hash_file(path) == _native.hash_bytes(data)


def test_hash_file_of_a_missing_file_raises_file_not_found_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as e:
        _native.hash_file(tmp_path / "missing.pt")
    assert e.value.filename == str(tmp_path / "missing.pt")
