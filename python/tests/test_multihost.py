"""`relaunch run` on several hosts with real addresses: each host is a
network namespace (``netns.py``), one launcher per host, real PyTorch
(gloo) workers talking across the namespaces' bridge, and links cut the way
a cable or a switch port fails: silently, nothing reset.

The worker (``workers/multihost_train.py``) records every step it completes
(host, the step its attempt resumed from, rank, world size); the tests
assert on those records and on exit codes, never on timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import netns
import pytest
import torch
from conftest import wait_for

HERE = Path(__file__).resolve().parent
WORKER = HERE / "workers" / "multihost_train.py"
RELAUNCH = [sys.executable, "-m", "relaunch"]
STORE_PORT = 29400
MASTER_PORT = 29500
# Fast failure detection, so that a test takes seconds: heartbeats every
# 0.2 s, a node silent for 3 s is lost, a round closes 1 s after MIN joined.
RDZV_CONF = "last_call_timeout=1,keep_alive_timeout=3"
ELASTIC = (
    "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--monitor-interval", "0.2",
    "--max-restarts", "3",
)  # fmt: skip


def host_env(host: netns.Host) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RELAUNCH_", "TORCHELASTIC_", "PET_", "MASTER_"))
    }
    # gloo would otherwise pick an address from the hostname, which every
    # namespace shares.
    env.update(MH_HOST=host.name, GLOO_SOCKET_IFNAME=netns.IFACE, OMP_NUM_THREADS="1")
    return env


class Launcher:
    """`relaunch ARGS` inside ``host``, its output in files under ``logs``."""

    def __init__(self, host: netns.Host, logs: Path, *args: object) -> None:
        self.host = host
        logs.mkdir(parents=True, exist_ok=True)
        self.out = logs / f"{host.name}.out"
        self.err = logs / f"{host.name}.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = host.popen(
                [*RELAUNCH, *map(str, args)],
                env=host_env(host),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )

    def wait(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout)

    @property
    def stderr(self) -> str:
        return self.err.read_text()


def steps(out: Path) -> list[dict]:
    """Every step record the workers wrote."""
    records = []
    for path in sorted(out.glob("steps.*.jsonl")):
        for line in path.read_text().splitlines():
            if line.endswith("}"):  # a line still being written is skipped
                record = json.loads(line)
                if "start" in record:  # not a {"stopped": ...} line
                    records.append(record)
    return records


def rounds(out: Path) -> list[tuple[int, frozenset[str]]]:
    """The attempts (rounds) that completed a step, in order: each one's
    world size and the hosts whose workers completed a step in it. Every
    rank of one attempt resumed from the same checkpoint, and each attempt
    from a later one than the last, so the step it started at names it."""
    worlds: dict[int, set[int]] = defaultdict(set)
    members: dict[int, set[str]] = defaultdict(set)
    for r in steps(out):
        worlds[r["start"]].add(r["world"])
        members[r["start"]].add(r["host"])
    for start, w in worlds.items():
        assert len(w) == 1, f"the attempt that started at step {start} saw world sizes {w}"
    return [(next(iter(worlds[s])), frozenset(members[s])) for s in sorted(worlds)]


def report(launchers: list[Launcher]) -> str:
    return "\n".join(
        f"--- {la.host.name} (exit {la.proc.poll()}):\n{la.stderr}" for la in launchers
    )


def elastic_job(
    hosts: list,
    tmp_path: Path,
    endpoint: str,
    rdzv_id: str,
    *worker_args: object,
    rdzv_conf: str = RDZV_CONF,
    grace: float = 3,
) -> tuple[Path, list[Launcher]]:
    """An elastic job (``--nnodes 2:3``) of WORKER, one launcher per host,
    its ranks writing to ``tmp_path/out``, with a grace period of ``grace``
    seconds (``--shutdown-timeout``): that folder and the launchers."""
    out = tmp_path / "out"
    out.mkdir()
    launchers = [
        Launcher(
            h, tmp_path / "logs", "run", "--nnodes", "2:3", "--rdzv-endpoint", endpoint,
            "--rdzv-id", rdzv_id, "--rdzv-conf", rdzv_conf, *ELASTIC,
            "--shutdown-timeout", grace,
            WORKER, out, "--step-time", "0.05", "--timeout", "30", *worker_args,
        )
        for h in hosts
    ]  # fmt: skip
    return out, launchers


def trained(out: Path, host: str, world: int) -> bool:
    """Whether `host` has trained a step in a world of `world`."""
    return any(r["host"] == host and r["world"] == world for r in steps(out))


def wait_three_training(out: Path, host: str) -> None:
    wait_for(lambda: trained(out, host, 3), 120, "three hosts training")


def test_a_static_job_on_three_hosts_equals_one_host(hosts, tmp_path):
    """Three launchers, one rank each, across real addresses: the parameters
    are bitwise those of three ranks on one host (same world, same data)."""
    train = [WORKER, tmp_path / "three", "--steps", "8"]
    (tmp_path / "three").mkdir()
    launchers = [
        Launcher(
            h, tmp_path / "logs3", "run", "--nnodes", "3", "--node-rank", h.index,
            "--master-addr", hosts[0].addr, "--master-port", MASTER_PORT,
            "--nproc-per-node", "1", "--run-id", "static3", *train,
        )
        for h in hosts
    ]  # fmt: skip
    codes = [la.wait() for la in launchers]
    assert codes == [0, 0, 0], report(launchers)
    assert {(r["host"], r["rank"], r["world"]) for r in steps(tmp_path / "three")} == {
        ("h0", 0, 3),
        ("h1", 1, 3),
        ("h2", 2, 3),
    }

    (tmp_path / "one").mkdir()
    one = Launcher(
        hosts[0], tmp_path / "logs1", "run", "--nproc-per-node", "3", "--run-id", "static1",
        WORKER, tmp_path / "one", "--steps", "8",
    )  # fmt: skip
    assert one.wait() == 0, report([one])

    three = torch.load(tmp_path / "three" / "final.pt", weights_only=True)
    single = torch.load(tmp_path / "one" / "final.pt", weights_only=True)
    assert three["step"] == single["step"] == 7 and three["world"] == single["world"] == 3
    for name, value in single["params"].items():
        assert torch.equal(three["params"][name], value), name
    torch.manual_seed(0)  # the weights moved: a test that compares something
    assert not torch.equal(torch.nn.Linear(16, 4).weight, single["params"]["weight"])


def test_elastic_survivors_go_on_when_a_host_is_cut_and_it_is_readmitted(hosts, tmp_path):
    """``--nnodes 2:3``; host 2's link goes down mid-run. The two others
    leave it out and train on; when its link is back, its launcher rejoins
    and the job ends in a world of three, every launcher exiting 0. Every
    round is an attempt of its own (``RELAUNCH_ATTEMPT``, the number the
    tracking run gives it), though only the round without host 2 is a
    restart (``TORCHELASTIC_RESTART_COUNT``, torchrun's count)."""
    endpoint = f"{hosts[0].addr}:{STORE_PORT}"
    # Not done before a step in a world of 3 again: the cut host must be
    # readmitted for the job to end (else step 2000).
    out, launchers = elastic_job(
        hosts, tmp_path, endpoint, "cut", "--steps", "40", "--min-world", "3", "--max-steps", "2000"
    )
    wait_three_training(out, "h2")
    hosts[2].cut()
    wait_for(
        lambda: any(r["world"] == 2 for r in steps(out)),
        120,
        "the two survivors training again",
    )
    hosts[2].restore()
    codes = [la.wait(timeout=150) for la in launchers]
    assert codes == [0, 0, 0], report(launchers)

    # Three hosts, then the two survivors (in one round, or more if their
    # round of two restarted before the cut host came back), then three.
    seen = rounds(out)
    phases = [r for i, r in enumerate(seen) if i == 0 or seen[i - 1] != r]
    assert phases == [(3, {"h0", "h1", "h2"}), (2, {"h0", "h1"}), (3, {"h0", "h1", "h2"})], seen
    final = torch.load(out / "final.pt", weights_only=True)
    assert final["world"] == 3 and final["step"] >= 39, final["step"]  # steps 0..39 at least

    # One RELAUNCH_ATTEMPT per attempt, growing from one to the next.
    ids: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for r in steps(out):
        ids[r["start"]].add((r["attempt"], r["restarts"]))
    per_attempt = [ids[start] for start in sorted(ids)]
    assert all(len(seen) == 1 for seen in per_attempt), per_attempt
    attempts = [next(iter(seen)) for seen in per_attempt]
    numbers = [attempt for attempt, _ in attempts]
    assert numbers == sorted(set(numbers)) and numbers[0] == 0, attempts
    # Losing host 2 is a restart; readmitting it is not.
    assert attempts[0][1] == 0 and attempts[-1][1] == attempts[-2][1] >= 1, attempts


@pytest.mark.hosts(4)
def test_a_standalone_store_outlives_node_0(hosts, tmp_path):
    """The store on a host of its own (``relaunch store serve``): cutting
    node 0's host off leaves the other two training to the end. (With the
    store in node 0's launcher, the job would lose its store with it.)"""
    store_host, nodes = hosts[3], list(hosts)[:3]
    store_log = tmp_path / "store.err"
    with store_log.open("w") as err:
        store = store_host.popen(
            [*RELAUNCH, "store", "serve", "--host", store_host.addr, "--port", STORE_PORT],
            env=host_env(store_host),
            stdin=subprocess.DEVNULL,
            stderr=err,
        )
    wait_for(lambda: "listening on" in store_log.read_text(), 60, "the store to listen")
    endpoint = f"{store_host.addr}:{STORE_PORT}"
    out, launchers = elastic_job(nodes, tmp_path, endpoint, "standalone", "--steps", "60")
    wait_three_training(out, "h0")
    hosts[0].cut()
    codes = [la.wait(timeout=150) for la in launchers[1:]]
    assert codes == [0, 0], report(launchers)
    assert rounds(out) == [(3, {"h0", "h1", "h2"}), (2, {"h1", "h2"})], rounds(out)
    final = torch.load(out / "final.pt", weights_only=True)
    assert final["world"] == 2 and final["step"] == 59
    # The store never noticed anything but a node gone quiet.
    assert store.poll() is None


def test_a_store_lost_with_node_0_ends_the_job_with_a_clear_message(hosts, tmp_path):
    """The store hosted by node 0's launcher (the first on the endpoint's
    host); node 0's host is cut off. The others cannot go on without their
    store: they stop their workers and exit non-zero, saying which store is
    unreachable and how to have one that outlives any node, once they gave
    the store ``--rdzv-conf read_timeout`` (60 s by default, 15 s here) to
    answer again, instead of waiting out the store client's own timeout (10
    minutes)."""
    endpoint = f"{hosts[0].addr}:{STORE_PORT}"
    out, launchers = elastic_job(
        *(hosts, tmp_path, endpoint, "lost-store", "--steps", "100000"),
        rdzv_conf=f"{RDZV_CONF},read_timeout=15",
    )
    wait_three_training(out, "h2")
    hosts[0].cut()
    codes = [la.wait(timeout=180) for la in launchers[1:]]
    assert all(code not in (0, None) for code in codes), report(launchers)
    for la in launchers[1:]:
        assert f"store at {endpoint} is unreachable" in la.stderr, report(launchers)
        assert "relaunch store serve" in la.stderr, report(launchers)
        # Its workers were stopped, not left behind.
        assert not la.host.pids(), report(launchers)


def unsent_to(host: netns.Host, peer: str) -> int:
    """Bytes that ``host``'s sockets to ``peer`` (HOST:PORT) still hold
    unacknowledged (``ss``'s Send-Q), closed sockets included."""
    listing = host.run(
        ["ss", "-tnH", "state", "all", "dst", peer], capture_output=True, text=True, check=True
    ).stdout
    return sum(int(line.split()[2]) for line in listing.splitlines() if line.strip())


def test_a_host_back_from_a_cut_does_not_fail_the_survivors_attempt(hosts, tmp_path):
    """Host 2's worker fails while host 2 is cut off, so its launcher's
    notice of the failure (the key ``relaunch.preemption`` and the
    Checkpointer read) goes into a link that delivers nothing; hosts 0 and 1
    go on without host 2. When the link is back, TCP delivers what host 2
    had queued, late, into the survivors' attempt: that must not mark their
    attempt failed. A stop request then ends their ranks cleanly at one
    agreed step (both launchers exit 75), not as failed ranks."""
    import signal as _signal

    endpoint = f"{hosts[0].addr}:{STORE_PORT}"
    out, launchers = elastic_job(
        hosts,
        tmp_path,
        endpoint,
        "late-failure",
        "--steps",
        "100000",
        "--preemption",
        "--fail-file",
        # The stop at the end: the ranks' clean exit (a barrier, the process
        # group's teardown) can take over 3 s on a loaded machine.
        grace=15,
    )
    wait_three_training(out, "h2")
    hosts[2].cut()
    (out / "fail.h2").touch()
    wait_for(lambda: any(r["world"] == 2 for r in steps(out)), 120, "the two survivors training")
    # Host 2 stays out (frozen, so it does not rejoin), but its kernel still
    # sends what its launcher queued before.
    for pid in hosts[2].pids():
        os.kill(pid, _signal.SIGSTOP)
    hosts[2].restore()
    wait_for(lambda: unsent_to(hosts[2], endpoint) == 0, 180, "host 2's queued bytes delivered")
    trained = len(steps(out))
    wait_for(lambda: len(steps(out)) > trained + 4, 60, "the survivors training on")
    launchers[0].proc.send_signal(_signal.SIGTERM)
    codes = [la.wait(timeout=120) for la in launchers[:2]]
    assert codes == [75, 75], report(launchers[:2])
    for la in launchers[:2]:
        assert "after a failure in this attempt" not in la.stderr + la.out.read_text()
    stops = [
        json.loads(line)
        for p in out.glob("steps.h[01].*")
        for line in p.read_text().splitlines()
        if "stopped" in line
    ]
    assert len(stops) == 2 and len({s["stopped"] for s in stops}) == 1, stops


HANG_WORKER = HERE / "workers" / "hang_collective.py"


def test_a_frozen_host_is_found_by_the_others_from_their_beats_and_named(hosts, tmp_path):
    """A static job of three hosts; every process of host 2 (its launcher,
    its rank, its DataLoader worker) is SIGSTOPped mid-run, as a host whose
    kernel stalls. The ranks of hosts 0 and 1 wait for it in all_reduce,
    stop beating, and their launchers find the hang: each writes its ranks'
    stacks, and the report says that one other node never answered. Once
    host 2 runs again, the job restarts and finishes."""
    import signal as _signal

    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    # The hang timeout outlasts a rank's exit after its last beat (the spawn
    # DataLoader worker's shutdown, a few seconds under load).
    launchers = [
        Launcher(
            h, logs, "run", "--nnodes", "3", "--node-rank", h.index,
            "--master-addr", hosts[0].addr, "--master-port", MASTER_PORT,
            "--nproc-per-node", "1", "--run-id", "frozen", "--hang-timeout", "10",
            "--max-restarts", "1", "--shutdown-timeout", "3", "--log-dir", logs,
            HANG_WORKER, out, "--stuck-step", "99999", "--steps", "600", "--step-sleep", "0.05",
        )
        for h in hosts
    ]  # fmt: skip
    wait_for(
        lambda: all((out / f"beaten.0.{r}").exists() for r in range(3)), 120, "every rank to beat"
    )
    frozen = hosts[2].pids()
    assert frozen
    for pid in frozen:
        os.kill(pid, _signal.SIGSTOP)
    try:
        wait_for(
            lambda: any(
                "did not take their ranks' stacks" in la.stderr + la.out.read_text()
                for la in launchers[:2]
            ),
            90,
            "a hang report that names a silent node",
        )
    finally:
        for pid in frozen:
            try:
                os.kill(pid, _signal.SIGCONT)
            except ProcessLookupError:
                pass
    codes = [la.wait(180) for la in launchers]
    assert codes == [0, 0, 0], report(launchers)
    assert (out / "done.1").exists()
    reports = [json.loads(p.read_text()) for p in logs.glob("frozen_*/attempt_0/hang.json")]
    by_node = {r["node_rank"]: r for r in reports}
    assert {0, 1} <= set(by_node), reports
    assert [r["silent_nodes"] for r in reports].count(1) == 1, reports
    for node in (0, 1):
        (rank,) = by_node[node]["ranks"]
        assert rank["rank"] == node and "all_reduce" in rank["where"], rank
