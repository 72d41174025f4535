"""Images and histograms logged with :meth:`relaunch.Run.log`.

``run.log({"samples": relaunch.Image(batch[0], caption="epoch 3")}, step=s)``
stores the image once, as a file of the run (content-addressed: the same
bytes logged twice travel and are kept once), and records where it is with
a ``media`` event at that step; a :class:`Histogram` is a ``histogram``
event. The dashboard shows them per step, and :class:`relaunch.Api` reads
them back (``run.media()``, ``run.image(...)``, ``run.histograms()``).
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import zlib
from typing import Any

#: The largest encoded image accepted.
MAX_IMAGE_BYTES = 32 << 20
#: The largest side of an image in pixels.
MAX_SIDE = 16384
#: Bins of a histogram at most.
MAX_BINS = 512

_FORMATS = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
)


class Image:
    """An image to log: a numpy array or tensor (``HxW``, ``HxWxC`` or
    ``CxHxW`` with 1, 3 or 4 channels; floats in ``[0, 1]``, integers in
    ``[0, 255]``), a PIL image, a matplotlib figure, or the path of a PNG,
    JPEG or GIF file (stored as it is). Everything is checked here, when
    the image is made, so a bad one fails at the line that made it.
    """

    __slots__ = ("caption", "data", "format", "height", "width")

    def __init__(self, data: object, caption: str | None = None) -> None:
        if caption is not None and not isinstance(caption, str):
            raise TypeError(f"an image's caption is a str, not {type(caption).__name__}")
        self.caption = caption
        encoded, fmt = _encode(data)
        if len(encoded) > MAX_IMAGE_BYTES:
            raise ValueError(
                f"the image is {len(encoded)} bytes encoded; the most is {MAX_IMAGE_BYTES} "
                "(32 MiB): log a smaller one (downscale it, or save it with run.save_file)"
            )
        self.data = encoded
        self.format = fmt
        self.width, self.height = _size(encoded, fmt)

    @property
    def digest(self) -> str:
        return hashlib.blake2b(self.data, digest_size=8).hexdigest()

    def __repr__(self) -> str:
        return f"<relaunch.Image {self.width}x{self.height} {self.format}>"


class Histogram:
    """The distribution of some values (a numpy array, tensor or sequence of
    numbers) in ``bins`` equal bins between their least and greatest finite
    value; NaN and the infinities are counted apart. ``Histogram(counts=...,
    edges=...)`` logs one made already (``numpy.histogram``'s output)."""

    __slots__ = ("counts", "edges", "nonfinite")

    def __init__(
        self,
        values: object = None,
        bins: int = 64,
        *,
        counts: object = None,
        edges: object = None,
    ) -> None:
        import numpy

        if not isinstance(bins, int) or isinstance(bins, bool) or not 1 <= bins <= MAX_BINS:
            raise ValueError(f"bins={bins!r}: give a whole number from 1 to {MAX_BINS}")
        if (values is None) == (counts is None):
            raise ValueError("give the values to count, or counts= and edges=, not both")
        if counts is not None:
            if edges is None:
                raise ValueError("counts= needs edges= (one more than the counts)")
            c = numpy.asarray(_plain_array(counts), dtype=numpy.float64).ravel()
            e = numpy.asarray(_plain_array(edges), dtype=numpy.float64).ravel()
            if len(e) != len(c) + 1 or not 1 <= len(c) <= MAX_BINS:
                raise ValueError(
                    f"{len(c)} counts need {len(c) + 1} edges, not {len(e)} "
                    f"(and 1 to {MAX_BINS} bins)"
                )
            if not numpy.all(numpy.isfinite(e)) or numpy.any(numpy.diff(e) <= 0):
                raise ValueError("the edges must be finite and increasing")
            self.counts = [float(x) for x in c]
            self.edges = [float(x) for x in e]
            self.nonfinite = 0
            return
        array = numpy.asarray(_plain_array(values), dtype=numpy.float64).ravel()
        finite = array[numpy.isfinite(array)]
        self.nonfinite = int(array.size - finite.size)
        if finite.size == 0:
            self.counts, self.edges = [], []
            return
        c, e = numpy.histogram(finite, bins=bins)
        self.counts = [int(x) for x in c]
        self.edges = [float(x) for x in e]

    def data(self) -> dict[str, Any]:
        return {"counts": self.counts, "edges": self.edges, "nonfinite": self.nonfinite}

    def __repr__(self) -> str:
        return f"<relaunch.Histogram {len(self.counts)} bins>"


def is_media(value: object) -> bool:
    return isinstance(value, (Image, Histogram))


def _plain_array(value: object) -> object:
    """A tensor as numpy (moved off its device); anything else as it is."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu().numpy()  # type: ignore[attr-defined]
    return value


def _encode(data: object) -> tuple[bytes, str]:
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        try:
            with open(path, "rb") as f:
                head = f.read(16)
                size = os.fstat(f.fileno()).st_size
                if size > MAX_IMAGE_BYTES:
                    raise ValueError(
                        f"{path} is {size} bytes; an image is at most {MAX_IMAGE_BYTES} (32 MiB): "
                        "save it with run.save_file instead"
                    )
                fmt = _sniff(head)
                if fmt is None:
                    raise ValueError(
                        f"{path} is not a PNG, JPEG or GIF image (its first bytes are "
                        f"{head[:8]!r}); convert it, or save it with run.save_file"
                    )
                f.seek(0)
                return f.read(), fmt
        except FileNotFoundError:
            raise FileNotFoundError(f"no image file at {path}") from None
    if hasattr(data, "savefig"):  # a matplotlib figure
        buf = io.BytesIO()
        data.savefig(buf, format="png", bbox_inches="tight")  # type: ignore[attr-defined]
        return buf.getvalue(), "png"
    if hasattr(data, "save") and hasattr(data, "mode") and hasattr(data, "size"):  # PIL
        buf = io.BytesIO()
        image = data
        if image.mode not in ("L", "LA", "RGB", "RGBA"):  # type: ignore[attr-defined]
            image = image.convert("RGBA")  # type: ignore[attr-defined]
        image.save(buf, format="PNG")  # type: ignore[attr-defined]
        return buf.getvalue(), "png"
    if isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(
            "an Image is made from an array, a PIL image, a matplotlib figure or a file's path, "
            "not bytes: write them to a file and give its path"
        )
    return _png_of_array(data), "png"


def _sniff(head: bytes) -> str | None:
    for magic, fmt in _FORMATS:
        if head.startswith(magic):
            return fmt
    return None


def _png_of_array(data: object) -> bytes:
    import numpy

    try:
        array = numpy.asarray(_plain_array(data))
    except Exception as e:
        raise TypeError(
            f"an Image cannot be made from {type(data).__name__} ({e}): give an array, a "
            "tensor, a PIL image, a matplotlib figure or a file's path"
        ) from None
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise TypeError(
            f"an Image cannot be made from an array of {array.dtype}: give numbers "
            "(floats in [0, 1], or integers in [0, 255])"
        )
    if array.ndim == 3 and array.shape[0] in (1, 3, 4) and array.shape[2] not in (1, 3, 4):
        array = array.transpose(1, 2, 0)  # CxHxW, as torch keeps images
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)):
        raise ValueError(
            f"an image array of shape {array.shape} is not HxW, HxWxC or CxHxW with "
            "1, 3 or 4 channels"
        )
    height, width = array.shape[:2]
    if not (0 < height <= MAX_SIDE and 0 < width <= MAX_SIDE):
        raise ValueError(f"an image of {width}x{height} pixels: each side is 1 to {MAX_SIDE}")
    if array.dtype.kind == "f":
        if not numpy.all(numpy.isfinite(array)):
            raise ValueError("the image holds NaN or infinite values")
        array = numpy.clip(array, 0.0, 1.0) * 255.0 + 0.5
    array = numpy.clip(array, 0, 255).astype(numpy.uint8)
    channels = 1 if array.ndim == 2 else array.shape[2]
    color = {1: 0, 3: 2, 4: 6}[channels]
    rows = numpy.ascontiguousarray(array).reshape(height, width * channels)
    raw = numpy.zeros((height, width * channels + 1), dtype=numpy.uint8)
    raw[:, 1:] = rows  # filter byte 0 (none) before each row
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0))
        + _chunk(b"IDAT", zlib.compress(raw.tobytes(), 6))
        + _chunk(b"IEND", b"")
    )


def _chunk(tag: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(tag + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)


def _size(data: bytes, fmt: str) -> tuple[int | None, int | None]:
    """An encoded image's width and height, read from its header."""
    if fmt == "png" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if fmt == "gif" and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if fmt == "jpeg":
        at = 2
        while at + 9 < len(data):
            if data[at] != 0xFF:
                break
            marker = data[at + 1]
            (length,) = struct.unpack(">H", data[at + 2 : at + 4])
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                height, width = struct.unpack(">HH", data[at + 5 : at + 9])
                return width, height
            at += 2 + length
    return None, None
