"""Images, videos and histograms logged with :meth:`relaunch.Run.log`.

``run.log({"samples": relaunch.Image(batch[0], caption="epoch 3")}, step=s)``
stores the image once, as a file of the run (content-addressed: the same
bytes logged twice travel and are kept once), and records where it is with
a ``media`` event at that step; a :class:`Video` is stored the same way (a
``media`` event of type ``video``); a :class:`Histogram` is a ``histogram``
event. The dashboard shows them per step (an animated GIF as an image, MP4
and WebM in a video player), and :class:`relaunch.Api` reads them back
(``run.media()``, ``run.image(...)``/``run.video(...)``, ``run.histograms()``).
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
#: The largest encoded video accepted.
MAX_VIDEO_BYTES = 256 << 20
#: The most frames a second a video may have.
MAX_FPS = 1000
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


_VIDEO_FORMATS = ("gif", "mp4", "webm")
#: A video's frames a second when none is given.
DEFAULT_FPS = 4


class Video:
    """A video to log: frames as a numpy array or tensor (``TxHxWxC`` with 1,
    3 or 4 channels, ``TxCxHxW`` as torch keeps them, or ``TxHxW``; floats in
    ``[0, 1]``, integers in ``[0, 255]``; a list of frames too) shown at
    ``fps`` frames a second (default 4), or the path of a GIF, MP4 or WebM
    file (stored as it is). Frames become an animated GIF (``format="gif"``,
    the default: needs Pillow) or an MP4 (H.264) or WebM (VP9) video
    (``format="mp4"``/``"webm"``: needs imageio-ffmpeg, which brings ffmpeg;
    ``options`` go to its ``write_frames``, e.g. ``{"quality": 8}``). The
    dashboard plays GIFs as images, MP4 and WebM in a video player.
    Everything is checked here, when the video is made, so a bad one fails
    at the line that made it.
    """

    __slots__ = ("caption", "data", "format", "fps", "frames", "height", "width")

    def __init__(
        self,
        data: object,
        fps: float | None = None,
        caption: str | None = None,
        format: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        if caption is not None and not isinstance(caption, str):
            raise TypeError(f"a video's caption is a str, not {type(caption).__name__}")
        if format is not None and format not in _VIDEO_FORMATS:
            raise ValueError(
                f"format={format!r}: a video is one of {', '.join(map(repr, _VIDEO_FORMATS))}"
            )
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"options is a dict of imageio-ffmpeg options, not {options!r}")
        self.caption = caption
        if isinstance(data, (str, os.PathLike)):
            if fps is not None:
                raise ValueError(
                    "fps= is for frames; a video file keeps its own frame rate (drop fps=)"
                )
            if options:
                raise ValueError("options= is for frames; a video file is stored as it is")
            self.data, self.format = _video_file(os.fspath(data), format)
            self.width, self.height = (
                _size(self.data, "gif") if self.format == "gif" else (None, None)
            )
            self.frames = None
            self.fps = None
            return
        if isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(
                "a Video is made from frames (an array, a tensor or a list of frames) or a "
                "file's path, not bytes: write them to a file and give its path"
            )
        self.fps = _fps(DEFAULT_FPS if fps is None else fps)
        frames = _video_frames(data)
        self.format = format or "gif"
        if self.format == "gif":
            if options:
                raise ValueError(
                    f"options={options!r} are imageio-ffmpeg options for MP4 and WebM; a GIF is "
                    "written with Pillow and takes fps= only"
                )
            self.data = _gif(frames, self.fps)
        else:
            frames = _even(frames)
            self.data = _ffmpeg(frames, self.fps, self.format, options or {})
        if len(self.data) > MAX_VIDEO_BYTES:
            raise ValueError(
                f"the video is {len(self.data)} bytes encoded; the most is {MAX_VIDEO_BYTES} "
                "(256 MiB): log fewer or smaller frames, or save it with run.save_file"
            )
        self.frames = int(frames.shape[0])
        self.height, self.width = int(frames.shape[1]), int(frames.shape[2])

    @property
    def digest(self) -> str:
        return hashlib.blake2b(self.data, digest_size=8).hexdigest()

    def __repr__(self) -> str:
        size = f"{self.width}x{self.height}" if self.width else "?x?"
        frames = f" {self.frames} frames" if self.frames else ""
        return f"<relaunch.Video {size}{frames} {self.format}>"


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
    return isinstance(value, (Image, Video, Histogram))


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


def _fps(fps: object) -> float:
    if isinstance(fps, bool) or not isinstance(fps, (int, float)):
        raise TypeError(f"fps is a number of frames a second, not {fps!r}")
    if not (0 < fps <= MAX_FPS):
        raise ValueError(
            f"fps={fps!r}: give a number of frames a second above 0, at most {MAX_FPS}"
        )
    return float(fps)


def _video_file(path: str, format: str | None) -> tuple[bytes, str]:
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
            if size > MAX_VIDEO_BYTES:
                raise ValueError(
                    f"{path} is {size} bytes; a video is at most {MAX_VIDEO_BYTES} (256 MiB): "
                    "save it with run.save_file instead"
                )
            fmt = _sniff_video(head)
            if fmt is None:
                raise ValueError(
                    f"{path} is not a GIF, MP4 or WebM video (its first bytes are {head[:12]!r}); "
                    "convert it (ffmpeg -i IN OUT.mp4), or save it with run.save_file"
                )
            if format is not None and format != fmt:
                raise ValueError(f"{path} is a {fmt.upper()} file, not {format!r}")
            f.seek(0)
            return f.read(), fmt
    except FileNotFoundError:
        raise FileNotFoundError(f"no video file at {path}") from None


def _sniff_video(head: bytes) -> str | None:
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if head[4:8] == b"ftyp":
        return "mp4"
    if head.startswith(b"\x1a\x45\xdf\xa3") and b"webm" in head:
        return "webm"
    return None


def _video_frames(data: object) -> Any:
    """Frames as ``uint8`` ``TxHxW`` (gray) or ``TxHxWxC`` (3 or 4 channels)."""
    import numpy

    try:
        if isinstance(data, (list, tuple)):
            if not data:
                raise ValueError("a video needs at least one frame; the list is empty")
            array = numpy.stack([numpy.asarray(_plain_array(f)) for f in data])
        else:
            array = numpy.asarray(_plain_array(data))
    except ValueError as e:
        if "at least one frame" in str(e):
            raise
        raise ValueError(
            f"the frames do not stack into one array ({e}): give frames of one size"
        ) from None
    except Exception as e:
        raise TypeError(
            f"a Video cannot be made from {type(data).__name__} ({e}): give an array, a tensor, "
            "a list of frames or a file's path"
        ) from None
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise TypeError(
            f"a Video cannot be made from an array of {array.dtype}: give numbers "
            "(floats in [0, 1], or integers in [0, 255])"
        )
    if array.ndim == 4 and array.shape[3] not in (1, 3, 4) and array.shape[1] in (1, 3, 4):
        array = array.transpose(0, 2, 3, 1)  # TxCxHxW, as torch keeps videos
    if array.ndim == 4 and array.shape[3] == 1:
        array = array[:, :, :, 0]
    if array.ndim not in (3, 4) or (array.ndim == 4 and array.shape[3] not in (3, 4)):
        raise ValueError(
            f"video frames of shape {array.shape} are not TxHxW, TxHxWxC or TxCxHxW with "
            "1, 3 or 4 channels"
        )
    count, height, width = array.shape[:3]
    if count < 1:
        raise ValueError("a video needs at least one frame")
    if not (0 < height <= MAX_SIDE and 0 < width <= MAX_SIDE):
        raise ValueError(f"video frames of {width}x{height} pixels: each side is 1 to {MAX_SIDE}")
    if array.dtype.kind == "f":
        if not numpy.all(numpy.isfinite(array)):
            raise ValueError("the video holds NaN or infinite values")
        array = numpy.clip(array, 0.0, 1.0) * 255.0 + 0.5
    elif array.dtype.kind == "b":
        array = array.astype(numpy.uint8) * 255
    return numpy.ascontiguousarray(numpy.clip(array, 0, 255).astype(numpy.uint8))


def _gif(frames: Any, fps: float) -> bytes:
    try:
        from PIL import Image as PILImage
    except ImportError:
        raise ImportError(
            "a Video of frames is encoded as an animated GIF with Pillow: pip install pillow "
            "(or give the path of a GIF, MP4 or WebM file)"
        ) from None
    images = [PILImage.fromarray(f) for f in frames]
    if images[0].mode == "RGBA":
        images = [im.convert("RGB") for im in images]
    buf = io.BytesIO()
    # GIF delays are whole hundredths of a second.
    delay = max(10, round(100.0 / fps) * 10)
    images[0].save(
        buf,
        format="GIF",
        save_all=True,
        append_images=images[1:],
        duration=delay,
        loop=0,
        optimize=False,
    )
    return buf.getvalue()


def _even(frames: Any) -> Any:
    """Frames padded (the edge repeated) to an even height and width, as
    H.264 and VP9 in yuv420p need."""
    import numpy

    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if not (pad_h or pad_w):
        return frames
    pads = [(0, 0), (0, pad_h), (0, pad_w)] + ([(0, 0)] if frames.ndim == 4 else [])
    return numpy.pad(frames, pads, mode="edge")


def _ffmpeg(frames: Any, fps: float, fmt: str, options: dict[str, Any]) -> bytes:
    try:
        import imageio_ffmpeg
    except ImportError:
        raise ImportError(
            f"format={fmt!r} needs imageio-ffmpeg, which brings ffmpeg (pip install "
            "imageio-ffmpeg); or log the frames as a GIF: format='gif' (Pillow)"
        ) from None
    import tempfile

    import numpy

    if frames.ndim == 4 and frames.shape[3] == 4:
        frames = numpy.ascontiguousarray(frames[:, :, :, :3])
    pix_fmt = "gray" if frames.ndim == 3 else "rgb24"
    settings: dict[str, Any] = {
        "codec": "libx264" if fmt == "mp4" else "libvpx-vp9",
        "pix_fmt_in": pix_fmt,
        "pix_fmt_out": "yuv420p",
        "macro_block_size": 1,
        "ffmpeg_log_level": "error",
    }
    settings.update(options)
    with tempfile.TemporaryDirectory(prefix="relaunch-video-") as tmp:
        path = os.path.join(tmp, f"video.{fmt}")
        writer = imageio_ffmpeg.write_frames(
            path, (frames.shape[2], frames.shape[1]), fps=fps, **settings
        )
        writer.send(None)
        try:
            for frame in frames:
                writer.send(numpy.ascontiguousarray(frame))
        finally:
            writer.close()
        with open(path, "rb") as f:
            return f.read()


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
