"""``relaunch.compat.ml_logger``: reading params and metrics back as ml-logger's
files (``read_metrics``, ``load_pkl("parameters.pkl")``, ``glob``,
``get_exps``), which pickles load without consent, images, figures and
videos as the run's media, a server outage that neither drops nor raises,
and the helpers (jsonl, yaml, TorchScript, folders and archives, ``shell``,
``ping``, ``memoize``, ``capture_error``). Against the real ``relaunch
server``; what the server stored is read through its HTTP API."""

from __future__ import annotations

import functools
import http.client
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy
import pytest
from conftest import TrackingServer, wait_for

import relaunch
from relaunch import TrackingError
from relaunch.compat.ml_logger import ML_Logger

API = "/api/v1"


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No server, run id, rank or ml-logger setting from the outer environment;
    spools (and the shim's record of its pickles) under the test's directory."""
    for name in list(os.environ):
        if name.startswith(("RELAUNCH_", "ML_LOGGER_")) or name in ("RANK", "LOCAL_RANK"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("RELAUNCH_DIR", str(tmp_path / "spool"))
    monkeypatch.setenv("RELAUNCH_ML_LOGGER_TIMEOUT", "20")


@pytest.fixture
def loggers() -> Iterator[Callable[..., ML_Logger]]:
    """Makes loggers; a run left open (its server stopped) stops shipping at teardown."""
    from relaunch.compat.ml_logger import _outbox

    made: list[ML_Logger] = []

    def make(*args: str, **kwargs: object) -> ML_Logger:
        lg = ML_Logger(*args, **kwargs)
        made.append(lg)
        return lg

    yield make
    with _outbox._pending_guard:
        _outbox._pending.clear()  # nothing left for the exit hook of this test process
    for lg in made:
        if lg._run is not None:
            lg._run._native.close()
            lg._run._state = "closed"
            lg._run = None


def get(server: TrackingServer, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", getattr(server, "read_port", server.port))
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def get_json(server: TrackingServer, path: str) -> object:
    status, body = get(server, path)
    assert status == 200, (path, status, body[:300])
    return json.loads(body)


def file_bytes(server: TrackingServer, run: str, name: str) -> bytes:
    status, body = get(server, f"{API}/runs/{run}/files/{name}")
    assert status == 200, (name, body[:300])
    return body


def files(server: TrackingServer, run: str) -> dict[str, dict]:
    return {f["name"]: f for f in get_json(server, f"{API}/runs/{run}/files")}  # type: ignore[union-attr]


def config(server: TrackingServer, run: str) -> dict:
    return get_json(server, f"{API}/runs/{run}")["config"]  # type: ignore[index]


def media(server: TrackingServer, run: str) -> list[dict]:
    events = get_json(server, f"{API}/runs/{run}/events")
    return [e["data"] for e in events if e["kind"] == "media"]  # type: ignore[union-attr]


def pixels(data: bytes) -> numpy.ndarray:
    from PIL import Image

    return numpy.asarray(Image.open(io.BytesIO(data)))


def gif_frames(data: bytes) -> list[numpy.ndarray]:
    from PIL import Image, ImageSequence

    with Image.open(io.BytesIO(data)) as im:
        return [numpy.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(im)]


# --- 6: params and metrics read back as ml-logger's files --------------------------------


def test_read_metrics_reads_the_rows_back_as_ml_loggers_dataframes(tracking_server, loggers):
    server = tracking_server
    lg = loggers("alice/sweep/seed-1", root=server.url)
    for step in range(4):
        lg.log(step=step, loss=1.0 / (step + 1), acc=step / 4, silent=True, flush=True)
    lg.log(step=10, loss=0.1, file="eval.pkl", silent=True, flush=True)  # keys eval/...
    with lg.Prefix(metrics="evaluate"):  # ml-logger's test: a metrics prefix
        lg.log(loss=0.5, flush=True, silent=True)

    # No keys: {path: DataFrame}, a row per row logged, a column per metric.
    frames = lg.read_metrics()
    assert list(frames) == ["metrics.pkl"]
    df = frames["metrics.pkl"]
    assert list(df["loss"].dropna()) == [1.0, 0.5, 1 / 3, 0.25]
    assert list(df["acc"].dropna()) == [0.0, 0.25, 0.5, 0.75]
    assert lg.get_dataframe()["metrics.pkl"].equals(df)
    # ml-logger's tests: one key gives its values, one group per row that has it.
    assert lg.read_metrics("evaluate/loss")[0] == 0.5
    assert lg.read_metrics("loss@mean")[1] == 0.5
    loss, step = lg.read_metrics("loss@mean", x_key="step@min")
    assert list(loss) == [1.0, 0.5, 1 / 3, 0.25] and list(step) == [0, 1, 2, 3]
    # A file of its own: the rows flushed into it, without its prefix.
    assert list(lg.read_metrics(path="eval.pkl")["eval.pkl"]["loss"]) == [0.1]
    assert lg.read_metrics("loss", path="eval.pkl")[0] == [0.1]
    with pytest.raises(FileNotFoundError, match=r"no metrics at 'test\.pkl'"):
        lg.read_metrics(path="test.pkl")
    assert lg.read_metrics(path="test.pkl", silent=True) is None

    # Across runs: a glob under the sweep's prefix groups the seeds' k-th rows.
    two = loggers("alice/sweep/seed-2", root=server.url)
    for step in range(4):
        two.log(step=step, loss=3.0 / (step + 1), silent=True, flush=True)
    with two.Sync():
        pass
    with lg.Prefix(".."):
        assert lg.glob("*/metrics.pkl") == ["seed-1/metrics.pkl", "seed-2/metrics.pkl"]
        mean = lg.read_metrics("loss@mean", path="*/metrics.pkl")
        assert list(mean) == [2.0, 1.0, 2 / 3, 0.5]
        both = lg.read_metrics("loss", path="**/metrics.pkl")
        assert [list(v) for v in both] == [[1.0, 3.0], [0.5, 1.5], [1 / 3, 1.0], [0.25, 0.75]]
    # Read from another prefix, the run's metrics are those of the run it names.
    other = loggers("bob/elsewhere/x", root=server.url)
    with other.Prefix("/alice/sweep/seed-2"):
        assert list(other.read_metrics()["metrics.pkl"]["loss"]) == [3.0, 1.5, 1.0, 0.75]
    lg.job_completed(silent=True)
    two.job_completed(silent=True)


def test_rows_logged_without_a_step_stay_rows_of_their_own(tracking_server, loggers):
    """Issue 34: rows logged without a step (relaunch numbers them 0, 1,
    2) merged into later rows logged with step 0, 1, 2, so metrics.pkl had
    fewer rows than ml-logger's file."""
    lg = loggers("alice/demo/rows", root=tracking_server.url)
    for i in range(3):
        lg.log(a=float(i), silent=True, flush=True)
    for step in range(3):
        lg.log(step=step, b=10.0 * step, silent=True, flush=True)
    # The same step again: a row of its own, but the run keeps one value of
    # a key per step, the last: the `step` of 1 goes with this row.
    lg.log(step=1, c=5.0, silent=True, flush=True)
    assert lg.load_pkl("metrics.pkl") == [
        {"a": 0.0},
        {"a": 1.0},
        {"a": 2.0},
        {"b": 0.0, "step": 0.0},
        {"b": 10.0},
        {"b": 20.0, "step": 2.0},
        {"c": 5.0, "step": 1.0},
    ]
    frame = lg.read_metrics()["metrics.pkl"]
    assert len(frame) == 7 and list(frame["b"].dropna()) == [0.0, 10.0, 20.0]
    lg.job_completed(silent=True)


def test_text_values_are_read_back_in_their_rows(tracking_server, loggers):
    """Issue 34: read_metrics() and load_pkl("metrics.pkl") dropped the
    strings of a row (ml-logger's file keeps them)."""
    lg = loggers("alice/demo/texts", root=tracking_server.url)
    lg.log(step=0, loss=1.0, phase="train", silent=True, flush=True)
    lg.log(step=1, loss=0.5, phase="eval", silent=True, flush=True)
    lg.log(note="a row of text alone", silent=True, flush=True)
    lg.log(step=2, loss=0.25, silent=True, flush=True)
    with lg.Prefix("eval"):
        lg.log(step=2, acc=0.5, split="val", silent=True, flush=True)
    assert lg.load_pkl("metrics.pkl") == [
        {"loss": 1.0, "phase": "train", "step": 0.0},
        {"loss": 0.5, "phase": "eval", "step": 1.0},
        {"note": "a row of text alone"},
        {"loss": 0.25, "step": 2.0},
        {"eval/acc": 0.5, "eval/split": "val", "eval/step": 2.0},
    ]
    with lg.Prefix("eval"):
        assert lg.load_pkl("metrics.pkl") == [{"acc": 0.5, "split": "val", "step": 2.0}]
    frame = lg.read_metrics()["metrics.pkl"]
    assert list(frame["phase"].dropna()) == ["train", "eval"]
    assert frame["loss"].dtype == float and list(frame["loss"].dropna()) == [1.0, 0.5, 0.25]
    # A key gives an array per row group; text has no @median.
    phases = lg.read_metrics("phase")
    assert [list(group) for group in phases] == [["train"], ["eval"]]
    lg.job_completed(silent=True)


def test_parameters_pkl_and_metrics_pkl_load_as_the_records_they_held(tracking_server, loggers):
    server = tracking_server
    lg = loggers("alice/demo/params", root=server.url)
    assert lg.load_pkl("parameters.pkl") is None  # nothing logged: no file, as in ml-logger
    lg.log_params(Args={"lr": 0.1, "layers": [4, 4]}, silent=True)
    lg.log_params(Args={"seed": 3}, silent=True)
    with lg.Prefix("eval"):
        lg.log_params(Eval={"every": 5}, silent=True)
        assert lg.load_pkl("parameters.pkl") == [{"Eval": {"every": 5}}]
    lg.log(step=0, loss=2.0, silent=True, flush=True)
    lg.log(step=1, loss=1.0, note_count=3, silent=True, flush=True)

    # No consent needed: nothing is unpickled, params are JSON, metrics numbers.
    records = lg.load_pkl("parameters.pkl")
    assert records == [
        {"Args": {"lr": 0.1, "layers": [4, 4], "seed": 3}, "eval": {"Eval": {"every": 5}}}
    ]
    from relaunch.compat.ml_logger.helpers.func_helpers import assign, dot_flatten

    assert dot_flatten(functools.reduce(assign, records))["Args.lr"] == 0.1
    assert lg.load_pkl("metrics.pkl") == [
        {"loss": 2.0, "step": 0.0},
        {"loss": 1.0, "note_count": 3.0, "step": 1.0},
    ]
    assert lg.load_pkl("metrics.pkl", start=1) == [{"loss": 1.0, "note_count": 3.0, "step": 1.0}]
    assert sorted(lg.glob("*.pkl")) == ["metrics.pkl", "parameters.pkl"]
    # A real file of that name wins over the params it stands for.
    lg.save_pkl({"mine": True}, "eval/parameters.pkl")
    with lg.Prefix("eval"):
        assert lg.load_pkl("parameters.pkl") == [{"mine": True}]
    lg.job_completed(silent=True)


def test_pickles_this_machine_wrote_load_without_consent_and_others_do_not(
    tracking_server, loggers, tmp_path, monkeypatch
):
    server = tracking_server
    lg = loggers("alice/demo/pickles", root=server.url)
    lg.save_pkl({"a": 1}, "data/own.pkl")
    lg.save_pkl([2], "data/own.pkl", append=True)
    assert lg.load_pkl("data/own.pkl") == [{"a": 1}, [2]]  # written here: no consent asked
    lg.log_data({"b": 2}, "data/log.pkl")
    assert lg.load_pkl("data/log.pkl") == [{"b": 2}]

    # Pickled bytes this logger did not pickle: uploaded as a buffer, or a
    # file of the same name replaced on the server by someone else.
    foreign = pickle.dumps({"evil": True})
    lg.upload_buffer(foreign, "data/foreign.pkl")
    with pytest.raises(PermissionError, match="not a pickle that a logger of this machine wrote"):
        lg.load_pkl("data/foreign.pkl")
    assert lg.load_pkl("data/foreign.pkl", allow_pickle=True) == [{"evil": True}]
    replaced = tmp_path / "replaced.pkl"
    replaced.write_bytes(pickle.dumps("swapped"))
    relaunch.upload_file(replaced, "alice.demo.pickles", "data/own.pkl", server=server.url)
    with pytest.raises(PermissionError):
        lg.load_pkl("data/own.pkl")
    # Appending to bytes that are not this machine's does not make them so.
    lg.save_pkl([3], "data/foreign.pkl", append=True)
    with pytest.raises(PermissionError):
        lg.load_pkl("data/foreign.pkl")
    monkeypatch.setenv("RELAUNCH_ALLOW_PICKLE", "1")
    assert lg.load_pkl("data/foreign.pkl") == [{"evil": True}, [3]]
    monkeypatch.delenv("RELAUNCH_ALLOW_PICKLE")

    # The record is this machine's client directory: another one (another
    # machine, another RELAUNCH_DIR) asks for consent for the same file.
    lg.save_pkl({"c": 3}, "data/mine.pkl")
    script = "from relaunch.compat.ml_logger import ML_Logger\n" + (
        f"lg = ML_Logger('alice/demo/pickles', root={server.url!r})\n"
        "try:\n    lg.load_pkl('data/mine.pkl')\nexcept PermissionError:\n    print('refused')\n"
    )
    env = {**os.environ, "RELAUNCH_DIR": str(tmp_path / "elsewhere")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "refused", out.stderr
    assert lg.load_pkl("data/mine.pkl") == [{"c": 3}]
    # Local pickles follow the same rule.
    lg.save_pkl({"d": 4}, f"file://{tmp_path}/local.pkl")
    assert lg.load_pkl(f"file://{tmp_path}/local.pkl") == [{"d": 4}]
    (tmp_path / "other.pkl").write_bytes(pickle.dumps(5))
    with pytest.raises(PermissionError):
        lg.load_pkl(f"file://{tmp_path}/other.pkl")
    lg.job_completed(silent=True)


# --- 7: images, figures and videos as the run's media -----------------------------------------


def test_save_image_writes_the_file_and_logs_it_at_each_step(tracking_server, loggers):
    server = tracking_server
    lg = loggers("alice/demo/images", root=server.url)
    run = "alice.demo.images"
    gray = numpy.linspace(0.0, 1.0, 16).reshape(4, 4)
    for step in range(3):
        lg.log(step=step * 10, loss=1.0, silent=True)  # the row being built has a step
        lg.save_image(gray * (step + 1) / 3, "samples/gray.png")
        lg.flush()
    with lg.Sync():
        pass
    # The file under its key, as ml-logger wrote it: the last one saved.
    assert numpy.array_equal(
        pixels(file_bytes(server, run, "samples/gray.png")), (gray * 255 + 0.5).astype(numpy.uint8)
    )
    # Each one the run's media at its step, content-addressed, once a step.
    shown = [m for m in media(server, run) if m["key"] == "samples/gray"]
    assert [m["step"] for m in shown] == [0, 10, 20]
    assert all(m["type"] == "image" and (m["width"], m["height"]) == (4, 4) for m in shown)
    listed = files(server, run)
    assert listed[shown[-1]["file"]]["blake3"] == listed["samples/gray.png"]["blake3"]
    api_media = relaunch.Api(server.url).run(run).media("samples/gray")
    assert [m["step"] for m in api_media] == [0, 10, 20]

    # A grid: 3 images in 2 columns, the empty cell white; normalized per image.
    stack = numpy.stack([numpy.full((2, 2), v) for v in (0.0, 0.5, 1.0)])
    stack[:, 0, 0] = -1.0
    lg.save_images(stack, "grid.png", n_cols=2, normalize="individual")
    grid = pixels(file_bytes(server, run, "grid.png"))
    assert grid.shape == (4, 4)
    assert grid[0, 0] == 0 and grid[0, 1] == 255 and grid[2, 2] == 255 and grid[3, 3] == 255
    # normalize='grid': one range for all; (low, high): given.
    lg.save_images(
        numpy.stack([numpy.full((1, 1), 2.0), numpy.full((1, 1), 4.0)]), "g.png", normalize="grid"
    )
    assert pixels(file_bytes(server, run, "g.png")).tolist() == [[0, 255]]
    lg.save_image(numpy.full((1, 1), 5.0), "fixed.png", normalize=(0, 10))
    assert pixels(file_bytes(server, run, "fixed.png")).tolist() == [[128]]
    # A colormap for grayscale floats; RGB(A) and uint8 as they are; JPEG and CHW tensors too.
    lg.save_image(numpy.zeros((2, 2)), "cool.png", cmap="cool")
    assert pixels(file_bytes(server, run, "cool.png"))[0, 0].tolist() == [0, 255, 255, 255]
    rgb = numpy.zeros((3, 5, 3), dtype=numpy.uint8)
    rgb[..., 2] = 200
    lg.save_image(rgb, "rgb.png")
    assert numpy.array_equal(pixels(file_bytes(server, run, "rgb.png")), rgb)
    import torch

    lg.save_image(torch.ones(3, 4, 6), "photo.jpg")
    assert pixels(file_bytes(server, run, "photo.jpg")).shape == (4, 6, 3)
    with lg.Sync():
        pass
    assert any(m["file"].endswith(".jpeg") for m in media(server, run))
    lg.save_image(numpy.full((2, 2), 1.0), "deep.png", dtype=numpy.uint16)
    assert pixels(file_bytes(server, run, "deep.png")).max() == 65535

    # Bad input says what is wrong, and nothing is written.
    with pytest.raises(ValueError, match="is for float images"):
        lg.save_image(rgb, "x.png", normalize="grid")
    with pytest.raises(ValueError, match="extension"):
        lg.save_image(gray, "no_extension")
    with pytest.raises(ValueError, match="not HxW"):
        lg.save_image(numpy.zeros((2, 2, 2, 2)), "x.png")
    with pytest.raises(ValueError, match="normalize="):
        lg.save_image(gray, "x.png", normalize="row")
    assert "x.png" not in files(server, run)
    lg.job_completed(silent=True)


def test_savefig_saves_the_figure_and_pngs_are_media(tracking_server, loggers):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    server = tracking_server
    lg = loggers("alice/demo/figures", root=server.url)
    run = "alice.demo.figures"
    fig = plt.figure(figsize=(2, 1), dpi=50)
    plt.plot([0, 1], [1, 0])
    assert lg.savefig("plots/line.png", fig=fig) == "plots/line.png"
    assert not plt.fignum_exists(fig.number)  # closed, as ml-logger did
    plt.figure(figsize=(2, 1), dpi=50)
    plt.plot([0, 1], [0, 1])
    assert lg.savefig("plots/sine", format="pdf") == "plots/sine.pdf"  # the current figure
    assert lg.save_pyplot("plots/default") == "plots/default.png"  # no format: PNG
    with lg.Sync():
        pass
    assert pixels(file_bytes(server, run, "plots/line.png")).shape == (50, 100, 4)
    assert file_bytes(server, run, "plots/sine.pdf").startswith(b"%PDF")
    keys = sorted(m["key"] for m in media(server, run))
    assert keys == ["plots/default", "plots/line"]  # a PDF is a file, not an image
    lg.job_completed(silent=True)


def frames_of(colors: list[tuple[int, int, int]], size: int = 8) -> numpy.ndarray:
    return numpy.stack([numpy.full((size, size, 3), c, dtype=numpy.uint8) for c in colors])


def test_save_video_and_make_video_log_videos_the_dashboard_plays(
    tracking_server, loggers, monkeypatch
):
    server = tracking_server
    lg = loggers("alice/demo/videos", root=server.url)
    run = "alice.demo.videos"
    colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    lg.log(step=7, silent=True)
    assert lg.save_video(frames_of(colors), "rollout", format="gif", fps=5) == "rollout.gif"
    assert lg.save_video(frames_of(colors[:2]) / 255.0, "float.gif") == "float.gif"
    with lg.Sync():
        pass
    decoded = gif_frames(file_bytes(server, run, "rollout.gif"))
    assert [tuple(f[4, 4]) for f in decoded] == colors
    (entry,) = [m for m in media(server, run) if m["key"] == "rollout"]
    assert entry["type"] == "video" and entry["format"] == "gif" and entry["step"] == 7
    assert (entry["frames"], entry["fps"], entry["width"]) == (3, 5.0, 8)
    record = relaunch.Api(server.url).run(run)
    listed = [m for m in record.media("rollout")]
    assert record.video(listed[0]) == file_bytes(server, run, "rollout.gif")

    # ml-logger's default is MP4: it needs imageio-ffmpeg, and says so.
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    with pytest.raises(ImportError, match=r"pip install imageio-ffmpeg.*format='gif'"):
        lg.save_video(frames_of(colors), "clip")
    with pytest.raises(ValueError, match="relaunch writes gif, mp4, webm"):
        lg.save_video(frames_of(colors), "clip.avi")
    with pytest.raises(TypeError, match="takes fps= only"):
        lg.save_video(frames_of(colors), "clip.gif", quality=8)

    # make_video: the run's images (a glob, sorted), downloaded and encoded here.
    for i, c in enumerate(colors):
        lg.save_image(numpy.full((6, 6, 3), c, dtype=numpy.uint8), f"frames/face_{i:04d}.png")
    assert lg.make_video("face_*.png", key="videos/up.gif", wd="frames") == "videos/up.gif"
    down = lg.make_video("frames/face_*.png", key="videos/down.gif", order="descending")
    assert down == "videos/down.gif"
    listed_order = ["frames/face_0002.png", "frames/face_0000.png"]
    assert lg.make_video(listed_order, key="videos/list.gif") == "videos/list.gif"
    assert lg.make_video("no_exist_*.png", key="videos/none.gif") is None  # as ml-logger
    with lg.Sync():
        pass

    def firsts(name: str) -> list[tuple]:
        return [tuple(f[3, 3]) for f in gif_frames(file_bytes(server, run, name))]

    assert firsts("videos/up.gif") == colors
    assert firsts("videos/down.gif") == colors[::-1]
    assert firsts("videos/list.gif") == [colors[2], colors[0]]
    lg.save_image(numpy.zeros((4, 4, 3), dtype=numpy.uint8), "frames/face_0003.png")
    with pytest.raises(ValueError, match="one size"):
        lg.make_video("frames/face_*.png", key="videos/bad.gif")
    lg.job_completed(silent=True)


# --- 8: a server outage: nothing dropped, nothing raised into the loop ---------------------------


def test_a_server_outage_queues_params_and_files_and_delivers_them_later(tracking_server, loggers):
    import torch

    server = tracking_server
    lg = loggers("alice/demo/outage", root=server.url)
    run = "alice.demo.outage"
    lg.log_params(Args={"lr": 0.1}, silent=True)
    server.stop()
    began = time.monotonic()
    for step in range(3):  # ml-logger's loop: a ping home a step
        lg.job_running(silent=True)
        lg.log(step=step, loss=1.0 / (step + 1), flush=True, silent=True)
    assert lg.torch_save({"w": torch.arange(3.0)}, "ckpt/net.pt") == "ckpt/net.pt"
    lg.save_json({"note": 1}, "notes.json")
    lg.log_params(Args={"lr": 0.2}, silent=True)
    assert lg.ping("still going") == []
    assert time.monotonic() - began < 30
    queue = Path(os.environ["RELAUNCH_DIR"]) / ".ml-logger" / "outbox" / f"{run}.json"
    queued = json.loads(queue.read_text())
    assert (
        queued["params"]["Args"] == {"lr": 0.2} and queued["params"]["job"]["status"] == "running"
    )
    # Sync() promises the server has everything: it raises, and says where the params are.
    lg.timeout = 2
    with pytest.raises(TrackingError, match=str(queue)), lg.Sync():
        pass

    server.start()
    lg.timeout = 20
    # Delivered in the background, without another call.
    wait_for(lambda: not queue.exists(), 60, "the queued params to be delivered")
    assert config(server, run)["Args"] == {"lr": 0.2}
    assert config(server, run)["job"]["status"] == "running"
    with lg.Sync():
        pass
    assert torch.equal(lg.torch_load("ckpt/net.pt")["w"], torch.arange(3.0))
    assert json.loads(file_bytes(server, run, "notes.json")) == {"note": 1}
    lg.job_completed(silent=True)
    assert config(server, run)["job"]["status"] == "completed"  # the later status wins
    kinds = [e["kind"] for e in get_json(server, f"{API}/runs/{run}/events")]
    assert kinds.count("ping") == 1


def test_params_queued_at_exit_are_kept_said_and_shipped_later(tracking_server, tmp_path):
    server = tracking_server
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from relaunch.compat.ml_logger import logger
            logger.configure("alice/demo/gone", root={server.url!r}, silent=True)
            logger.job_running(silent=True)
            logger.log_params(Args={{"lr": 0.5}}, silent=True)
            print("done")
            """
        )
    )
    server.stop()
    env = {**os.environ, "RELAUNCH_EXIT_TIMEOUT": "1"}
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    queue = Path(os.environ["RELAUNCH_DIR"]) / ".ml-logger" / "outbox" / "alice.demo.gone.json"
    assert f"they are kept in {queue}" in out.stderr
    assert "python -m relaunch.compat.ml_logger.outbox" in out.stderr
    assert json.loads(queue.read_text())["params"]["Args"] == {"lr": 0.5}

    server.start()
    # The run's records first (relaunch sync), then its params.
    spool = os.environ["RELAUNCH_DIR"]
    subprocess.run(
        [sys.executable, "-m", "relaunch", "sync", spool], env=env, check=True, timeout=120
    )
    ship = [sys.executable, "-m", "relaunch.compat.ml_logger.outbox"]
    done = subprocess.run(ship, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "alice.demo.gone: params delivered" in done.stdout, done.stderr
    assert config(server, "alice.demo.gone")["Args"] == {"lr": 0.5}
    assert not queue.exists()


def test_the_queue_is_bounded_and_past_the_bound_says_so(
    tracking_server, loggers, monkeypatch, tmp_path
):
    from relaunch.compat.ml_logger import _outbox

    server = tracking_server
    lg = loggers("alice/demo/bounded", root=server.url)
    lg.log_params(Args={"lr": 0.1}, silent=True)
    server.stop()
    monkeypatch.setattr(_outbox, "MAX_PENDING_BYTES", 2000)
    lg.log_params(Small={"a": 1}, silent=True)  # queued
    with pytest.raises(TrackingError, match="over 2000"):
        lg.log_params(Big={"x": "y" * 4000}, silent=True)
    monkeypatch.setenv("RELAUNCH_ML_LOGGER_OUTBOX_MB", "0.001")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(4096))
    with pytest.raises(TrackingError, match=r"cannot be queued.*RELAUNCH_ML_LOGGER_OUTBOX_MB"):
        lg.upload_file(str(big))
    queued = json.loads(
        next(
            (Path(os.environ["RELAUNCH_DIR"]) / ".ml-logger" / "outbox").glob("*.json")
        ).read_text()
    )
    assert queued["params"] == {"Small": {"a": 1}}  # what was accepted is kept


# --- 9: the helpers ----------------------------------------------------------------------


def test_jsonl_yaml_and_torchscript_round_trip(tracking_server, loggers):
    import torch

    server = tracking_server
    lg = loggers("alice/demo/helpers", root=server.url)
    run = "alice.demo.helpers"
    lg.log_jsonl({"a": 10}, "data/d.jsonl")
    lg.log_jsonl({"a": 12, "arr": numpy.arange(2)}, "data/d.jsonl")
    assert lg.load_jsonl("data/d.jsonl") == [{"a": 10}, {"a": 12, "arr": [0, 1]}]  # no waiting
    assert lg.load_jsonl("data/d.jsonl", start=1) == [{"a": 12, "arr": [0, 1]}]
    assert lg.load_jsonl("data/none.jsonl") is None
    lg.save_yaml({"a": 0, "b": [1, 2]}, "data/d.yaml")
    assert lg.load_yaml("data/d.yaml") == {"a": 0, "b": [1, 2]}
    assert b"a: 0" in file_bytes(server, run, "data/d.yaml")
    lg.upload_buffer(b"!!python/object/apply:os.system ['true']", "data/evil.yaml")
    import yaml

    with pytest.raises(yaml.YAMLError):
        lg.load_yaml("data/evil.yaml")  # the safe loader unless told otherwise

    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    assert lg.torch_jit_save(net, "modules/net.pt") == "modules/net.pt"
    loaded = lg.torch_jit_load("modules/net.pt")
    x = torch.randn(4, 3)
    assert torch.equal(loaded(x), net(x))
    lg.torch_jit_save(torch.jit.trace(net, x), "modules/traced.pt")  # scripted or traced: as is
    assert torch.equal(lg.torch_jit_load("modules/traced.pt")(x), net(x))
    lg.job_completed(silent=True)


def test_folders_and_archives_up_and_down(tracking_server, loggers, tmp_path):
    server = tracking_server
    lg = loggers("alice/demo/dirs", root=server.url)
    run = "alice.demo.dirs"
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("a = 1\n")
    (src / "pkg" / "a.pyc").write_bytes(b"compiled")
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref")
    (src / "README").write_text("hi")
    # ml-logger's test: the folder as one tar, excludes honoured.
    assert lg.upload_dir(str(src), "upload_dir/target.tar", excludes=["*.pyc", ".git"]) == (
        "upload_dir/target.tar"
    )
    assert "target.tar" in lg.glob("**/*", wd="upload_dir")
    with tarfile.open(fileobj=io.BytesIO(file_bytes(server, run, "upload_dir/target.tar"))) as t:
        assert sorted(t.getnames()) == ["README", "pkg/a.py"]
    out = tmp_path / "out"
    assert lg.download_dir("upload_dir/target.tar", str(out)) == str(out)
    assert (out / "pkg" / "a.py").read_text() == "a = 1\n" and not (out / ".git").exists()
    # File by file, and a zip into a folder named after the source.
    lg.upload_dir(str(src), "tree", archive=None, excludes=[".git"])
    assert {n for n in files(server, run) if n.startswith("tree/")} == {
        "tree/README",
        "tree/pkg/a.py",
        "tree/pkg/a.pyc",
    }
    assert lg.upload_dir(str(src / "pkg"), "zips/", archive="zip") == "zips/pkg.zip"
    lg.download_dir("tree", str(tmp_path / "tree"), unpack=None)
    assert (tmp_path / "tree" / "pkg" / "a.pyc").read_bytes() == b"compiled"
    # make_archive: the run's files under a folder, as one archive of the run.
    assert lg.make_archive("target", root_dir="tree") == "target"
    lg.download_dir("target.tar", str(tmp_path / "from-archive"))
    assert (tmp_path / "from-archive" / "pkg" / "a.py").read_text() == "a = 1\n"
    lg.make_archive("pkg-only", format="gztar", root_dir="tree", base_dir="pkg")
    with tarfile.open(fileobj=io.BytesIO(file_bytes(server, run, "pkg-only.tar.gz"))) as t:
        assert sorted(t.getnames()) == ["pkg/a.py", "pkg/a.pyc"]
    # An archive whose members would land outside the folder is not unpacked.
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as t:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 2
        t.addfile(info, io.BytesIO(b"no"))
    lg.upload_file(str(bad), "bad.tar")
    with pytest.raises(ValueError, match="outside the folder"):
        lg.download_dir("bad.tar", str(tmp_path / "victim"))
    assert not (tmp_path / "escaped.txt").exists()
    with pytest.raises(NotADirectoryError):
        lg.upload_dir(str(src / "README"), "x.tar")
    with pytest.raises(FileNotFoundError, match="no file under"):
        lg.make_archive("nothing", root_dir="absent")
    lg.job_completed(silent=True)


def test_glob_and_get_exps_see_params_and_metrics_across_runs(tracking_server, loggers):
    server = tracking_server
    runs = []
    for name, lr in (("a/run-1", 0.1), ("a/run-2", 0.2), ("b/run-3", 0.3)):
        lg = loggers(f"carol/sweep/{name}", root=server.url)
        lg.log_params(Args={"lr": lr}, silent=True)
        lg.job_started(silent=True)
        lg.log(step=0, loss=lr, flush=True, silent=True)
        lg.upload_buffer(b"x", "files/weights.bin")
        with lg.Sync():
            pass
        runs.append(lg)
    lg = runs[0]
    assert lg.glob("*") == ["files", "metrics.pkl", "outputs.log", "parameters.pkl"]
    with lg.Prefix("../.."):  # carol/sweep
        assert lg.glob("**/parameters.pkl") == [
            "a/run-1/parameters.pkl",
            "a/run-2/parameters.pkl",
            "b/run-3/parameters.pkl",
        ]
        assert lg.glob("a/*/metrics.pkl") == ["a/run-1/metrics.pkl", "a/run-2/metrics.pkl"]
        assert lg.glob("*/*/files/*.bin", start=1) == [
            "a/run-2/files/weights.bin",
            "b/run-3/files/weights.bin",
        ]
        exps = lg.get_exps("**")
        assert list(exps["Args.lr"]) == [0.1, 0.2, 0.3]
        assert set(exps["job.status"]) == {"started"}
        assert exps["prefix"].iloc[0] == "a/run-1/parameters.pkl"
        assert lg.get_exps("b/run-3", as_dataframe=False)[0]["Args.lr"] == 0.3
        with pytest.raises(FileNotFoundError, match="no params"):
            lg.get_exps("c/none")
    # From the root (a leading /), and with wd.
    assert lg.glob("/carol/sweep/b/**/parameters.pkl") == ["/carol/sweep/b/run-3/parameters.pkl"]
    assert lg.glob("*.pkl", wd="/carol/sweep/a/run-2") == ["metrics.pkl", "parameters.pkl"]
    assert lg.glob("*", wd="/nobody/here") is None
    for one in runs:
        one.job_completed(silent=True)


def test_shell_ping_memoize_and_capture_error(tracking_server, loggers, tmp_path, capsys):
    server = tracking_server
    lg = loggers("alice/demo/misc", root=server.url)
    run = "alice.demo.misc"
    stdout, stderr, code = lg.shell("ls")
    assert (stdout, code) == ("", 1) and "shell commands are disabled" in stderr
    with pytest.raises(TypeError):
        lg.shell(["ls"])  # type: ignore[arg-type]
    assert lg.ping("alive", 0.1) == [] and lg.ping("alive") == [] and lg.ping("done") == []
    with lg.Sync():
        pass
    pings = [e for e in get_json(server, f"{API}/runs/{run}/events") if e["kind"] == "ping"]
    assert [e["data"]["status"] for e in pings] == ["alive", "done"]  # each change once

    calls = []

    def square(x):
        calls.append(x)
        return x * x

    cache = tmp_path / "cache"
    fast = lg.memoize(square, cache_dir=str(cache))
    assert fast(3) == 9 and fast(3) == 9 and calls == [3]
    again = lg.memoize(square, cache_dir=str(cache))  # a new wrapper reads the file
    assert again(3) == 9 and calls == [3]
    (cache_file,) = cache.iterdir()
    cache_file.write_bytes(pickle.dumps({((3,), ()): "planted"}))
    capsys.readouterr()
    assert lg.memoize(square, cache_dir=str(cache))(3) == 9 and calls == [3, 3]
    assert "not the cache this machine wrote" in capsys.readouterr().err
    assert lg.release(square, cache_dir=str(cache)) and not list(cache.iterdir())

    # capture_error: the traceback into error.log (acknowledged), swallowed unless reraise.
    with lg.capture_error():
        raise RuntimeError("this should not fail")
    assert "RuntimeError: this should not fail" in file_bytes(server, run, "error.log").decode()
    with pytest.raises(KeyError), lg.capture_error(file="again.log", reraise=True):
        raise KeyError("up")
    lg.job_completed(silent=True)


def test_duplicate_copies_a_folder_and_text_not_uploaded_yet(tracking_server, loggers):
    # As ml-logger's own test_copy_directory: text logged to a file of a
    # folder, then the folder duplicated at once (the text is still uploading).
    lg = loggers("alice/demo/dup", root=tracking_server.url)
    lg.log_line("this is a file", file="dir/a.txt")
    lg.save_json({"b": 1}, "dir/sub/b.json")
    lg.duplicate("dir", "dir2")
    names = lg.glob("**/*")
    for name in ("dir/a.txt", "dir/sub/b.json", "dir2/a.txt", "dir2/sub/b.json"):
        assert name in names, names
    assert lg.load_json("dir2/sub/b.json") == {"b": 1}
    assert b"this is a file" in lg.load_file("dir2/a.txt").read()
    assert lg.load_file("dir2/a.txt").read() == lg.load_file("dir/a.txt").read()
    lg.duplicate("dir/sub/b.json", "c.json")  # a file, as before
    assert lg.load_json("c.json") == {"b": 1}
    with pytest.raises(FileNotFoundError):
        lg.duplicate("nothing", "x")


# --- local mode: what ml-logger's local mode did on this machine -------------------

LOCAL_HOST = """
import glob, json, os, pickle, sys
import numpy
from relaunch.compat.ml_logger import logger

root, host = sys.argv[1:]
logger.configure("alice/local/host", root=root, silent=True)
out = {}
# Absolute keys are paths of this machine, as os.path.join(root, prefix, key) made them.
logger.save_pkl({"a": 1}, f"{host}/x.pkl")
logger.log_data({"b": 2}, f"{host}/x.pkl")  # appended
out["pkl"] = logger.load_pkl(f"{host}/x.pkl")
logger.save_json({"j": [1, 2]}, f"{host}/data/d.json")
out["json"] = logger.load_json(f"{host}/data/d.json")
out["json_on_disk"] = json.load(open(f"{host}/data/d.json"))
logger.save_yaml({"y": 3}, f"{host}/c.yaml")
out["yaml"] = logger.load_yaml(f"{host}/c.yaml")
logger.upload_buffer(b"raw", f"{host}/raw.bin")
logger.upload_file(f"{host}/raw.bin", f"{host}/copies/")
frames = numpy.zeros((3, 8, 8))
logger.save_video(frames, f"{host}/videos/v.gif")
logger.torch_save({"w": 1}, f"{host}/m.pt")
out["torch"] = logger.torch_load(f"{host}/m.pt")
out["host_glob"] = logger.glob("**/*.gif", wd=host)
out["copies"] = sorted(os.listdir(f"{host}/copies"))
out["gif_magic"] = open(f"{host}/videos/v.gif", "rb").read(6).decode()
# None of them is a file of the run.
logger.save_json({"in": "run"}, "inside.json")
out["run_glob"] = logger.glob("**/*")
# shell: in a copy of the run's files below the prefix (and wd), on this machine.
logger.upload_buffer(b"deep", "sub/deep.txt")
out["ls"] = logger.shell("ls")
out["cat"] = logger.shell("cat deep.txt; touch new.txt", wd="sub")
out["after"] = logger.glob("sub/*")
out["host_ls"] = logger.shell("ls", wd=f"{host}/copies")
os.environ["RELAUNCH_ML_LOGGER_SHELL_MB"] = "0.000001"
out["too_big"] = logger.shell("ls")
logger.job_completed(silent=True)
print("OUT", json.dumps(out), flush=True)
"""


def test_local_mode_absolute_keys_are_host_paths_and_shell_runs_on_a_copy(tmp_path):
    # ml-logger's own test_save_pkl_abs_path, test_json_abs, test_video_gif
    # and test_shell, in local mode.
    from test_compat_ml_logger import _local_env

    env = _local_env(tmp_path)
    host = tmp_path / "host"
    script = tmp_path / "host.py"
    script.write_text(LOCAL_HOST)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "root"), str(host)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.split("OUT ", 1)[1])
    assert out["pkl"] == [{"a": 1}, {"b": 2}]
    assert out["json"] == out["json_on_disk"] == {"j": [1, 2]}
    assert out["yaml"] == {"y": 3} and out["torch"] == {"w": 1}
    assert out["host_glob"] == ["videos/v.gif"] and out["gif_magic"] == "GIF89a"
    assert out["copies"] == ["raw.bin"]
    assert out["run_glob"] == ["inside.json"]
    stdout, stderr, code = out["ls"]
    assert code == 0 and stdout.split() == ["inside.json", "sub"], stderr
    assert out["cat"][:3] == ["deep", "", 0]
    assert out["after"] == ["sub/deep.txt"]  # what the command made is not saved back
    assert out["host_ls"][0].split() == ["raw.bin"]
    stdout, stderr, code = out["too_big"]
    assert (stdout, code) == ("", 1) and "RELAUNCH_ML_LOGGER_SHELL_MB" in stderr


def test_absolute_keys_with_a_server_are_refused_saying_file_url(tracking_server, loggers):
    lg = loggers("alice/demo/abs", root=tracking_server.url)
    for call in (
        lambda: lg.save_pkl({"a": 1}, "/tmp/x.pkl"),
        lambda: lg.save_json({}, "/tmp/x.json"),
        lambda: lg.load_json("/tmp/x.json"),
        lambda: lg.upload_buffer(b"x", "/tmp/x.bin"),
    ):
        with pytest.raises(relaunch.errors.TrackingConfigError, match="file:///tmp/x"):
            call()
    assert lg.glob("*", wd="/tmp") is None  # a prefix from the root, which holds no run


def test_remove_metrics_hides_earlier_rows_from_ml_logger_reads(tracking_server, loggers):
    # ml-logger's own test_metrics_prefix and test_metrics_prefix_2.
    server = tracking_server
    lg = loggers("alice/demo/cut", root=server.url)
    run = "alice.demo.cut"
    with lg.Prefix(metrics="evaluate/", sep=""):
        lg.log(loss=0.5, flush=True, silent=True)
    lg.log(step=7, other=3, flush=True, silent=True)
    with lg.Prefix("eval"):
        lg.log(step=0, acc=0.1, flush=True, silent=True)
    assert lg.read_metrics("evaluate/loss@mean").tolist() == [0.5]
    lg.remove("metrics.pkl")
    with lg.Prefix(metrics="evaluate"):
        lg.log(loss=1, flush=True, silent=True)
    assert lg.read_metrics("evaluate/loss@mean").tolist() == [1.0]
    assert lg.read_metrics("other", silent=True) is None
    assert [r.get("evaluate/loss") for r in lg.load_pkl("metrics.pkl")] == [1.0]
    # remove under a Prefix hides that scope only; an explicit earlier step
    # logged after the cut is shown.
    with lg.Prefix("eval"):
        lg.remove("metrics.pkl")
        lg.log(step=0, acc=0.9, flush=True, silent=True)
        assert lg.load_pkl("metrics.pkl") == [{"step": 0, "acc": 0.9}]
    # The server keeps every row: the dashboard and relaunch.Api still see them.
    history = relaunch.Api(server.url).run(run).history(layout="long")
    assert 0.5 in set(history[history["key"] == "evaluate/loss"]["value"])
    lg.job_completed(silent=True)


def test_ping_returns_the_signals_sent_to_the_job_once_each(tracking_server, loggers, capsys):
    # ml-logger's own test_ping: logger.client.send_signal(prefix, "stop").
    server = tracking_server
    lg = loggers("alice/demo/sig", root=server.url)
    run = "alice.demo.sig"
    assert lg.ping("alive", 0.05) == []  # nothing was sent yet
    # The job's run reaches the server in the background; a signal to a run the
    # server does not know yet is refused (below), so wait as a user's sender would.
    api = relaunch.Api(server.url)

    def on_server() -> bool:
        try:
            return api.run(run) is not None
        except LookupError:
            return False

    wait_for(on_server, timeout=30, what="the job's run on the server")
    other = loggers("alice/demo/boss", root=server.url)
    other.client.send_signal("alice/demo/sig", "stop")
    lg.client.send_signal("/alice/demo/sig", {"lr": 0.1})  # its own prefix, from the root

    got: list = []

    def both() -> bool:
        got.extend(lg.ping("alive"))
        return len(got) >= 2

    wait_for(both, timeout=30, what="the two signals")
    assert got == ["stop", {"lr": 0.1}]  # oldest first, each once
    assert not [n for n in files(server, run) if n.startswith("__signals/")]
    time.sleep(0.2)
    assert lg.ping("alive") == []
    # A file that is not JSON is skipped with a message, and deleted.
    lg.upload_buffer(b"\x80not json", "__signals/0-bad.json")
    wait_for(
        lambda: not [n for n in files(server, run) if n.startswith("__signals/")],
        timeout=30,
        what="the bad signal read",
    )
    assert lg.ping("alive") == []
    assert "is not JSON" in capsys.readouterr().err
    with pytest.raises(relaunch.errors.TrackingConfigError, match="no run"):
        lg.client.send_signal("alice/demo/nobody", "stop")
    lg.job_completed(silent=True)
    # The poll ends with the run; a ping of the resumed run starts it again.
    wait_for(lambda: not lg._signals.alive(), timeout=30, what="the poll to end")
    other.client.send_signal("alice/demo/sig", "again")
    wait_for(lambda: got.extend(lg.ping("resumed")) or "again" in got, 30, "the signal")
    lg.job_completed(silent=True)


def test_configure_away_from_an_unreachable_server_keeps_everything_and_goes_on(
    tracking_server, loggers, free_port, capsys
):
    # ml-logger's own test_image points the logger at a host that does not
    # resolve; the fixtures after it configure the test root again.
    gone = f"http://127.0.0.1:{free_port}"  # nothing listens there
    lg = loggers("alice/demo/away", root=gone)
    lg.log_params(Args={"lr": 1})
    lg.log(step=0, loss=1.0, flush=True, silent=True)
    lg.print("a line for outputs.log")
    lg.configure("alice/demo/back", root=tracking_server.url)  # does not raise
    err = capsys.readouterr().err
    assert "left run alice.demo.away while its server cannot be reached" in err
    kept = err.split("its text files in ", 1)[1].split(" ", 1)[0]
    assert "a line for outputs.log" in "".join(
        open(os.path.join(kept, f)).read() for f in os.listdir(kept)
    )
    lg.log(step=0, loss=2.0, flush=True, silent=True)
    with lg.Sync():
        pass
    assert lg.read_metrics("loss@mean").tolist() == [2.0]
    lg.job_completed(silent=True)
    # The records of the run left behind are in the spool: `relaunch sync` ships
    # them (here to the server that answers), the finish included; its params
    # wait in the outbox.
    spool = os.environ["RELAUNCH_DIR"]
    sync = [sys.executable, "-m", "relaunch", "sync", spool, "--server", tracking_server.url]
    subprocess.run([*sync, "--timeout", "60"], check=True, timeout=120)
    away = relaunch.Api(tracking_server.url).run("alice.demo.away")
    assert away.status == "finished"
    history = away.history(layout="long")
    assert history[history["key"] == "loss"]["value"].tolist() == [1.0]
    queue = Path(spool) / ".ml-logger" / "outbox" / "alice.demo.away.json"
    assert json.loads(queue.read_text())["params"]["Args"] == {"lr": 1}


def test_diff_outside_a_git_checkout_says_so_in_one_line(
    tracking_server, loggers, tmp_path, capsys
):
    lg = loggers("alice/demo/nodiff", root=tracking_server.url)
    assert lg.diff(diff_directory=str(tmp_path)) is None
    err = capsys.readouterr().err.strip()
    assert err.startswith("logger.diff: not storing the git diff: `git diff HEAD` in ")
    assert "\n" not in err and "git repository" in err
    lg.job_completed(silent=True)
