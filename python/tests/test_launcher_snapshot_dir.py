"""The checkpoints' memory tier as `relaunch run` keeps it: one directory
per launcher, shared by every rank of every attempt, gone when the launcher
exits, swept by the next launcher after a SIGKILL.

Each test points ``RELAUNCH_SNAPSHOT_ROOT`` at a folder of its own, so the
launchers it starts never see ``/dev/shm`` or each other's tests.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import wait_for

from relaunch._subprocess import alive

# A worker that says what it sees of the tier (into OUT/seen.ATTEMPT.RANK,
# whole or not at all), leaves a file in it, then does what MODE says.
SEE = r"""
import json, os, stat, sys, time
out, mode = sys.argv[1], sys.argv[2]
rank, attempt = os.environ["RANK"], os.environ["RELAUNCH_ATTEMPT"]
tier = os.environ.get("RELAUNCH_SNAPSHOT_DIR")
seen = {"dir": tier, "memory": os.environ.get("RELAUNCH_SNAPSHOT_MEMORY"), "launcher": os.getppid()}
if tier:
    seen["mode"] = stat.S_IMODE(os.stat(tier).st_mode)
    seen["files"] = sorted(os.listdir(tier))
    with open(os.path.join(tier, "owner")) as f:
        seen["owner"] = json.load(f)
    with open(f"/proc/{os.getppid()}/stat") as f:
        text = f.read()
    seen["launcher_start"] = int(text[text.rfind(")") + 2:].split()[19])
    with open(os.path.join(tier, f"snap.{attempt}.{rank}"), "w") as f:
        f.write("state")
partial = os.path.join(out, f".seen.{attempt}.{rank}")
with open(partial, "w") as f:
    json.dump(seen, f)
os.rename(partial, os.path.join(out, f"seen.{attempt}.{rank}"))
if (mode == "crash-once" and attempt == "0" or mode == "fail") and rank == "1":
    # Once rank 0 has looked too: the failure stops it.
    deadline, theirs = time.monotonic() + 60, os.path.join(out, f"seen.{attempt}.0")
    while not os.path.exists(theirs) and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(3)
if mode == "fail":
    sys.exit(3)
if mode == "sleep":
    time.sleep(600)
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    made = tmp_path / "shm"
    made.mkdir()
    return made


@pytest.fixture
def see(tmp_path: Path) -> Path:
    script = tmp_path / "see.py"
    script.write_text(SEE)
    return script


@pytest.fixture
def launcher(relaunch_run, root: Path) -> Callable[..., subprocess.Popen]:
    """Starts `relaunch run ARGS` with the test's snapshot root."""

    def start(*args: object, env: dict[str, str] | None = None) -> subprocess.Popen:
        return relaunch_run(*args, env={"RELAUNCH_SNAPSHOT_ROOT": str(root), **(env or {})})

    return start


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def tiers(root: Path) -> list[Path]:
    return sorted(root.glob("relaunch-snap-*"))


def seen(out: Path, attempt: int, rank: int) -> dict:
    return json.loads((out / f"seen.{attempt}.{rank}").read_text())


def test_every_rank_of_every_attempt_shares_one_private_directory(launcher, see, root, tmp_path):
    """A rank that crashes finds what every rank left before the restart."""
    job = launcher(
        *("--nproc-per-node", "2", "--max-restarts", "1", "--snapshot-memory", "3MiB"),
        *(see, tmp_path, "crash-once"),
    )
    code, _, err = finish(job)
    assert code == 0, err
    views = [seen(tmp_path, attempt, rank) for attempt in (0, 1) for rank in (0, 1)]
    tier = views[0]["dir"]
    name = Path(tier).name
    assert re.fullmatch(rf"relaunch-snap-{os.geteuid()}-{job.pid}-[0-9a-f]{{8}}", name), name
    assert Path(tier).parent == root
    for view in views:
        assert view["dir"] == tier
        assert view["memory"] == str(3 << 20)
        assert view["mode"] == 0o700
        assert view["launcher"] == job.pid
        owner = view["owner"]
        assert owner["pid"] == job.pid
        assert owner["start_time"] == view["launcher_start"]
        assert owner["hostname"] == os.uname().nodename
        assert owner["run_id"]
    # The second attempt sees the first one's files: the directory outlived
    # the crash and the restart.
    for rank in (0, 1):
        assert {"snap.0.0", "snap.0.1"} <= set(seen(tmp_path, 1, rank)["files"])
    assert "owner.partial" not in seen(tmp_path, 1, 0)["files"]
    assert tiers(root) == []


def test_the_default_budget_is_a_number_of_bytes(launcher, see, root, tmp_path):
    code, _, err = finish(launcher(see, tmp_path, "done"))
    assert code == 0, err
    view = seen(tmp_path, 0, 0)
    assert int(view["memory"]) > 0
    assert Path(view["dir"]).parent == root
    assert tiers(root) == []


def test_the_variable_sets_the_size_like_the_flag(launcher, see, root, tmp_path):
    code, _, err = finish(launcher(see, tmp_path, "done", env={"RELAUNCH_SNAPSHOT_MEMORY": "2MiB"}))
    assert code == 0, err
    assert seen(tmp_path, 0, 0)["memory"] == str(2 << 20)


def test_the_directory_goes_when_the_job_fails(launcher, see, root, tmp_path):
    code, _, err = finish(launcher("--nproc-per-node", "2", see, tmp_path, "fail"))
    assert code == 1, err
    assert Path(seen(tmp_path, 0, 0)["dir"]).parent == root
    assert tiers(root) == []


def test_the_directory_goes_when_no_worker_could_start(launcher, root, tmp_path):
    code, _, err = finish(launcher("--no-python", tmp_path / "no-such-program"))
    assert code == 1
    assert "cannot start worker 0" in err
    assert tiers(root) == []


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_the_directory_goes_when_the_launcher_is_stopped(launcher, see, root, tmp_path, stop):
    job = launcher("--nproc-per-node", "2", see, tmp_path, "sleep")
    wait_for(lambda: len(list(tmp_path.glob("seen.0.*"))) == 2, 60, "both ranks")
    tier = Path(seen(tmp_path, 0, 0)["dir"])
    assert tier.is_dir()
    job.send_signal(stop)
    code, _, err = finish(job, timeout=60)
    assert code == 128 + stop, err
    assert not tier.exists()
    assert tiers(root) == []


def fake_tier(root: Path, name: str, owner: dict | None) -> Path:
    made = root / name
    made.mkdir(mode=0o700)
    if owner is not None:
        (made / "owner").write_text(json.dumps(owner))
    return made


def test_a_killed_launchers_directory_is_swept_by_the_next_one(launcher, see, root, tmp_path):
    """A live launcher's directory, another user's, and a young one without
    an owner file (a launcher between its mkdir and its owner file) stay."""
    live_out, killed_out, next_out = (tmp_path / n for n in ("live", "killed", "next"))
    for out in (live_out, killed_out, next_out):
        out.mkdir()
    live = launcher(see, live_out, "sleep")
    wait_for(lambda: (live_out / "seen.0.0").exists(), 60, "the live job's rank")
    live_tier = Path(seen(live_out, 0, 0)["dir"])
    killed = launcher(see, killed_out, "sleep")
    wait_for(lambda: (killed_out / "seen.0.0").exists(), 60, "the killed job's rank")
    killed_tier = Path(seen(killed_out, 0, 0)["dir"])
    killed.kill()
    killed.communicate(timeout=30)
    assert killed_tier.is_dir() and (killed_tier / "snap.0.0").exists()
    uid = os.geteuid()
    template = seen(live_out, 0, 0)["owner"]
    # pid reuse: the pid runs (this test), but it is not the launcher.
    reused = fake_tier(
        root,
        f"relaunch-snap-{uid}-{os.getpid()}-0000000a",
        {**template, "pid": os.getpid(), "start_time": 1},
    )
    ownerless = fake_tier(root, f"relaunch-snap-{uid}-1-0000000b", None)
    others = fake_tier(root, f"relaunch-snap-{uid + 1}-1-0000000c", {**template, "pid": killed.pid})
    code, _, err = finish(launcher(see, next_out, "done"))
    assert code == 0, err
    assert not killed_tier.exists()
    assert not reused.exists()
    assert live_tier.is_dir() and (live_tier / "snap.0.0").exists()
    assert ownerless.is_dir() and others.is_dir()
    assert alive(live.pid)
    live.send_signal(signal.SIGTERM)
    finish(live, timeout=60)
    assert not live_tier.exists()


def test_a_size_the_root_cannot_hold_refuses_to_start(launcher, see, root, tmp_path):
    code, _, err = finish(launcher("--snapshot-memory", "1000000GiB", see, tmp_path, "done"))
    assert code == 2, err
    assert "--snapshot-memory 1000000.0 GiB (1073741824000000 bytes) is more than the" in err
    assert f"free in {root}: lower --snapshot-memory" in err
    assert "relaunch: run" not in err  # nothing was started
    assert not list(tmp_path.glob("seen.*"))
    assert tiers(root) == []


def test_an_explicit_size_needs_the_root(launcher, see, root, tmp_path):
    missing = root / "missing"
    job = launcher(
        "--snapshot-memory",
        "1MiB",
        see,
        tmp_path,
        "done",
        env={"RELAUNCH_SNAPSHOT_ROOT": str(missing)},
    )
    code, _, err = finish(job)
    assert code == 2, err
    assert f"the snapshot root {missing} does not exist" in err
    assert not list(tmp_path.glob("seen.*"))


def test_zero_turns_the_tier_off(launcher, see, root, tmp_path):
    code, _, err = finish(launcher("--snapshot-memory", "0", see, tmp_path, "done"))
    assert code == 0, err
    view = seen(tmp_path, 0, 0)
    assert view["dir"] is None and view["memory"] is None
    assert "snapshot" not in err
    assert tiers(root) == []


def test_without_a_root_the_default_warns_once_and_runs(launcher, see, root, tmp_path):
    missing = root / "missing"
    job = launcher(see, tmp_path, "done", env={"RELAUNCH_SNAPSHOT_ROOT": str(missing)})
    code, _, err = finish(job)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "memory tier" in line]
    assert len(warnings) == 1 and warnings[0].startswith("relaunch: warning: "), err
    assert str(missing) in warnings[0]
    view = seen(tmp_path, 0, 0)
    assert view["dir"] is None and view["memory"] is None


def test_print_config_says_where_the_size_came_from(launcher, root):
    code, out, err = finish(launcher("--snapshot-memory", "64MiB", "--print-config", "t.py"))
    assert code == 0, err
    assert re.search(
        rf"snapshot_memory\s+64\.0 MiB \(67108864 bytes\) in {re.escape(str(root))}\s+<- flag "
        r"--snapshot-memory",
        out,
    ), out
    code, out, err = finish(launcher("--print-config", "t.py"))
    assert code == 0, err
    assert "<- default (a quarter of memory, at most what" in out, out
