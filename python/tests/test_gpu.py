"""What only a GPU can show: NCCL through our store, GPU system metrics
through NVML, `save_async` of CUDA tensors, and `doctor` and
`--nproc-per-node gpu` on a node with a GPU.

These skip on a machine without a CUDA GPU (CI has none). They were run on
a lent GPU machine (docs/install.md, "Tested on a GPU").
"""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_launch_tracking import get, launch, script, series  # noqa: F401 (launch: a fixture)
from test_resume import RESUME, finish, losses, preempt
from test_resume import launch as launch_job

import relaunch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs an NVIDIA GPU with CUDA (torch.cuda.is_available() is False here)",
)

RELAUNCH = [sys.executable, "-m", "relaunch"]
GIB = 1 << 30

NCCL_WORKER = """
    import datetime, json, os, sys
    import torch
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    # No device_id: NCCL makes its communicator at the first collective,
    # after rank 0 has put its unique id in the store, so the store's key
    # count shows that the id went through the launcher's store.
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=120))
    store = dist.distributed_c10d._get_default_store()
    keys_before = store.num_keys()
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((1 << 20,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    keys_after = store.num_keys()
    gathered = torch.empty(world, device="cuda")
    dist.all_gather_into_tensor(gathered, torch.tensor([float(rank)], device="cuda"))
    b = torch.arange(4.0, device="cuda") if rank == 0 else torch.zeros(4, device="cuda")
    dist.broadcast(b, 0)
    dist.barrier()
    out = {
        "backend": dist.get_backend(),
        "world": world,
        "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
        "keys_before": keys_before,
        "keys_after": keys_after,
        "sum": t[0].item(),
        "sum_everywhere": bool((t == t[0]).all().item()),
        "gathered": gathered.tolist(),
        "broadcast": b.tolist(),
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "gpu": torch.cuda.get_device_name(),
    }
    dist.destroy_process_group()
    with open(sys.argv[1] + f".{rank}", "w") as f:
        json.dump(out, f)
"""


def test_nccl_init_process_group_through_the_launchers_store(tmp_path: Path) -> None:
    """`relaunch run --nproc-per-node gpu`: one worker per visible GPU (as
    torchrun), each doing `init_process_group("nccl")` from the environment
    the launcher gives it, so NCCL's unique id goes through relaunch's
    TCPStore-compatible store; then NCCL collectives on the GPU."""
    worker = script(tmp_path, "nccl_worker.py", NCCL_WORKER)
    out = tmp_path / "result"
    proc = subprocess.run(
        [*RELAUNCH, "run", "--nproc-per-node", "gpu", str(worker), str(out)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    world = torch.cuda.device_count()
    results = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
    for r in results:
        assert r["backend"] == "nccl" and r["world"] == world, r
        assert r["agent_store"] == "True", r  # the launcher's store, not one of torch's own
        assert r["keys_after"] > r["keys_before"], r  # NCCL's unique id went through it
        assert r["sum"] == world * (world + 1) / 2 and r["sum_everywhere"], r
        assert r["gathered"] == [float(i) for i in range(world)], r
        assert r["broadcast"] == [0.0, 1.0, 2.0, 3.0], r
    print(f"NCCL {results[0]['nccl']} on {world} x {results[0]['gpu']}")


GPU_LOAD = """
    import time
    import relaunch
    import torch

    run = relaunch.init()
    held = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")  # 3 GiB held
    a = torch.randn(8192, 8192, device="cuda")
    step, until = 0, time.monotonic() + 6
    while time.monotonic() < until:
        for _ in range(20):
            a = torch.tanh(a @ a)
        torch.cuda.synchronize()
        run.log({"busy": float(a[0, 0].item())}, step=step)
        step += 1
    run.finish()
"""


def test_gpu_metrics_reach_the_run(tracking_server, launch, tmp_path: Path) -> None:  # noqa: F811
    """The launcher samples the node's GPUs through NVML next to CPU and
    memory: while a worker holds 3 GiB and multiplies matrices, the run
    gets each GPU's utilization, memory, temperature and power."""
    train = script(tmp_path, "gpu_load.py", GPU_LOAD)
    proc = launch(
        "--server", tracking_server.url, "--run-id", "gpu-metrics", "--nproc-per-node", "1",
        "--system-metrics-interval", "0.2", train,
    )  # fmt: skip
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    keys = get(tracking_server, "/runs/gpu-metrics/keys")
    assert isinstance(keys, list)
    for i in range(torch.cuda.device_count()):
        names = ("utilization_percent", "memory_used_bytes", "memory_percent",
                 "temperature_c", "power_watts")  # fmt: skip
        assert all(f"gpu/{i}/{n}" in keys for n in names), keys

    def values(key: str) -> list[float]:
        points = series(tracking_server, "gpu-metrics", key)
        assert points, key
        return [p["value"] for p in points]

    # NVML's index 0 is CUDA's device 0 on a one-GPU machine.
    assert max(values("gpu/0/memory_used_bytes")) >= 3 * GIB
    assert 0 < max(values("gpu/0/memory_percent")) <= 100
    assert max(values("gpu/0/utilization_percent")) >= 50
    assert all(0 <= u <= 100 for u in values("gpu/0/utilization_percent"))
    assert all(5 <= t <= 110 for t in values("gpu/0/temperature_c"))
    assert max(values("gpu/0/power_watts")) > 50  # a datacenter GPU at work draws far more


def cpu_copy(obj: object) -> object:
    """A deep copy of `obj` with every tensor on the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_copy(v) for v in obj)
    return copy.deepcopy(obj)


def assert_same(a: object, b: object, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.cpu(), b.cpu()), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}/{i}")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def test_save_async_of_cuda_state_is_the_state_at_the_call(tmp_path: Path) -> None:
    """`save_async` of a model and optimizer on the GPU: each call copies
    the tensors into pinned CPU buffers behind the work already queued on
    the GPU, and the background write must see the copies finished. Seconds
    of matrix products are queued before each call, and training steps
    change every tensor in place right after it; each checkpoint still holds
    exactly the state at its call, and a resume onto the GPU continues
    bitwise like the uninterrupted run."""
    torch.manual_seed(0)

    def make() -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
        ).cuda()

    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device="cuda")
    heavy = torch.randn(8192, 8192, device="cuda")

    def train_step(m: torch.nn.Module, o: torch.optim.Optimizer) -> None:
        m(x).square().mean().backward()
        o.step()
        o.zero_grad(set_to_none=True)

    train_step(model, opt)
    ckpt = relaunch.Checkpointer(tmp_path / "ckpt", keep_last=None)
    expected = {}
    for step in (1, 2, 3):
        train_step(model, opt)
        state = {"model": model.state_dict(), "optim": opt.state_dict()}
        expected[step] = cpu_copy(state)
        # Work queued ahead of the copies (same stream), ~1 s of it.
        for _ in range(40):
            heavy = torch.tanh(heavy @ heavy)
        assert ckpt.save_async(state, step)
        for p in model.parameters():
            p.data.add_(1.0)  # the loop changes the tensors at once
        train_step(model, opt)
    ckpt.wait()
    # Every GPU tensor went through a pinned buffer (AdamW's `step` counts
    # live on the CPU and need none).
    moments = [t for st in opt.state.values() for t in st.values() if torch.is_tensor(t)]
    on_gpu = [t for t in [*model.state_dict().values(), *moments] if t.is_cuda]
    assert sum(b.is_pinned() for b in ckpt._stager.buffers) == len(on_gpu) == 12
    for step in (1, 2, 3):
        saved = torch.load(tmp_path / "ckpt" / f"step_{step:08d}" / "model.pt")
        assert_same(expected[step], saved, f"step {step}")

    # Resume from step 3 on the GPU: what the run did after that save, done
    # again from the checkpoint, gives bitwise the same model and optimizer.
    resumed = make()
    resumed_opt = torch.optim.AdamW(resumed.parameters(), lr=1e-3)
    state = relaunch.Checkpointer(tmp_path / "ckpt").load(map_location="cuda", verify="full")
    resumed.load_state_dict(state["model"])
    resumed_opt.load_state_dict(state["optim"])
    for p in resumed.parameters():
        p.data.add_(1.0)
    train_step(resumed, resumed_opt)
    assert_same(cpu_copy(model.state_dict()), cpu_copy(resumed.state_dict()), "model")
    assert_same(cpu_copy(opt.state_dict()), cpu_copy(resumed_opt.state_dict()), "optim")
    ckpt.close()


def test_doctor_and_print_config_see_the_gpus(tmp_path: Path) -> None:
    """`relaunch doctor` names the GPUs and the driver; `--nproc-per-node
    gpu` resolves to the number of visible GPUs, as torchrun's does."""
    out = subprocess.run([*RELAUNCH, "doctor", "--format", "json"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    findings = json.loads(out.stdout)
    (gpus,) = [f for f in findings if f["check"] == "GPUs"]
    assert gpus["level"] == "ok", gpus
    assert f"{torch.cuda.device_count()} device(s)" in gpus["found"], gpus
    assert "NVRM version" in gpus["found"], gpus  # /proc/driver/nvidia/version
    config = subprocess.run(
        [*RELAUNCH, "run", "--nproc-per-node", "gpu", "--print-config", "x.py"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert config.returncode == 0, config.stderr
    line = next(ln for ln in config.stdout.splitlines() if "nproc_per_node" in ln)
    assert line.split()[1] == str(torch.cuda.device_count()), config.stdout


def test_a_preempted_gpu_job_resumes_bitwise(tmp_path: Path) -> None:
    """examples/resume.py on the GPUs (NCCL, `--device auto`) under
    `relaunch run --nproc-per-node gpu`: SIGTERM mid-epoch stops every rank
    at one step with its checkpoint committed (exit 75), and the relaunched
    job's losses and final parameters equal an uninterrupted run's, bit for
    bit."""
    train = ["--epochs", "2", "--samples", "384", "--batch-size", "8", "--ckpt-every", "10"]
    steps = 2 * 384 // (8 * torch.cuda.device_count())
    reference, ref_params = tmp_path / "reference.txt", tmp_path / "reference.pt"
    code, log = finish(launch_job(RESUME, "--ckpt-dir", tmp_path / "ref-ckpt", "--losses",
                                  reference, "--params", ref_params, *train, cwd=tmp_path,
                                  nproc="gpu"))  # fmt: skip
    assert code == 0, log
    assert "on cuda:0" in log, log  # it trained on the GPU
    expected = losses(reference)
    assert [s for s, _ in expected] == list(range(steps))

    trajectory, params, ckpt_dir = tmp_path / "t.txt", tmp_path / "params.pt", tmp_path / "ckpt"
    job = (RESUME, "--ckpt-dir", ckpt_dir, "--losses", trajectory, "--params", params, *train)
    proc = launch_job(*job, "--step-time", "0.05", cwd=tmp_path, nproc="gpu")
    stop, _ = preempt(proc, trajectory)
    latest = relaunch.Checkpointer(ckpt_dir).latest(verify="full")
    assert latest is not None and latest.step == stop
    code, log = finish(launch_job(*job, cwd=tmp_path, nproc="gpu"))
    assert code == 0, log
    assert f"starting at step {stop + 1}" in log and "on cuda:0" in log, log
    assert losses(trajectory) == expected
    mine, theirs = torch.load(params), torch.load(ref_params)
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine), "final parameters differ"


NCCL_THEN_STUCK = """
    import datetime, os, time
    import torch
    import torch.distributed as dist
    import relaunch

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=600))
    t = torch.ones(1 << 16, device="cuda")
    for step in range(5):
        dist.all_reduce(t)
        torch.cuda.synchronize()
        relaunch.heartbeat(step)
    time.sleep(3600)  # stuck, as a rank waiting on a dead peer would be
"""


def test_a_hung_nccl_job_reports_the_flight_recorders_dump(tmp_path: Path) -> None:
    """On a hang, the report asks each rank's NCCL flight recorder for a
    dump through the pipe `relaunch run` pointed torch at, and lists it
    beside the rank's stack: the dump holds the collectives the rank ran."""
    worker = script(tmp_path, "nccl_stuck.py", NCCL_THEN_STUCK)
    logs = tmp_path / "logs"
    proc = subprocess.run(
        [*RELAUNCH, "run", "--nproc-per-node", "gpu", "--hang-timeout", "3", "--max-restarts",
         "0", "--log-dir", str(logs), str(worker)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    (report_file,) = logs.glob("*/attempt_0/hang.json")
    report = json.loads(report_file.read_text())
    rank0 = next(r for r in report["ranks"] if r["rank"] == 0)
    assert rank0["last_step"] == 4, rank0
    (trace,) = rank0["nccl_traces"]
    dump = pickle.loads(Path(trace).read_bytes())
    names = [e.get("profiling_name") for e in dump["entries"]]
    assert names.count("nccl:all_reduce") >= 5, names
    assert "1 NCCL flight recorder dump(s) beside it" in proc.stdout + proc.stderr, proc.stderr
