"""Images and histograms: ``run.log({"x": relaunch.Image(...)})`` from
arrays, tensors, PIL images, matplotlib figures and files, stored once as
files of the run, listed per step, read back exactly; and every kind of
bad image refused where it is made, with nothing logged."""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING

import numpy
import pytest
from conftest import wait_for

import relaunch

if TYPE_CHECKING:
    from conftest import TrackingServer


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RELAUNCH_"):
            monkeypatch.delenv(name)


def pixels(data: bytes) -> numpy.ndarray:
    from PIL import Image

    return numpy.asarray(Image.open(io.BytesIO(data)))


def test_images_of_every_kind_are_stored_once_listed_per_step_and_read_back_exactly(
    tracking_server: TrackingServer, tmp_path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch
    from PIL import Image as PILImage

    rng = numpy.random.default_rng(0)
    rgb = rng.integers(0, 256, size=(12, 20, 3), dtype=numpy.uint8)
    gray = rng.random((9, 7))
    chw = torch.rand(3, 8, 6)
    pil = PILImage.fromarray(rgb[:, :, ::-1].copy())
    figure, axes = plt.subplots(figsize=(2, 2), dpi=50)
    axes.plot([0, 1, 2], [2, 0, 1])
    jpeg = tmp_path / "photo.jpg"
    pil.save(jpeg, format="JPEG")

    run = relaunch.init("media", id="imgs", server=tracking_server.url, dir=tmp_path / "spool")
    for step in range(3):
        run.log(
            {
                "loss": 1.0 / (step + 1),
                "samples": relaunch.Image(rgb, caption=f"step {step}"),
                "eval": {"gray": relaunch.Image(gray)},
                "weights": relaunch.Histogram(torch.randn(1000)),
            },
            step=step,
        )
    run.log({"tensor": relaunch.Image(chw), "pil": relaunch.Image(pil)}, step=3)
    run.log({"figure": relaunch.Image(figure), "photo": relaunch.Image(jpeg)}, step=4)
    run.finish()

    record = relaunch.Api(tracking_server.url).run("imgs")
    assert record.summary["loss"] == pytest.approx(1 / 3)
    samples = record.media("samples")
    assert [(m["step"], m["caption"], m["width"], m["height"]) for m in samples] == [
        (0, "step 0", 20, 12),
        (1, "step 1", 20, 12),
        (2, "step 2", 20, 12),
    ]
    assert numpy.array_equal(pixels(record.image(samples[1])), rgb)
    # The same image at three steps: a file per step, of the same chunks
    # (the chunk store keeps them once).
    files = {f["name"]: f["blake3"] for f in record.files()}
    assert len({m["file"] for m in samples}) == 3
    assert len({files[m["file"]] for m in samples}) == 1
    # Nested names join with "/"; floats in [0, 1] scale to 0..255.
    (gray_entry,) = [m for m in record.media("eval/gray") if m["step"] == 0]
    assert numpy.array_equal(pixels(record.image(gray_entry)), (gray * 255 + 0.5).astype("u1"))
    # CxHxW, as torch keeps images, becomes HxWxC.
    (tensor,) = record.media("tensor")
    expected = (chw.permute(1, 2, 0).numpy() * 255 + 0.5).astype("u1")
    assert numpy.array_equal(pixels(record.image(tensor)), expected)
    (from_pil,) = record.media("pil")
    assert numpy.array_equal(pixels(record.image(from_pil)), rgb[:, :, ::-1])
    (fig,) = record.media("figure")
    assert fig["format"] == "png" and fig["width"] > 50 and fig["step"] == 4
    (photo,) = record.media("photo")
    assert photo["format"] == "jpeg" and (photo["width"], photo["height"]) == (20, 12)
    assert record.image(photo) == jpeg.read_bytes()
    # Histograms: counts of every finite value, in the bins' edges.
    weights = record.histograms("weights")
    assert [h["step"] for h in weights] == [0, 1, 2]
    assert all(sum(h["counts"]) == 1000 and len(h["edges"]) == 65 for h in weights)
    assert all(h["nonfinite"] == 0 for h in weights)
    # Media are not metrics.
    assert set(record.summary) == {"loss"}


def test_histograms_count_what_is_not_finite_apart_and_take_counts_made_already(tmp_path) -> None:
    h = relaunch.Histogram([1.0, 2.0, float("nan"), float("inf"), 2.0], bins=2)
    assert h.counts == [1, 2] and h.edges == [1.0, 1.5, 2.0] and h.nonfinite == 2
    counts, edges = numpy.histogram([0.5, 1.5, 1.7], bins=2, range=(0, 2))
    h = relaunch.Histogram(counts=counts, edges=edges)
    assert h.counts == [1.0, 2.0] and h.edges == [0.0, 1.0, 2.0]
    for bad, says in [
        (lambda: relaunch.Histogram([1.0], bins=0), "bins=0"),
        (lambda: relaunch.Histogram([1.0], bins=100000), "from 1 to 512"),
        (lambda: relaunch.Histogram(), "not both"),
        (lambda: relaunch.Histogram(counts=[1, 2], edges=[0, 1]), "2 counts need 3 edges"),
        (lambda: relaunch.Histogram(counts=[1], edges=[1, 0]), "increasing"),
    ]:
        with pytest.raises(ValueError, match=says):
            bad()


def test_what_is_not_an_image_is_refused_where_it_is_made(tmp_path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    huge = tmp_path / "huge.png"
    with open(huge, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.truncate(1 << 30)  # 1 GiB, sparse
    cases = [
        (text, ValueError, "is not a PNG, JPEG or GIF image"),
        (huge, ValueError, "is 1073741824 bytes; an image is at most"),
        (tmp_path / "missing.png", FileNotFoundError, "no image file at"),
        (b"\x89PNG", TypeError, "not bytes"),
        (numpy.zeros((2, 3, 5)), ValueError, "is not HxW, HxWxC or CxHxW"),
        (numpy.zeros((20000, 2)), ValueError, "each side is 1 to 16384"),
        (numpy.array([["a"]]), TypeError, "cannot be made from an array of <U1"),
        (numpy.full((2, 2), numpy.nan), ValueError, "NaN or infinite"),
        (object(), TypeError, "cannot be made from an array of object"),
    ]
    for data, error, says in cases:
        with pytest.raises(error, match=says):
            relaunch.Image(data)
    with pytest.raises(TypeError, match="caption is a str"):
        relaunch.Image(numpy.zeros((2, 2)), caption=3)  # type: ignore[arg-type]


def test_media_reach_a_run_logged_offline_and_synced_later(
    tracking_server: TrackingServer, tmp_path
) -> None:
    import subprocess
    import sys

    spool = tmp_path / "spool"
    run = relaunch.init("media", id="offline-imgs", dir=spool, offline=True)
    run.log({"x": relaunch.Image(numpy.eye(4))}, step=7)
    run.finish()
    out = subprocess.run(
        [sys.executable, "-m", "relaunch", "sync", str(spool), "--server", tracking_server.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    record = relaunch.Api(tracking_server.url).run("offline-imgs")
    wait_for(lambda: record.media("x"), 30, "the image listed")
    (entry,) = record.media("x")
    assert entry["step"] == 7
    assert numpy.array_equal(pixels(record.image(entry)), numpy.eye(4, dtype="u1") * 255)
