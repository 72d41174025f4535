"""`relaunch files sync`: a job's output directory mirrored to its run and
back, against the real server, sending only what differs (size, then
BLAKE3; a log that only grew sends its tail), with rsync's include/exclude
rules, dry runs, and clear errors."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import TrackingServer, wait_for
from test_files import RELAUNCH, MiB, cli, new_run, random_file
from test_launch_tracking import get
from test_resume import finish


@pytest.fixture
def cache(tmp_path: Path) -> dict[str, str]:
    """A sync cache of the test's own (XDG_CACHE_HOME)."""
    return {"XDG_CACHE_HOME": str(tmp_path / "cache")}


def sync(server: TrackingServer, env: dict[str, str], *args: object):
    return cli("files", "sync", "--server", server.url, *args, env=env)


def totals(out: str) -> dict[str, int]:
    """The summary line's numbers."""
    line = out.strip().splitlines()[-1]
    m = re.match(
        r"(\d+) file\(s\) (?:would )?\w+ \((\d+) bytes(?:, (\d+) sent)?\), (\d+) unchanged, "
        r"(\d+) excluded, (\d+) not synced",
        line,
    )
    assert m, line
    keys = ("files", "bytes", "sent", "unchanged", "excluded", "skipped")
    return {k: int(v) if v is not None else -1 for k, v in zip(keys, m.groups(), strict=True)}


def files_of(server: TrackingServer, run: str) -> dict[str, dict]:
    listed = get(server, f"/runs/{run}/files")
    assert isinstance(listed, list)
    return {f["name"]: f for f in listed}


def tree(root: Path) -> Path:
    (root / "ckpt").mkdir(parents=True)
    random_file(root / "ckpt" / "model.pt", 3 * MiB, 1)
    random_file(root / "ckpt" / "optim.pt", 1 * MiB, 2)
    (root / "train.log").write_text(
        "".join(f"step {i} loss {1 / (i + 1):.6f}\n" for i in range(400_000))
    )
    (root / "cfg.json").write_text(json.dumps({"lr": 0.1}))
    (root / "tmp").mkdir()
    (root / "tmp" / "scratch.bin").write_bytes(b"x" * 1000)
    (root / "ckpt" / "partial.tmp").write_bytes(b"y" * 100)
    return root


def test_a_directory_syncs_once_then_only_what_changed(tracking_server, tmp_path, cache):
    new_run(tracking_server, "job")
    out = tree(tmp_path / "out")
    first = sync(tracking_server, cache, out, "job:outputs", "--exclude", "tmp/",
                 "--exclude", "*.tmp")  # fmt: skip
    assert first.returncode == 0, first.stderr
    t = totals(first.stdout)
    assert (t["files"], t["unchanged"], t["excluded"]) == (4, 0, 2), first.stdout
    stored = files_of(tracking_server, "job")
    assert sorted(stored) == [
        "outputs/cfg.json", "outputs/ckpt/model.pt", "outputs/ckpt/optim.pt", "outputs/train.log",
    ]  # fmt: skip
    assert stored["outputs/ckpt/model.pt"]["size"] == 3 * MiB

    again = sync(tracking_server, cache, out, "job:outputs", "--exclude", "tmp/",
                 "--exclude", "*.tmp")  # fmt: skip
    assert totals(again.stdout) == {**totals(again.stdout), "files": 0, "unchanged": 4}

    # One checkpoint rewritten, the log grown by a few lines: only they go,
    # and the log sends its tail, not its whole.
    random_file(out / "ckpt" / "optim.pt", 1 * MiB, 3)
    log_size = (out / "train.log").stat().st_size
    with open(out / "train.log", "a") as f:
        f.write("step 5000 loss 0.000200\n" * 10)
    third = sync(tracking_server, cache, out, "job:outputs", "--exclude", "tmp/",
                 "--exclude", "*.tmp")  # fmt: skip
    t = totals(third.stdout)
    assert (t["files"], t["unchanged"]) == (2, 2), third.stdout
    assert t["sent"] < 1 * MiB + log_size // 2, third.stdout  # not the whole log again
    stored = files_of(tracking_server, "job")
    assert stored["outputs/train.log"]["size"] == (out / "train.log").stat().st_size


def test_without_the_cache_unchanged_files_are_recognised_by_their_hash(tracking_server, tmp_path):
    new_run(tracking_server, "job")
    out = tree(tmp_path / "out")
    env_a = {"XDG_CACHE_HOME": str(tmp_path / "a")}
    assert sync(tracking_server, env_a, out, "job").returncode == 0
    env_b = {"XDG_CACHE_HOME": str(tmp_path / "b")}  # another machine: no cache
    t = totals(sync(tracking_server, env_b, out, "job").stdout)
    assert (t["files"], t["unchanged"]) == (0, 6)
    # A damaged cache costs a hash, not a wrong answer.
    for f in (tmp_path / "b").rglob("*.json"):
        f.write_text("{not json")
    (out / "cfg.json").write_text(json.dumps({"lr": 0.2}))  # same size, other bytes
    t = totals(sync(tracking_server, env_b, out, "job").stdout)
    assert (t["files"], t["unchanged"]) == (1, 5)


def test_the_first_matching_rule_decides_in_the_order_given(tracking_server, tmp_path, cache):
    new_run(tracking_server, "job")
    out = tmp_path / "out"
    (out / "a").mkdir(parents=True)
    for name in ("keep.tmp", "drop.tmp", "a/keep.tmp", "a/x.txt", "top.txt"):
        (out / name).write_text(name)
    r = sync(tracking_server, cache, out, "job:one", "--include", "keep.tmp", "--exclude", "*.tmp",
             "--exclude", "/top.txt")  # fmt: skip
    assert r.returncode == 0, r.stderr
    names = sorted(n for n in files_of(tracking_server, "job") if n.startswith("one/"))
    assert names == ["one/a/keep.tmp", "one/a/x.txt", "one/keep.tmp"]
    r = sync(tracking_server, cache, out, "job:two", "--exclude", "*.tmp", "--include", "keep.tmp")
    names = sorted(n for n in files_of(tracking_server, "job") if n.startswith("two/"))
    assert names == ["two/a/x.txt", "two/top.txt"]


def test_a_run_syncs_back_into_a_directory_and_repairs_what_differs(
    tracking_server, tmp_path, cache
):
    new_run(tracking_server, "job")
    out = tree(tmp_path / "out")
    assert sync(tracking_server, cache, out, "job:outputs").returncode == 0
    back = tmp_path / "back"
    dry = sync(tracking_server, cache, "job:outputs", back, "--dry-run", "--exclude", "ckpt/")
    assert dry.returncode == 0, dry.stderr
    assert "would download outputs/train.log" in dry.stdout
    assert not back.exists()  # a dry run writes nothing
    r = sync(tracking_server, cache, "job:outputs", back, "--exclude", "ckpt/")
    assert r.returncode == 0, r.stderr
    got = sorted(str(p.relative_to(back)) for p in back.rglob("*") if p.is_file())
    assert got == ["cfg.json", "tmp/scratch.bin", "train.log"]
    assert (back / "train.log").read_bytes() == (out / "train.log").read_bytes()
    (back / "cfg.json").write_text('{"lr": 9.9}')  # damaged locally, same size
    r = sync(tracking_server, cache, "job:outputs", back, "--exclude", "ckpt/")
    t = totals(r.stdout)
    assert (t["files"], t["unchanged"], t["excluded"]) == (1, 2, 3), r.stdout
    assert json.loads((back / "cfg.json").read_text()) == {"lr": 0.1}


def test_bad_input_says_what_is_wrong(tracking_server, tmp_path, cache):
    new_run(tracking_server, "job")
    out = tmp_path / "out"
    out.mkdir()
    (out / "fine.txt").write_text("ok")
    (out / "has space.txt").write_text("no")
    os.symlink(out / "fine.txt", out / "link")
    r = sync(tracking_server, cache, out, "job")
    assert r.returncode == 1, r.stdout  # the others synced, these are named
    assert "not synced: link" in r.stdout
    assert re.search(r"not synced: has space\.txt \(file name .* is not allowed", r.stdout)
    assert "job" and "fine.txt" in files_of(tracking_server, "job")
    r = sync(tracking_server, cache, out, "job", "--exclude", "a[")
    assert r.returncode == 1 and '--exclude "a[" is not a pattern' in r.stderr, r.stderr
    r = sync(tracking_server, cache, tmp_path / "nowhere", "job")
    assert r.returncode == 1
    assert "is not allowed" in r.stderr and "is not a local directory" in r.stderr, r.stderr
    r = sync(tracking_server, cache, out, "job:../up")
    assert r.returncode == 1 and "the prefix in" in r.stderr, r.stderr
    r = sync(tracking_server, cache, out, "nosuchrun")
    assert r.returncode == 1 and "nosuchrun" in r.stderr, r.stderr


def test_a_random_tree_round_trips(tracking_server, tmp_path, cache):
    """Many small files at several depths, up and back down, byte for byte."""
    new_run(tracking_server, "job")
    rng = random.Random(7)
    src = tmp_path / "src"
    for i in range(300):
        path = src / f"d{rng.randrange(5)}" / f"e{rng.randrange(3)}" / f"f{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randrange(0, 5000)))
    assert sync(tracking_server, cache, src, "job:tree").returncode == 0
    dst = tmp_path / "dst"
    assert sync(tracking_server, cache, "job:tree", dst).returncode == 0
    for path in src.rglob("*.bin"):
        assert (dst / path.relative_to(src)).read_bytes() == path.read_bytes()
    assert len(list(dst.rglob("*.bin"))) == 300


def wait_listed(server: TrackingServer, run: str, name: str, timeout: float) -> None:
    def listed() -> bool:
        try:
            return name in files_of(server, run)
        except OSError:
            return False

    wait_for(listed, timeout, f"{name} on the server")


def test_watch_keeps_syncing_and_a_sigterm_makes_a_last_pass(tracking_server, tmp_path, cache):
    new_run(tracking_server, "job")
    out = tmp_path / "out"
    out.mkdir()
    (out / "first.txt").write_text("1")
    watcher = subprocess.Popen(
        [*RELAUNCH, "files", "sync", "--server", tracking_server.url, "--watch", "0.3",
         str(out), "job:w"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **cache},
    )  # fmt: skip
    try:
        wait_listed(tracking_server, "job", "w/first.txt", 30)
        (out / "second.txt").write_text("2")
        wait_listed(tracking_server, "job", "w/second.txt", 30)  # a later pass
        (out / "last.txt").write_text("3")
        watcher.send_signal(signal.SIGTERM)  # at once: only the last pass can send it
        stdout, stderr = watcher.communicate(timeout=60)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 0, stderr
    assert "w/last.txt" in files_of(tracking_server, "job")
    assert "last pass: " in stdout, stdout
    r = sync(tracking_server, cache, "job:w", tmp_path / "back", "--watch", "1")
    assert r.returncode == 1 and "--watch keeps a local directory uploaded" in r.stderr


def sync_dir_job(
    server: TrackingServer, tmp_path: Path, cache: dict[str, str], run: str, every: str, code: str
) -> tuple[subprocess.Popen, Path]:
    """`relaunch run --sync-dir OUT --sync-every EVERY` of a one-rank job
    whose script is `code` (OUT is its first argument); returns it and OUT."""
    out = tmp_path / "outputs"
    script = tmp_path / "job.py"
    script.write_text(code)
    job = subprocess.Popen(
        [*RELAUNCH, "run", "--server", server.url, "--run-id", run,
         "--tracking-dir", tmp_path / "spool", "--sync-dir", out, "--sync-every", every,
         "--nproc-per-node", "1", script, out],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **cache},
    )  # fmt: skip
    return job, out


def test_run_sync_dir_mirrors_the_output_folder_while_training_and_after_any_exit(
    tracking_server, tmp_path, cache
):
    """The job writes early.txt, trains a while, writes final.txt and fails:
    early.txt reaches the run while the job runs, final.txt after it ended."""
    job, out = sync_dir_job(
        tracking_server, tmp_path, cache, "syncjob", "0.3",
        "import os, sys, time\n"
        "out = sys.argv[1]\n"
        "os.makedirs(out, exist_ok=True)\n"
        "open(os.path.join(out, 'early.txt'), 'w').write('early')\n"
        "while not os.path.exists(os.path.join(out, 'go')):\n"
        "    time.sleep(0.05)\n"
        "open(os.path.join(out, 'final.txt'), 'w').write('final')\n"
        "sys.exit(3)\n",
    )  # fmt: skip
    try:
        wait_listed(tracking_server, "syncjob", "outputs/early.txt", 60)
        assert job.poll() is None  # synced while the job runs
        (out / "go").write_text("")
        _, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode != 0, stderr  # the worker failed
    stored = files_of(tracking_server, "syncjob")
    assert "outputs/final.txt" in stored, stderr  # the last pass, after a failure
    assert stored["outputs/final.txt"]["size"] == len("final")
    # The last pass saw the whole folder; a periodic pass may have sent final.txt first.
    last = re.search(r"--sync-dir .*: (\d+) file\(s\) uploaded .*, (\d+) unchanged", stderr)
    assert last and int(last[1]) + int(last[2]) == 3, stderr  # early.txt, go, final.txt


def test_run_sync_dir_makes_its_last_pass_after_the_job_failed(tracking_server, tmp_path, cache):
    """No periodic pass comes before the job ends (--sync-every 3600): what
    a failing job wrote reaches the run through the last pass alone."""
    job, _ = sync_dir_job(
        tracking_server, tmp_path, cache, "lastpass", "3600",
        "import os, sys\n"
        "os.makedirs(sys.argv[1], exist_ok=True)\n"
        "open(os.path.join(sys.argv[1], 'final.txt'), 'w').write('final')\n"
        "sys.exit(3)\n",
    )  # fmt: skip
    code, log = finish(job, timeout=120)
    assert code != 0, log
    assert files_of(tracking_server, "lastpass")["outputs/final.txt"]["size"] == len("final")
    assert re.search(r"--sync-dir .*: 1 file\(s\) uploaded", log), log


def test_sync_dir_flags_are_checked_before_anything_starts(tmp_path):
    r = cli("run", "--sync-dir", tmp_path, "--nproc-per-node", "1", "x.py",
            env={"RELAUNCH_SERVER": ""})  # fmt: skip
    assert r.returncode == 2 and "give --server URL" in r.stderr, r.stderr
    r = cli("run", "--server", "http://127.0.0.1:9", "--sync-dir", tmp_path, "--sync-every", "0",
            "--nproc-per-node", "1", "x.py")  # fmt: skip
    assert r.returncode == 2 and "--sync-every 0" in r.stderr, r.stderr


def test_delete_removes_what_the_other_side_lacks_but_never_what_is_excluded(
    tracking_server, tmp_path, cache
):
    new_run(tracking_server, "job")
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    for name in ("a.txt", "b.txt", "sub/c.txt", "keep.log"):
        (out / name).write_text(name)
    assert sync(tracking_server, cache, out, "job:o").returncode == 0
    for name in ("b.txt", "sub/c.txt", "keep.log"):
        (out / name).unlink()
    dry = sync(tracking_server, cache, out, "job:o", "--delete", "--exclude", "*.log", "-n")
    assert "would delete o/b.txt" in dry.stdout and "would delete o/sub/c.txt" in dry.stdout
    assert len(files_of(tracking_server, "job")) == 4  # a dry run deletes nothing
    r = sync(tracking_server, cache, out, "job:o", "--delete", "--exclude", "*.log")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith(", 2 deleted"), r.stdout
    assert sorted(files_of(tracking_server, "job")) == ["o/a.txt", "o/keep.log"]  # excluded: kept
    # Downloading with --delete removes local files the run does not have.
    back = tmp_path / "back"
    back.mkdir()
    (back / "stale.txt").write_text("old")
    (back / "mine.log").write_text("excluded, so kept")
    r = sync(tracking_server, cache, "job:o", back, "--delete", "--exclude", "*.log")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in back.iterdir()) == ["a.txt", "mine.log"]
    assert "deleted stale.txt" in r.stdout


def test_a_pull_that_fails_leaves_nothing_partial_and_the_server_refuses_file_and_folder(
    tracking_server, tmp_path, cache
):
    new_run(tracking_server, "job")
    out = tmp_path / "out"
    (out / "dir").mkdir(parents=True)
    random_file(out / "big.bin", 24 * MiB, 3)
    random_file(out / "dir" / "file", 1 * MiB, 4)
    assert sync(tracking_server, cache, out, "job").returncode == 0
    # A file where the run has a folder: refused with 409, naming the other.
    lone = tmp_path / "lone"
    lone.write_bytes(b"x")
    server = ("--server", tracking_server.url)
    put = cli("files", "put", *server, "job", lone, "--name", "dir", env=cache)
    assert put.returncode == 1
    assert 'already has a file "dir/file", so "dir" cannot be one' in put.stderr, put.stderr
    assert sorted(files_of(tracking_server, "job")) == ["big.bin", "dir/file"]

    # Pulled into a directory where `dir` is a file: the pull fails, says
    # why, and leaves no partial download (of big.bin either) behind.
    back = tmp_path / "back"
    back.mkdir()
    (back / "dir").write_text("in the way")
    r = sync(tracking_server, cache, "job", back)
    assert r.returncode == 1 and "dir" in r.stderr, r.stderr
    left = sorted(str(p.relative_to(back)) for p in back.rglob("*"))
    assert not [p for p in left if p.endswith(".relaunch-part")], left
    assert (back / "dir").read_text() == "in the way"
    # With the obstacle gone, the same pull completes.
    (back / "dir").unlink()
    r = sync(tracking_server, cache, "job", back)
    assert r.returncode == 0, r.stderr
    assert (back / "big.bin").read_bytes() == (out / "big.bin").read_bytes()
    assert not list(back.rglob("*.relaunch-part"))
