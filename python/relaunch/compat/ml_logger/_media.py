"""Images, figures and videos: ``save_image(s)``, ``savefig``/``save_pyplot``,
``save_video`` and ``make_video`` write the file under its key, as
ml-logger did (so ``load_file``, ``glob`` and ``make_video`` find it), and
log it as the run's media (``relaunch.Image`` / ``relaunch.Video``): kept
once, named by its content and listed at the current step, so the
dashboard's Media tab shows each one at the step it was saved, with a
slider over the steps, not only the last file written under the key.

The step is the one of the row being built when it has a ``step`` (the
row that the next ``flush`` logs), else the step that row will get, else
the step of the last row logged (0 before any). The media key is the file's
key without its extension (``figures/rgb.png``: ``figures/rgb``). A key
outside the logger's own run (``Prefix("/other/run")``) gets the file only.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from ._values import _step_of

_IMAGE_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".gif": "GIF"}
_PIL_FORMATS = {".bmp": "BMP", ".tif": "TIFF", ".tiff": "TIFF", ".webp": "WEBP"}
_VIDEO_FORMATS = ("gif", "mp4", "webm")


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "saving JPEG, GIF and other non-PNG images needs Pillow: pip install pillow "
            "(or save to a .png key)"
        ) from None
    return Image


def _array(value: object) -> Any:
    import numpy

    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()  # type: ignore[attr-defined]
    return numpy.asarray(value)


class _MediaMixin:
    """The image and video methods of ``ML_Logger``."""

    # --- where media go ------------------------------------------------------------------

    def _media_step(self) -> int:
        run = self._ensure_run()
        row = self._kv.get(None) or {}
        numbers = {k: v for k, v in row.items() if isinstance(v, int | float)}
        step = _step_of(numbers) if numbers else None
        if step is not None:
            return step
        following = getattr(run, "_next", 0)
        return following if row else max(following - 1, 0)

    def _save_media(self, data: bytes, key: str, item: object) -> str:
        """``data`` as the file ``key`` (returns its name), and ``item`` as the
        run's media at the current step when that file is the own run's (a
        host file, see ``_host_path``, is not the run's)."""
        if self._write_host(key, data):
            return key
        own, run_id, name = self._target((key,))
        self._upload_bytes(data, own, run_id, name)
        if own and item is not None:
            run = self._ensure_run()
            run._save_media({os.path.splitext(name)[0]: item}, self._media_step())
        return name

    # --- images ----------------------------------------------------------------------------

    def save_images(
        self,
        stack: object,
        key: str,
        n_rows: int | None = None,
        n_cols: int | None = None,
        cmap: object = None,
        normalize: object = None,
        value_range: tuple[float, float] = (0, 1),
        background: float = 1,
        dtype: object = None,
    ) -> str:
        """A grid of images (``stack``: ``NxHxW`` grayscale or ``NxHxWxC``, or
        a list of images) saved as one image file ``key`` (its extension says
        the format: ``.png``; ``.jpg``, ``.gif`` and others with Pillow).
        Floats are shown from ``value_range[0]`` (black) to
        ``value_range[1]`` (white), after ``normalize``: ``None``/``False``
        (as they are), ``"grid"`` (the stack's least and greatest value),
        ``True``/``"individual"`` (each image's), or ``(low, high)``;
        grayscale floats take the matplotlib colormap ``cmap`` when given.
        Integers are pixel values as they are. ``n_cols`` defaults to all
        in a row; empty cells are ``background`` (in ``value_range`` units:
        white). ``dtype``: ``numpy.uint8`` (default) or ``numpy.uint16``
        (16-bit grayscale PNG). Returns the file's name."""
        import numpy

        if not isinstance(key, str):
            raise TypeError(f"key must be a str, not {type(key).__name__}")
        dtype = numpy.dtype(dtype or numpy.uint8)
        if dtype not in (numpy.dtype(numpy.uint8), numpy.dtype(numpy.uint16)):
            raise ValueError(f"dtype={dtype}: images are saved as numpy.uint8 or numpy.uint16")
        ext = os.path.splitext(key)[1].lower()
        if ext not in _IMAGE_FORMATS and ext not in _PIL_FORMATS:
            raise ValueError(
                f"key {key!r}: give it an image file's extension (.png, .jpg, .gif, "
                f"{', '.join(_PIL_FORMATS)}); it says the format"
            )
        grid = _composite(stack, n_rows, n_cols, cmap, normalize, value_range, background, dtype)
        import relaunch

        eight = grid if dtype == numpy.uint8 else (grid >> 8).astype(numpy.uint8)
        if ext == ".png" and dtype == numpy.uint8:
            item = relaunch.Image(grid)
            return self._save_media(item.data, key, item)
        data = _encode_with_pil(grid, ext, dtype)
        item = relaunch.Image(eight)
        if ext in _IMAGE_FORMATS and dtype == numpy.uint8:
            with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
                path = os.path.join(tmp, "image" + ext)
                with open(path, "wb") as f:
                    f.write(data)
                item = relaunch.Image(path)  # the same bytes as the file
        return self._save_media(data, key, item)

    def save_image(
        self, image: object, key: str, cmap: object = None, normalize: object = None, dtype=None
    ) -> str:
        """One image (``HxW``, ``HxWxC``) saved as ``key``; see ``save_images``."""
        return self.save_images(
            [image], key, n_rows=1, n_cols=1, cmap=cmap, normalize=normalize, dtype=dtype
        )

    # --- figures --------------------------------------------------------------------------

    def save_pyplot(
        self,
        path: str = "plot.png",
        fig: object = None,
        format: str | None = None,
        close: bool = True,
        **kwargs: object,
    ) -> str:
        """``fig.savefig`` (the current figure by default) into the run's file
        ``path`` (``format`` is appended as an extension; without either,
        ``.png``); PNG, JPEG and GIF figures are the run's media too.
        ``close`` closes the figure. Returns the file's name."""
        if not isinstance(path, str):
            raise TypeError(f"path must be a str, not {type(path).__name__}")
        path, format = _with_format(path, format, "png")
        if fig is None:
            from matplotlib import pyplot as plt

            fig = plt.gcf()
        buf = io.BytesIO()
        fig.savefig(buf, format=format, **kwargs)  # type: ignore[attr-defined]
        data = buf.getvalue()
        item = None
        if "." + format.lower() in _IMAGE_FORMATS:
            import relaunch

            with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
                file = os.path.join(tmp, "figure." + format.lower())
                with open(file, "wb") as f:
                    f.write(data)
                item = relaunch.Image(file)
        name = self._save_media(data, path, item)
        if close:
            from matplotlib import pyplot as plt

            plt.close(fig)  # type: ignore[arg-type]
        return name

    def savefig(self, key: str, fig: object = None, format: str | None = None, **kwargs: object):
        """``save_pyplot(key, fig, format)``: the figure into the run's file ``key``."""
        return self.save_pyplot(path=key, fig=fig, format=format, **kwargs)

    # --- videos ----------------------------------------------------------------------------

    def save_video(
        self,
        frame_stack: object,
        key: str,
        format: str | None = None,
        fps: float = 20,
        **imageio_kwargs: object,
    ) -> str:
        """Frames (``TxHxW``, ``TxHxWxC``, a list of frames; floats in [0, 1])
        saved as the video ``key`` at ``fps`` (``format`` is appended as an
        extension; without either, ``.mp4``): GIF with Pillow, MP4 (H.264)
        and WebM (VP9) with imageio-ffmpeg, ``imageio_kwargs`` going to its
        ``write_frames`` (``quality=``, ``bitrate=``, ...). The dashboard
        plays it (a ``relaunch.Video``). Returns the file's name."""
        import relaunch

        if not isinstance(key, str):
            raise TypeError(f"key must be a str, not {type(key).__name__}")
        key, format = _with_format(key, format, "mp4")
        fmt = format.lower()
        if fmt not in _VIDEO_FORMATS:
            raise ValueError(
                f"video format {format!r}: relaunch writes {', '.join(_VIDEO_FORMATS)} (browsers "
                "play them); name the key with one of those extensions"
            )
        if fmt == "gif" and imageio_kwargs:
            raise TypeError(
                f"save_video(..., {key!r}): {sorted(imageio_kwargs)} are imageio options for MP4 "
                "and WebM; a GIF is written with Pillow and takes fps= only"
            )
        video = relaunch.Video(
            frame_stack, fps=fps, format=fmt, options=dict(imageio_kwargs) or None
        )
        return self._save_media(video.data, key, video)

    def make_video(
        self,
        files: str | Sequence[str],
        key: str,
        wd: str | None = None,
        order: str | int = "ascending",
        **imageio_kwargs: object,
    ) -> str | None:
        """The run's image files ``files`` (a glob, sorted by ``order``:
        ``"ascending"``/``1`` or ``"descending"``/``-1``; or a list of keys,
        in its order), under ``wd``, made into the video ``key`` (see
        ``save_video``; ``fps`` 10 unless given). The frames are downloaded
        and encoded here (ml-logger's server did it). None when no file
        matches."""
        if isinstance(files, str):
            names = self._glob_files(files, wd=wd)
            if order in ("descending", -1):
                names = names[::-1]
            elif order not in ("ascending", 1):
                raise ValueError(f"order={order!r}: use 'ascending' (1) or 'descending' (-1)")
        elif isinstance(files, Sequence) and all(isinstance(f, str) for f in files):
            names = list(files)
        else:
            raise TypeError(f"files is a glob (str) or a list of keys, not {files!r}")
        if not names:
            return None
        fps = imageio_kwargs.pop("fps", 10)
        frames = []
        with self.Prefix(wd) if wd else _nothing():
            for file in names:
                data = self._read_bytes((file,))
                if data is None:
                    raise FileNotFoundError(f"make_video: the run has no file {file!r}")
                frames.append(_decode(data, file))
        shape = frames[0].shape
        for file, frame in zip(names, frames, strict=True):
            if frame.shape != shape:
                raise ValueError(
                    f"make_video: {file} is {frame.shape[1]}x{frame.shape[0]}, the first frame "
                    f"{names[0]} {shape[1]}x{shape[0]}: the frames of a video have one size"
                )
        return self.save_video(frames, key, fps=fps, **imageio_kwargs)  # type: ignore[arg-type]


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _with_format(key: str, format: str | None, default: str) -> tuple[str, str]:
    """(the key, the format) as ml-logger named files: ``format`` appended as
    an extension; without it, the key's own extension; without either,
    ``default`` appended."""
    if format:
        return f"{key}.{format}", format
    format = os.path.splitext(key)[1][1:]
    return (key, format) if format else (f"{key}.{default}", default)


def _decode(data: bytes, name: str) -> Any:
    import numpy

    Image = _pil()
    try:
        with Image.open(io.BytesIO(data)) as im:
            return numpy.asarray(im.convert("RGB"))
    except OSError as e:
        raise ValueError(f"make_video: {name} is not an image Pillow reads ({e})") from None


def _encode_with_pil(grid: Any, ext: str, dtype: Any) -> bytes:
    import numpy

    Image = _pil()
    if dtype == numpy.uint16:
        if ext != ".png" or grid.ndim != 2:
            raise ValueError(
                "dtype=numpy.uint16 is saved as a 16-bit grayscale PNG only: save to a .png "
                "key, grayscale, or use dtype=numpy.uint8"
            )
        image = Image.fromarray(grid.astype("<u2"))  # 16-bit grayscale ("I;16")
    else:
        image = Image.fromarray(grid)
    fmt = _IMAGE_FORMATS.get(ext) or _PIL_FORMATS[ext]
    if fmt == "JPEG" and image.mode in ("RGBA", "LA"):
        image = image.convert("RGB")
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def _composite(
    stack: object,
    n_rows: int | None,
    n_cols: int | None,
    cmap: object,
    normalize: object,
    value_range: tuple[float, float],
    background: float,
    dtype: Any,
) -> Any:
    """The images of ``stack`` as one grid of pixels of ``dtype``."""
    import numpy

    if isinstance(stack, list | tuple):
        if not stack:
            raise ValueError("no images to save: the list is empty")
        try:
            images = numpy.stack([_array(x) for x in stack])
        except ValueError as e:
            raise ValueError(
                f"the images do not stack into one array ({e}): give one size"
            ) from None
    else:
        images = _array(stack)
    if images.dtype == object or images.dtype.kind not in "biuf":
        raise TypeError(f"images are numbers, not {images.dtype}")
    if images.ndim == 4 and images.shape[3] not in (1, 3, 4) and images.shape[1] in (1, 3, 4):
        images = images.transpose(0, 2, 3, 1)  # NxCxHxW, as torch keeps them
    if images.ndim == 4 and images.shape[3] == 1:
        images = images[..., 0]
    if images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[3] not in (3, 4)):
        raise ValueError(
            f"images of shape {images.shape[1:]} (a stack of {images.shape}) are not HxW, HxWxC "
            "or CxHxW with 1, 3 or 4 channels"
        )
    top = numpy.iinfo(dtype).max
    low_v, high_v = (float(v) for v in value_range)
    if not high_v > low_v:
        raise ValueError(f"value_range={value_range!r}: the second value must be greater")
    if images.dtype.kind in "iu":
        if normalize not in (None, False):
            raise ValueError(
                f"normalize={normalize!r} is for float images; these are {images.dtype} pixel "
                "values (divide them by 255 to normalize)"
            )
        if cmap is not None:
            raise ValueError(f"cmap={cmap!r} colours float grayscale images, not {images.dtype}")
        pixels = numpy.clip(images, 0, top).astype(dtype)
    else:
        values = images.astype(numpy.float64)
        if numpy.isnan(values).all():
            raise ValueError("the images are all NaN")
        color = values.ndim == 4
        if normalize in (None, False):
            scaled = values
        else:
            if normalize == "grid":
                axes = (0, 1, 2) if color else None
            elif normalize is True or normalize == "individual":
                axes = (1, 2)
            elif isinstance(normalize, Sequence) and not isinstance(normalize, str):
                axes = "given"
            else:
                raise ValueError(
                    f"normalize={normalize!r}: use None, 'grid', 'individual' (or True) or "
                    "(low, high)"
                )
            if axes == "given":
                low, high = (float(v) for v in normalize)  # type: ignore[union-attr]
            else:
                low = numpy.nanmin(values, axis=axes, keepdims=axes is not None)
                high = numpy.nanmax(values, axis=axes, keepdims=axes is not None)
            span = numpy.asarray(high - low, dtype=numpy.float64)
            span = numpy.where(span > 0, span, 1.0)
            scaled = (values - low) / span * (high_v - low_v) + low_v
        unit = numpy.clip((numpy.nan_to_num(scaled, nan=low_v) - low_v) / (high_v - low_v), 0, 1)
        if cmap is not None:
            if color:
                raise ValueError("cmap colours grayscale images; these have channels")
            unit = _colormap(cmap)(unit)
        pixels = (unit * top + 0.5).astype(dtype)
    n = len(pixels)
    if n == 0:
        raise ValueError("no images to save")
    cols = n_cols or n
    rows = n_rows or math.ceil(n / cols)
    if rows * cols < n:
        raise ValueError(f"{n} images do not fit in {rows} rows of {cols}")
    h, w = pixels.shape[1:3]
    fill = round(min(max((float(background) - low_v) / (high_v - low_v), 0.0), 1.0) * top)
    grid = numpy.full((h * rows, w * cols, *pixels.shape[3:]), fill, dtype=dtype)
    for k in range(n):
        r, c = divmod(k, cols)
        grid[r * h : (r + 1) * h, c * w : (c + 1) * w] = pixels[k]
    return grid


def _colormap(cmap: object):
    try:
        import matplotlib
    except ImportError:
        raise ImportError("cmap= needs matplotlib: pip install matplotlib") from None
    if isinstance(cmap, str):
        try:
            return matplotlib.colormaps[cmap]
        except KeyError:
            raise ValueError(f"cmap={cmap!r} is not a matplotlib colormap") from None
    if callable(cmap):
        return cmap
    raise TypeError(f"cmap is a colormap's name or a matplotlib colormap, not {cmap!r}")
