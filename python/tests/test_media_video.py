"""Videos: ``run.log({"x": relaunch.Video(...)})`` from frames (arrays,
tensors, lists; GIF by Pillow, MP4/WebM by imageio-ffmpeg) and from GIF,
MP4 and WebM files, stored once as files of the run, listed per step with
the images, read back exactly; bad videos refused where they are made."""

from __future__ import annotations

import io
import os
import sys
from typing import TYPE_CHECKING

import numpy
import pytest

import relaunch

if TYPE_CHECKING:
    from conftest import TrackingServer


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RELAUNCH_"):
            monkeypatch.delenv(name)


def gif_frames(data: bytes) -> list[numpy.ndarray]:
    from PIL import Image, ImageSequence

    with Image.open(io.BytesIO(data)) as im:
        return [numpy.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(im)]


def colors(*rgb: tuple[int, int, int], size: int = 6) -> numpy.ndarray:
    return numpy.stack([numpy.full((size, size + 2, 3), c, dtype=numpy.uint8) for c in rgb])


def test_frames_of_every_layout_become_a_gif_of_those_frames() -> None:
    import torch

    red, blue = (255, 0, 0), (0, 0, 255)
    video = relaunch.Video(colors(red, blue), fps=4, caption="rgb")
    assert (video.format, video.frames, video.fps, video.width, video.height) == (
        "gif",
        2,
        4.0,
        8,
        6,
    )
    assert [tuple(f[0, 0]) for f in gif_frames(video.data)] == [red, blue]
    from PIL import Image

    assert Image.open(io.BytesIO(video.data)).info["duration"] == 250
    # Floats in [0, 1]; TxHxW grayscale; TxCxHxW tensors; a list of frames.
    floats = relaunch.Video(colors(red, blue) / 255.0)
    assert [tuple(f[0, 0]) for f in gif_frames(floats.data)] == [red, blue]
    gray = relaunch.Video(numpy.linspace(0, 1, 3)[:, None, None] * numpy.ones((3, 4, 5)))
    assert [f[0, 0, 0] for f in gif_frames(gray.data)] == [0, 128, 255]
    tchw = relaunch.Video(torch.zeros(2, 3, 5, 7))
    assert (tchw.width, tchw.height, tchw.frames) == (7, 5, 2)
    listed = relaunch.Video([numpy.zeros((4, 4, 3)), numpy.ones((4, 4, 3))])
    assert listed.frames == 2 and listed.digest != tchw.digest
    assert repr(video) == "<relaunch.Video 8x6 2 frames gif>"


def test_videos_from_files_are_stored_as_they_are(tmp_path) -> None:
    gif = tmp_path / "a.gif"
    gif.write_bytes(relaunch.Video(colors((1, 2, 3))).data)
    mp4 = tmp_path / "a.mp4"
    mp4.write_bytes(b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2" + b"\x00" * 40)
    webm = tmp_path / "a.webm"
    webm.write_bytes(b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01\x42\x82\x84webm" + b"\x00" * 40)
    for path, fmt in ((gif, "gif"), (mp4, "mp4"), (webm, "webm")):
        video = relaunch.Video(path)
        assert (video.format, video.data, video.fps) == (fmt, path.read_bytes(), None)
    assert (relaunch.Video(gif).width, relaunch.Video(gif).height) == (8, 6)
    mkv = tmp_path / "a.mkv"
    mkv.write_bytes(b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01\x42\x82\x88matroska" + b"\x00" * 40)
    with pytest.raises(ValueError, match="not a GIF, MP4 or WebM video"):
        relaunch.Video(mkv)
    with pytest.raises(ValueError, match="is a GIF file, not 'mp4'"):
        relaunch.Video(gif, format="mp4")
    with pytest.raises(ValueError, match="keeps its own frame rate"):
        relaunch.Video(gif, fps=3)
    with pytest.raises(FileNotFoundError, match="no video file at"):
        relaunch.Video(tmp_path / "missing.mp4")


def test_mp4_and_webm_need_imageio_ffmpeg_and_say_so(monkeypatch) -> None:
    frames = colors((255, 0, 0), (0, 255, 0), size=5)  # odd sides: padded to even
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        pass
    else:
        mp4 = relaunch.Video(frames, fps=10, format="mp4")
        assert mp4.data[4:8] == b"ftyp" and (mp4.width, mp4.height) == (8, 6)
        webm = relaunch.Video(frames, fps=10, format="webm", options={"quality": 8})
        assert webm.data.startswith(b"\x1a\x45\xdf\xa3")
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    with pytest.raises(ImportError, match=r"needs imageio-ffmpeg.*format='gif'"):
        relaunch.Video(frames, format="mp4")


def test_what_is_not_a_video_is_refused_where_it_is_made() -> None:
    good = colors((0, 0, 0))
    for data, kwargs, error, match in [
        (numpy.zeros((2, 3)), {}, ValueError, "not TxHxW"),
        (numpy.zeros((2, 3, 4, 5, 6)), {}, ValueError, "not TxHxW"),
        (numpy.zeros((0, 4, 4)), {}, ValueError, "at least one frame"),
        ([], {}, ValueError, "at least one frame"),
        ([numpy.zeros((2, 2)), numpy.zeros((3, 3))], {}, ValueError, "frames of one size"),
        (numpy.full((2, 4, 4), numpy.nan), {}, ValueError, "NaN"),
        (numpy.array([["a"]]), {}, TypeError, "numbers"),
        (b"GIF89a", {}, TypeError, "not bytes"),
        (good, {"fps": 0}, ValueError, "above 0"),
        (good, {"fps": "fast"}, TypeError, "frames a second"),
        (good, {"format": "avi"}, ValueError, "'gif', 'mp4', 'webm'"),
        (good, {"options": {"quality": 5}}, ValueError, "takes fps= only"),
        (good, {"caption": 3}, TypeError, "caption"),
    ]:
        with pytest.raises(error, match=match):
            relaunch.Video(data, **kwargs)


def test_logged_videos_are_stored_once_and_listed_with_the_images(
    tracking_server: TrackingServer, tmp_path
) -> None:
    clip = relaunch.Video(colors((255, 0, 0), (0, 0, 255)), fps=2, caption="clip")
    run = relaunch.init("media", id="vids", server=tracking_server.url, dir=tmp_path / "spool")
    for step in range(2):
        run.log(
            {"loss": 1.0, "clip": clip, "still": relaunch.Image(numpy.zeros((2, 2)))}, step=step
        )
    assert run.log({"loss": 0.5}) == 2  # media do not move the steps on
    run.finish(timeout=60)
    record = relaunch.Api(tracking_server.url).run("vids")
    videos = record.media("clip")
    assert [(m["type"], m["step"], m["frames"], m["fps"]) for m in videos] == [
        ("video", 0, 2, 2.0),
        ("video", 1, 2, 2.0),
    ]
    assert videos[0]["file"] == f"media/clip/0-{clip.digest}.gif"
    assert record.video(videos[1]) == clip.data
    files = {f["name"]: f for f in record.files()}
    assert files[videos[0]["file"]]["blake3"] == files[videos[1]["file"]]["blake3"]
    assert {m["type"] for m in record.media()} == {"image", "video"}
