"""The files benchmark: relaunch's uploads against `cp` on the same disk and
against ml-logger's fastest upload path, same run, reported as ratios.

    bash bench/files/setup.sh                         # the peer's environment
    .venv/bin/python bench/files/run.py [--repeat 3] [--quick] [--reupload-only]

Figures (every side alternately, `--repeat` times, medians):
- a fresh file of random bytes (4 GiB) uploaded over loopback by
  `relaunch.upload_file` to a `relaunch server` with an empty data directory
  (default durability: every chunk fsynced before it is acknowledged),
  against `cp` of the same file on the same disk followed by an fsync of
  the copy, and against ml-logger 0.10.36's `save_file` path (a pycurl
  multipart POST of the file) to its own server. The source is in the page
  cache for every side; each side starts with no dirty pages (`sync`
  before, untimed). The same upload again under another name (the server
  has every chunk, nothing is sent) shows the client's chunking and
  hashing on their own;
- a checkpoint (a torch state_dict of GPT-like blocks saved with
  `torch.save`, 360 MiB) uploaded, then the next one with 10% of its weight
  bytes changed: bytes the second upload sends as a share of the file, when
  whole layers changed (3 of 30 blocks) and when single tensors scattered
  over the file changed;
- a model and its Adam state (`torch.save` of both state_dicts after 3
  optimizer steps, 360 MiB) uploaded, then the next one after one more
  step in which only 2 of 40 blocks train (the others stay in the optimizer
  with zero gradients, so their tensors keep their bytes but every `step`
  scalar advances): bytes sent against the bytes that changed;
- the same three, a checkpoint that Lightning's ModelCheckpoint writes one
  training step after the last (real Lightning, 2 of the blocks training
  with Adam) and a safetensors file with tensors scattered over it
  changed, each saved under a new name (`ckpt-1.pt` then `ckpt-2.pt`,
  `epoch=0-step=3.ckpt` then `epoch=0-step=4.ckpt`): bytes sent against
  the bytes of the tensors that changed (target <= 1.1x), and against the
  same pair saved under one name (`--renamed-only` runs these alone).
Results go to stdout as a markdown table and to bench/out/files.json. The
ratio is relaunch's advantage: above 1 means relaunch took less time or sent
fewer bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from relaunch._subprocess import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from common import (  # noqa: E402
    compare,
    free_port,
    fsync_path,
    gpt_state_dict,
    run_json,
    write_result,
)

HERE = Path(__file__).resolve().parent
PEER_PY = HERE / ".venv" / "bin" / "python"
GIB = 1 << 30
MIB = 1 << 20


def fmt(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value:.1f}%"
    if unit == "s":
        return f"{value:.2f} s"
    return f"{value:,.0f} {unit}"


def size_name(n: int) -> str:
    return f"{n // GIB} GiB" if n % GIB == 0 else f"{n // MIB} MiB"


def write_random(path: Path, size: int) -> None:
    block = 64 * MIB
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(block, left)
            f.write(os.urandom(n))
            left -= n
    fsync_path(path)


class MlLoggerServer:
    """ml-logger's server (`python -m ml_logger.server`, through the shim
    `mll_server.py`), with sanic's request limits raised so 4 GiB fit."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        env = dict(os.environ)
        # sanic 20.9 reads SANIC_* settings from the environment; its default
        # body limit is 100 MB and its request timeout 60 s.
        env.update(
            SANIC_REQUEST_MAX_SIZE=str(64 * GIB),
            SANIC_REQUEST_TIMEOUT="3600",
            SANIC_RESPONSE_TIMEOUT="3600",
        )
        self.log = open(logdir.parent / "ml-logger-server.log", "wb")
        server = [str(PEER_PY), str(HERE / "mll_server.py"), "--logdir", str(logdir)]
        self.proc = subprocess.Popen(
            [*server, "--port", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("ml-logger's server did not start; see its log") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class RelaunchServer:
    """A fresh `relaunch server` with an empty data directory: every upload
    is a first upload (the chunk store would otherwise skip it all)."""

    def __init__(self, scratch: Path) -> None:
        self.data = Path(tempfile.mkdtemp(prefix="relaunch-data-", dir=scratch))
        self.server = ServerProcess(self.data)
        self.url = self.server.url

    def new_run(self, run: str) -> str:
        body = json.dumps({"id": run, "attempt_token": "t"}).encode()
        req = urllib.request.Request(
            f"{self.url}/api/v1/runs",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
        return run

    def stop(self) -> None:
        """Stops the server. Its data directory stays until the benchmark's
        scratch directory is removed at the end: deleting thousands of chunk
        files just before the next side runs makes that side's file creation
        slow on this machine's ext4 (no journal: each new inode is checked
        against the recently deleted ones), which would measure the
        benchmark's own clean-up, not the upload."""
        self.server.stop()


class Bench:
    def __init__(self, scratch: Path, repeat: int) -> None:
        self.scratch = scratch
        self.repeat = repeat
        self.rows: list[dict] = []
        self.samples: dict[str, list[float]] = {}

    def sample(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(value)

    def row(self, name: str, unit: str, ours: str, theirs: str, peer: str, target, **extra):
        """A row comparing the medians of two sample series (lower is better)."""
        row = compare(
            name, self.samples[ours], self.samples[theirs], peer, target, unit=unit, **extra
        )
        self.rows.append(row)
        a, b, ratio = row["relaunch"], row["peer"], row["ratio"]
        print(
            f"{name:<70} relaunch {fmt(a, unit)}  {peer} {fmt(b, unit)}  ratio {ratio:5.2f}x",
            flush=True,
        )
        return row

    # --- the sides of the upload figure -----------------------------------------

    def cp(self, src: Path) -> None:
        dst = self.scratch / "cp-copy.bin"
        os.sync()
        started = time.perf_counter()
        subprocess.run(["cp", str(src), str(dst)], check=True)
        copied = time.perf_counter()
        fsync_path(dst)
        synced = time.perf_counter()
        self.sample("cp", copied - started)
        self.sample("cp+fsync", synced - started)
        dst.unlink()

    def relaunch(self, src: Path, key: str) -> dict:
        server = RelaunchServer(self.scratch)
        try:
            run = server.new_run("bench-files")
            os.sync()
            cmd = [sys.executable, str(HERE / "clients.py"), "relaunch", server.url, run]
            done = run_json([*cmd, str(src), src.name])
            # Again, under another name: the server has every chunk, so this
            # is the client's reading, chunking and hashing alone.
            again = run_json([*cmd, str(src), f"again-{src.name}"])
            assert again["sent_bytes"] == 0, again
        finally:
            server.stop()
        self.sample(key, done["seconds"])
        self.sample(f"{key} again", again["seconds"])
        return done

    def ml_logger(self, peer: MlLoggerServer, src: Path, key: str) -> dict:
        os.sync()
        cmd = [str(PEER_PY), str(HERE / "clients.py"), "ml-logger", peer.url]
        done = run_json([*cmd, str(src), f"bench/{src.name}"])
        (peer.logdir / "bench" / src.name).unlink()
        self.sample(key, done["seconds"])
        return done


def make_checkpoints(
    scratch: Path,
    total: int,
    share: float,
    pattern: str,
    names: tuple[str, str] = ("model.pt", "model.pt"),
    writer: str = "torch",
) -> tuple[Path, Path, float]:
    """Two torch.save files of one transformer-like state_dict (blocks of a
    GPT-like layer, d=512: attention and MLP weights, biases, layer norms,
    12 MiB of float32; d=256 for small sizes), where in the second about
    `share` of the weight bytes have new values, as when part of a model
    trains between two checkpoints. `pattern` "layers": every tensor of
    round(share * blocks) blocks chosen at random (fixed seed); "tensors":
    single tensors chosen at random, up to `share` of the bytes. Returns the
    paths and the share of the weight bytes that changed. `names`: the two
    files' names (torch.save names the zip archive's top directory after
    the file, and that name heads every tensor's record); `writer`:
    "torch" (torch.save) or "safetensors" (save_file, with the step in its
    metadata)."""
    import torch

    def save(state: dict, path: Path, step: int) -> None:
        if writer == "safetensors":
            from safetensors.torch import save_file

            save_file(state, str(path), metadata={"step": str(step)})
        else:
            torch.save(state, path)

    g = torch.Generator().manual_seed(0)
    state, blocks = gpt_state_dict(total, 512 if total >= 256 * MIB else 256, g)
    d1, d2 = scratch / f"{pattern}-1", scratch / f"{pattern}-2"
    first, second = d1 / names[0], d2 / names[1]
    d1.mkdir()
    d2.mkdir()
    save(state, first, 1)
    weight_bytes = sum(t.numel() * t.element_size() for t in state.values())
    if pattern == "layers":
        chosen = torch.randperm(blocks, generator=g)[: max(1, round(share * blocks))].tolist()
        names = [n for n in state if int(n.split(".")[1]) in chosen]
    else:
        names, budget = [], share * weight_bytes
        for i in torch.randperm(len(state), generator=g).tolist():
            name = list(state)[i]
            size = state[name].numel() * state[name].element_size()
            if size <= budget:  # up to the share, not past it
                names.append(name)
                budget -= size
    for name in names:
        t = state[name]
        t.add_(torch.randn(t.shape, generator=g) * 1e-3)  # a training step's update
    save(state, second, 2)
    changed = sum(state[n].numel() * state[n].element_size() for n in names)
    return first, second, changed / weight_bytes


def make_adam_checkpoints(
    scratch: Path, total: int, names: tuple[str, str] = ("model.pt", "model.pt")
) -> tuple[Path, Path, int, int]:
    """Two torch.save files of {"model": ..., "optimizer": ...}: GPT-like
    blocks (d=256, 40 blocks at 360 MiB) and torch.optim.Adam's state after
    3 steps, then after a 4th. Only 2 blocks train (random gradients); the
    others get zero gradients, so Adam keeps their weights and moments
    bit for bit but advances their `step` scalars, one per parameter.
    Returns the paths, the bytes of the tensors that changed and how many
    of them are smaller than 64 KiB."""
    import torch

    g = torch.Generator().manual_seed(0)
    state, blocks = gpt_state_dict(total // 3, 256, g)
    params = {k: torch.nn.Parameter(v) for k, v in state.items()}
    trained = {f"blocks.{i}." for i in torch.randperm(blocks, generator=g)[:2].tolist()}
    opt = torch.optim.Adam(params.values(), lr=1e-3)

    def step() -> None:
        for name, p in params.items():
            if any(name.startswith(b) for b in trained):
                p.grad = torch.randn(p.shape, generator=g)
            else:
                p.grad = torch.zeros_like(p)
        opt.step()

    def tensors() -> dict:
        model = {k: p.detach() for k, p in params.items()}
        return {"model": model, "optimizer": opt.state_dict()}

    def flat(tree: dict) -> list:
        out = [v.clone() for v in tree["model"].values()]
        for entry in tree["optimizer"]["state"].values():
            out += [v.clone() for v in entry.values()]
        return out

    d1, d2 = scratch / "adam-1", scratch / "adam-2"
    first, second = d1 / names[0], d2 / names[1]
    d1.mkdir()
    d2.mkdir()
    for _ in range(3):
        step()
    torch.save(tensors(), first)
    before = flat(tensors())
    step()
    torch.save(tensors(), second)
    changed = [a for a, b in zip(before, flat(tensors()), strict=True) if not torch.equal(a, b)]
    changed_bytes = sum(t.numel() * t.element_size() for t in changed)
    small = sum(1 for t in changed if t.numel() * t.element_size() < 64 * 1024)
    return first, second, changed_bytes, small


LIGHTNING_MODULE = """
import sys, torch, lightning.pytorch as pl
sys.path.insert(0, sys.argv[3])
from common import gpt_state_dict

class Blocks(pl.LightningModule):
    def __init__(self, total):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        state, blocks = gpt_state_dict(total, 256, g)
        trained = {f"blocks.{i}." for i in torch.randperm(blocks, generator=g)[:2].tolist()}
        self.names = list(state)
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(v, requires_grad=any(k.startswith(b) for b in trained))
            for k, v in state.items()
        )

    def training_step(self, batch, i):
        (x,) = batch
        return sum((p * x.mean()).square().mean() for p in self.weights if p.requires_grad)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 4)), batch_size=8)
saver = pl.callbacks.ModelCheckpoint(dirpath=sys.argv[1], every_n_train_steps=1, save_top_k=-1)
trainer = pl.Trainer(
    max_steps=4, accelerator="cpu", logger=False, enable_progress_bar=False,
    enable_model_summary=False, callbacks=[saver],
)
trainer.fit(Blocks(int(sys.argv[2])), data)
"""


def make_lightning_checkpoints(scratch: Path, total: int) -> tuple[Path, Path, int]:
    """Two checkpoints that Lightning's ModelCheckpoint writes one training
    step apart (`epoch=0-step=3.ckpt`, `epoch=0-step=4.ckpt`): GPT-like
    blocks (d=256) of which 2 train, with Adam. Returns the paths and the
    bytes of the tensors that differ between them."""
    import torch

    out = scratch / "lightning"
    subprocess.run(
        [sys.executable, "-c", LIGHTNING_MODULE, str(out), str(total // 3), str(ROOT / "bench")],
        check=True,
        capture_output=True,
    )
    first, second = out / "epoch=0-step=3.ckpt", out / "epoch=0-step=4.ckpt"

    def tensors(path: Path) -> list:
        ckpt = torch.load(path, weights_only=False)
        found: list = []

        def walk(x: object) -> None:
            if isinstance(x, torch.Tensor):
                found.append(x)
            elif isinstance(x, dict):
                for v in x.values():
                    walk(v)
            elif isinstance(x, list | tuple):
                for v in x:
                    walk(v)

        walk(ckpt["state_dict"])
        walk(ckpt["optimizer_states"])
        return found

    a, b = tensors(first), tensors(second)
    assert len(a) == len(b), (len(a), len(b))
    changed = sum(
        y.numel() * y.element_size()
        for x, y in zip(a, b, strict=True)
        if x.shape != y.shape or not torch.equal(x, y)
    )
    return first, second, changed


def renamed(bench: Bench, scratch: Path, total: int, shape: str, what: str) -> None:
    """The next checkpoint saved under a new name, as training loops name
    them (`ckpt-1.pt`, `ckpt-2.pt`; Lightning's `epoch=0-step=N.ckpt`):
    the bytes the second upload sends against the bytes of the tensors
    that changed (target <= 1.1x), and against the same pair saved under
    one name (the peer: what dedup gave before a new name mattered)."""
    if shape == "lightning":
        pairs = {"renamed": make_lightning_checkpoints(scratch, total)}
    elif shape == "adam":
        pairs = {}
        for key, names in (("same", ("model.pt",) * 2), ("renamed", ("ckpt-1.pt", "ckpt-2.pt"))):
            (scratch / key).mkdir(exist_ok=True)
            first, second, changed, _ = make_adam_checkpoints(scratch / key, total, names)
            pairs[key] = (first, second, changed)
    else:
        pattern, writer = ("tensors", "safetensors") if shape == "safetensors" else (shape, "torch")
        ext = ".safetensors" if writer == "safetensors" else ".pt"
        pairs = {}
        for key, names in (
            ("same", (f"model{ext}",) * 2),
            ("renamed", (f"ckpt-1{ext}", f"ckpt-2{ext}")),
        ):
            (scratch / key).mkdir(exist_ok=True)
            first, second, share = make_checkpoints(
                scratch / key, total, 0.10, pattern, names, writer
            )
            weight_bytes = second.stat().st_size  # about the weights: the header is small
            pairs[key] = (first, second, int(share * weight_bytes))
    sent: dict[str, dict] = {}
    for _ in range(bench.repeat):
        for key, (first, second, changed) in pairs.items():
            server = RelaunchServer(scratch)
            try:
                run = server.new_run("bench-renamed")
                cmd = [sys.executable, str(HERE / "clients.py"), "relaunch", server.url, run]
                run_json([*cmd, str(first), first.name])
                done = run_json([*cmd, str(second), second.name])
            finally:
                server.stop()
            bench.sample(f"{shape}-{key}-sent", done["sent_bytes"] / MIB)
            sent[key] = {**done, "changed_bytes": changed}
    ours = f"{shape}-renamed-sent"
    theirs = f"{shape}-same-sent" if "same" in pairs else ours
    changed = sent["renamed"]["changed_bytes"]
    row = bench.row(
        f"re-upload under a new name ({what}), {changed / MIB:.1f} MiB of tensors changed: "
        "MiB sent",
        "MiB",
        ours,
        theirs,
        "same name" if "same" in pairs else "itself",
        None,
        changed_bytes=changed,
        uploads=sent,
    )
    ratio = row["relaunch"] * MIB / changed
    row["target"], row["met"] = "<= 1.1x changed", ratio <= 1.1
    row["sent_over_changed"] = ratio
    print(f"  sent {ratio:.3f}x the bytes that changed", flush=True)
    for first, second, _ in pairs.values():
        shutil.rmtree(first.parent, ignore_errors=True)
        shutil.rmtree(second.parent, ignore_errors=True)


def reupload(
    bench: Bench, peer: MlLoggerServer, scratch: Path, total: int, pattern: str, what: str
) -> None:
    """A checkpoint uploaded, then the next one with ~10% of its weights
    changed ("layers", "tensors"), or a model with its Adam state one step
    later ("adam"): the bytes the second upload sends, as a share of the
    file, and its time; ml-logger sends the whole file again."""
    if pattern == "adam":
        first, second, changed_bytes, small = make_adam_checkpoints(scratch, total)
    else:
        first, second, changed = make_checkpoints(scratch, total, 0.10, pattern)
    uploads: dict[str, dict] = {}
    for _ in range(bench.repeat):
        server = RelaunchServer(scratch)
        try:
            run = server.new_run("bench-ckpt")
            cmd = [sys.executable, str(HERE / "clients.py"), "relaunch", server.url, run]
            run_json([*cmd, str(first), "step_1/model.pt"])
            os.sync()
            done = run_json([*cmd, str(second), "step_2/model.pt"])
        finally:
            server.stop()
        bench.sample(f"{pattern}-relaunch", done["seconds"])
        bench.sample(f"{pattern}-relaunch-sent", 100 * done["sent_bytes"] / done["size"])
        theirs = bench.ml_logger(peer, second, f"{pattern}-ml-logger")
        bench.sample(f"{pattern}-ml-logger-sent", 100 * theirs["sent_bytes"] / theirs["size"])
        uploads = {"relaunch": done, "ml-logger": theirs}
    ckpt = f"{second.stat().st_size / MIB:.0f} MiB checkpoint"
    if pattern == "adam":
        sent = uploads["relaunch"]["sent_bytes"]
        row = bench.row(
            f"re-upload of a {ckpt} ({what}), {changed_bytes / MIB:.1f} MiB in "
            f"{small} small and some large tensors changed: bytes sent",
            "%",
            f"{pattern}-relaunch-sent",
            f"{pattern}-ml-logger-sent",
            "ml-logger",
            None,
            changed_bytes=changed_bytes,
            changed_small=small,
            sent_bytes=sent,
            file_bytes=second.stat().st_size,
            uploads=uploads,
        )
        # A changed small entry may cost up to 64 KiB.
        ceiling = changed_bytes + small * 64 * 1024
        row["target"], row["met"] = "changed + 64 KiB a small tensor", sent <= ceiling
        print(
            f"  sent {sent / MIB:.1f} MiB for {changed_bytes / MIB:.1f} MiB changed "
            f"({sent / changed_bytes:.2f}x), {uploads['relaunch']['sent_chunks']} of "
            f"{uploads['relaunch']['chunks']} chunks",
            flush=True,
        )
    else:
        row = bench.row(
            f"re-upload of a {ckpt}, {changed:.1%} of its weights changed ({what}): bytes sent",
            "%",
            f"{pattern}-relaunch-sent",
            f"{pattern}-ml-logger-sent",
            "ml-logger",
            None,
            changed_share=changed,
            file_bytes=second.stat().st_size,
            uploads=uploads,
        )
        row["target"], row["met"] = "<= 15%", row["relaunch"] <= 15.0
    bench.row(
        f"re-upload of that checkpoint ({what}): time",
        "s",
        f"{pattern}-relaunch",
        f"{pattern}-ml-logger",
        "ml-logger",
        None,
    )
    shutil.rmtree(first.parent)
    shutil.rmtree(second.parent)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int)
    p.add_argument("--size-mib", type=int, help="the uploaded file [4096]")
    p.add_argument("--ckpt-mib", type=int, help="the re-uploaded checkpoint [360]")
    p.add_argument("--quick", action="store_true", help="256 MiB, a 36 MiB checkpoint, 1 repeat")
    p.add_argument(
        "--reupload-only", action="store_true", help="only the re-upload figures (no 4 GiB file)"
    )
    p.add_argument("--renamed-only", action="store_true", help="only the new-name figures")
    p.add_argument("--scratch", type=Path, default=ROOT / "bench" / "out")
    a = p.parse_args()
    quick = (1, 256, 36) if a.quick else (3, 4096, 360)
    a.repeat = a.repeat or quick[0]
    a.size_mib = a.size_mib or quick[1]
    a.ckpt_mib = a.ckpt_mib or quick[2]
    size = a.size_mib * MIB
    subprocess.run(["bash", str(HERE / "setup.sh")], check=True)
    a.scratch.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="files-bench-", dir=a.scratch))
    bench = Bench(scratch, a.repeat)
    started = time.time()
    peer = None
    try:
        versions = run_json([str(PEER_PY), "-c", VERSIONS])
        print(f"# files benchmark, {os.cpu_count()} CPUs, median of {a.repeat}, {versions}")
        ckpt = a.ckpt_mib * MIB
        if not a.renamed_only:
            peer = MlLoggerServer(scratch / "ml-logger-data")
            if not a.reupload_only:
                upload(bench, peer, scratch, size, a.repeat)
            reupload(bench, peer, scratch, ckpt, "layers", "whole layers")
            reupload(bench, peer, scratch, ckpt, "tensors", "tensors scattered")
            reupload(bench, peer, scratch, ckpt, "adam", "model + Adam, one more step")
        renamed(bench, scratch, ckpt, "layers", "torch.save, whole layers")
        renamed(bench, scratch, ckpt, "tensors", "torch.save, tensors scattered")
        renamed(bench, scratch, ckpt, "adam", "torch.save, model + Adam one step on")
        renamed(bench, scratch, ckpt, "lightning", "Lightning ModelCheckpoint, one step on")
        renamed(bench, scratch, ckpt, "safetensors", "safetensors, tensors scattered")
    finally:
        if peer is not None:
            peer.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    result = {
        "started": started,
        "cpus": os.cpu_count(),
        "repeat": a.repeat,
        "size_bytes": size,
        "peer_versions": versions,
        "rows": bench.rows,
    }
    name = "files.renamed" if a.renamed_only else "files.reupload" if a.reupload_only else "files"
    write_result(f"{name}.quick" if a.quick else name, result)
    print("\n| figure | relaunch | peer | ratio | target | met? |\n|---|---|---|---|---|---|")
    for r in bench.rows:
        target = r["target"]
        if isinstance(target, float):
            target = f">= {target:g}x"
        met = {True: "yes", False: "**no**", None: "-"}[r["met"]]
        print(
            f"| {r['name']} | {fmt(r['relaunch'], r['unit'])} | {r['peer_name']} "
            f"{fmt(r['peer'], r['unit'])} | {r['ratio']:.2f}x | {target or '-'} | {met} |"
        )


def upload(bench: Bench, peer: MlLoggerServer, scratch: Path, size: int, repeat: int) -> None:
    """The fresh upload of a file of random bytes against cp and ml-logger."""
    src = scratch / "random.bin"
    write_random(src, size)
    sides = [
        lambda: bench.cp(src),
        lambda: bench.relaunch(src, "relaunch"),
        lambda: bench.ml_logger(peer, src, "ml-logger"),
    ]
    for i in range(repeat):
        # A different side goes first each round.
        for side in sides[i % 3 :] + sides[: i % 3]:
            side()
    name = size_name(size)
    bench.row(
        f"upload {name} over loopback vs cp + fsync of the copy, same disk",
        "s",
        "relaunch",
        "cp+fsync",
        "cp",
        0.8,
    )
    bench.row(
        f"upload {name} vs cp alone (page cache, no fsync)", "s", "relaunch", "cp", "cp", None
    )
    bench.row(
        f"the same {name} uploaded again (nothing sent: chunking and hashing) vs cp + fsync",
        "s",
        "relaunch again",
        "cp+fsync",
        "cp",
        None,
    )
    bench.row(
        f"upload {name} vs ml-logger (pycurl multipart POST to its server)",
        "s",
        "relaunch",
        "ml-logger",
        "ml-logger",
        3.0,
    )
    src.unlink()


VERSIONS = """
import json
from importlib.metadata import version
import pycurl
out = {p: version(p) for p in ["ml-logger", "pycurl", "sanic"]}
print(json.dumps(out | {"libcurl": pycurl.version_info()[1]}))
"""

if __name__ == "__main__":
    main()
