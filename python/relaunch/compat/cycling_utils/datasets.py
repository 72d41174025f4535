"""cycling_utils' ``DistributedShardedDataset`` (``cycling_utils.datasets``):
an image-folder dataset of which each rank loads its own shard into memory.

As there: ``root`` holds one folder per class (``root/CLASS/.../FILE``,
classes sorted by name, files by path, as torchvision's ``ImageFolder``
finds them); the samples are shuffled with ``random.seed(seed)`` (the
``random`` module's global generator, as cycling_utils, so it is seeded
afterwards too) and dealt round-robin: rank ``r`` of ``world_size`` takes
``samples[r], samples[r + world_size], ...``, wrapping around, until it has
``ceil(samples_pct_per_replica * len(samples))``. Each is loaded with
``loader`` (PIL, as RGB, by default) and ``sample_load_transform`` /
``target_load_transform`` once; ``sample_getitem_transform`` /
``target_getitem_transform`` run at each ``dataset[i]``. With ``device_id``
the samples and targets are stacked into tensors on that device (each
sample a tensor of one shape after ``sample_load_transform``). Use it with
:class:`InterruptableSampler`, which takes every sample of the rank's shard.

What differs: torchvision is not needed (the folder scan and the PIL loader
are relaunch's own, with torchvision's order and rules), arguments are
checked, and ``device_id`` also takes plain-number targets.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable
from typing import Any

__all__ = ["IMG_EXTENSIONS", "DistributedShardedDataset", "pil_loader"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def pil_loader(path: str) -> Any:
    """The image at ``path`` as an RGB ``PIL.Image`` (needs Pillow)."""
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "DistributedShardedDataset's default loader reads images with Pillow, which is not "
            "installed: pip install pillow, or pass loader= a function that reads one file"
        ) from None
    with open(path, "rb") as f:
        image = Image.open(f)
        return image.convert("RGB")


def _keep(value: Any) -> Any:
    return value


class DistributedShardedDataset:
    """``DistributedShardedDataset(root, rank, world_size,
    samples_pct_per_replica, device_id=None, seed=0, shuffle=True,
    loader=pil_loader, extensions=IMG_EXTENSIONS, sample_load_transform=...,
    target_load_transform=..., sample_getitem_transform=None,
    target_getitem_transform=None, is_valid_file=None)``: see the module.

    ``classes`` and ``class_to_idx`` are the whole dataset's; ``samples``
    and ``targets`` this rank's shard, loaded.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        rank: int,
        world_size: int,
        samples_pct_per_replica: float,
        device_id: Any = None,
        seed: int = 0,
        shuffle: bool = True,
        loader: Callable[[str], Any] = pil_loader,
        extensions: tuple[str, ...] | None = IMG_EXTENSIONS,
        sample_load_transform: Callable[[Any], Any] | None = _keep,
        target_load_transform: Callable[[Any], Any] | None = _keep,
        sample_getitem_transform: Callable[[Any], Any] | None = None,
        target_getitem_transform: Callable[[Any], Any] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
    ) -> None:
        for what, value in (("rank", rank), ("world_size", world_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{what} must be an int, got {value!r}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"rank {rank} is not in a world of {world_size} ranks "
                "(rank must be in 0..world_size-1)"
            )
        pct = samples_pct_per_replica
        if isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 < pct < math.inf:
            raise ValueError(
                "samples_pct_per_replica must be a fraction of the dataset above 0 (1.0: as "
                f"many samples as the whole dataset, 1 / world_size: an equal share); got {pct!r}"
            )
        if not callable(loader):
            raise TypeError(f"loader must be a function of a file's path, got {loader!r}")
        self.root = os.fspath(root)
        self.seed = seed
        self.shuffle = shuffle
        self.loader = loader
        self.sample_load_transform = sample_load_transform
        self.sample_getitem_transform = sample_getitem_transform
        self.target_load_transform = target_load_transform
        self.target_getitem_transform = target_getitem_transform

        self.classes, self.class_to_idx = self.find_classes(self.root)
        everything = self.make_dataset(self.root, self.class_to_idx, extensions, is_valid_file)
        if self.shuffle:
            random.seed(self.seed)
            random.shuffle(everything)
        wanted = math.ceil(pct * len(everything))
        if everything:
            mine = [everything[(rank + k * world_size) % len(everything)] for k in range(wanted)]
        else:
            mine = []

        load_sample = sample_load_transform or _keep
        load_target = target_load_transform or _keep
        self.samples: Any = [load_sample(self.loader(path)) for path, _ in mine]
        self.targets: Any = [load_target(target) for _, target in mine]
        if device_id is not None:
            self.samples = _stacked(self.samples, device_id, "sample", "sample_load_transform")
            self.targets = _stacked(self.targets, device_id, "target", "target_load_transform")

    @staticmethod
    def make_dataset(
        directory: str,
        class_to_idx: dict[str, int],
        extensions: tuple[str, ...] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
    ) -> list[tuple[str, int]]:
        """``[(path, class_index), ...]`` of every file of every class folder
        under ``directory`` (following links), classes in name order, files in
        path order, kept when their lowercased path ends in one of ``extensions`` or
        when ``is_valid_file(path)`` says so: give one of the two."""
        if class_to_idx is None:
            raise ValueError("The class_to_idx parameter cannot be None.")
        if (extensions is None) == (is_valid_file is None):
            raise ValueError(
                "give either extensions or is_valid_file, not both and not neither "
                "(with is_valid_file, pass extensions=None)"
            )
        if extensions is not None:
            suffixes = (extensions,) if isinstance(extensions, str) else tuple(extensions)

            def is_valid_file(path: str) -> bool:
                return path.lower().endswith(suffixes)

        directory = os.path.expanduser(directory)
        found: list[tuple[str, int]] = []
        empty = []
        for cls in sorted(class_to_idx):
            index = class_to_idx[cls]
            folder = os.path.join(directory, cls)
            before = len(found)
            for parent, _, names in sorted(os.walk(folder, followlinks=True)):
                for name in sorted(names):
                    path = os.path.join(parent, name)
                    if is_valid_file(path):  # type: ignore[misc]
                        found.append((path, index))
            if len(found) == before:
                empty.append(cls)
        if empty:
            what = (
                f"the extensions {', '.join(suffixes)}"
                if extensions is not None
                else "is_valid_file"
            )
            raise FileNotFoundError(
                f"found no valid file for the class(es) {', '.join(empty)} under {directory} "
                f"(valid: {what}); remove the empty class folders or change the extensions"
            )
        return found

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        """The class folders of ``directory``, sorted, and their indices."""
        try:
            classes = sorted(e.name for e in os.scandir(directory) if e.is_dir())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"dataset root {directory} does not exist: pass the folder that holds one "
                "folder per class"
            ) from None
        if not classes:
            raise FileNotFoundError(
                f"found no class folder in {directory}: it must hold one folder per class "
                "(ROOT/CLASS/FILE)"
            )
        return classes, {cls: i for i, cls in enumerate(classes)}

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        sample, target = self.samples[index], self.targets[index]
        if self.sample_getitem_transform is not None:
            sample = self.sample_getitem_transform(sample)
        if self.target_getitem_transform is not None:
            target = self.target_getitem_transform(target)
        return sample, target

    def __len__(self) -> int:
        return len(self.samples)


def _stacked(values: list[Any], device: Any, what: str, transform: str) -> Any:
    import torch

    try:
        if all(isinstance(v, torch.Tensor) for v in values):
            return torch.stack(values).to(device)
        return torch.as_tensor(values).to(device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(
            f"device_id={device!r} stacks every {what} into one tensor, which failed ({e}): "
            f"make {transform} return a tensor of one shape for each {what}"
        ) from None
