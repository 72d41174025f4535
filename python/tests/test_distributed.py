"""PyTorch's own rendezvous through our store: four processes run
``init_process_group("gloo")`` with the default ``env://`` init and
``TORCHELASTIC_USE_AGENT_STORE=True``, an all_reduce and one DDP step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch

WORLD = 4

WORKER = textwrap.dedent(
    r"""
    import json, os, sys
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()

    t = torch.tensor([float(rank + 1), 10.0 * rank])
    dist.all_reduce(t)

    torch.manual_seed(0)  # the same initial weights on every rank
    model = DDP(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(100 + rank)  # different data per rank
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()

    out = {
        "rank": rank,
        "world": world,
        "all_reduce": t.tolist(),
        "weight": model.module.weight.detach().tolist(),
        "bias": model.module.bias.detach().tolist(),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
    # DDP holds the process group in reference cycles: free it while the
    # interpreter is whole, or gloo may abort during teardown ("terminate
    # called without an active exception"; pytorch/pytorch#179291).
    import gc
    del model, opt, loss
    gc.collect()
    dist.destroy_process_group()
    """
)


def _reference_step() -> tuple[torch.Tensor, torch.Tensor]:
    """One SGD step on the average of the ranks' gradients, in one process."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    grads = []
    for rank in range(WORLD):
        model.zero_grad()
        g = torch.Generator().manual_seed(100 + rank)
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p -= 0.5 * sum(g[i] for g in grads) / WORLD
    return model.weight.detach(), model.bias.detach()


def test_init_process_group_all_reduce_and_ddp_step(store_server, tmp_path):
    procs = []
    for rank in range(WORLD):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(store_server.port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(WORLD),
            TORCHELASTIC_USE_AGENT_STORE="True",
            OMP_NUM_THREADS="1",
        )
        out = tmp_path / f"rank{rank}.json"
        procs.append((subprocess.Popen([sys.executable, "-c", WORKER, str(out)], env=env), out))
    try:
        codes = [p.wait(timeout=240) for p, _ in procs]
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0] * WORLD, "".join(store_server.log)

    results = [json.loads(out.read_text()) for _, out in procs]
    assert sorted(r["rank"] for r in results) == list(range(WORLD))
    for r in results:
        assert r["world"] == WORLD
        assert r["all_reduce"] == [10.0, 60.0]  # sum of rank+1, sum of 10*rank

    weight, bias = _reference_step()
    for r in results:
        assert torch.allclose(torch.tensor(r["weight"]), weight, atol=1e-6), r["rank"]
        assert torch.allclose(torch.tensor(r["bias"]), bias, atol=1e-6), r["rank"]
    # A step really happened: the weights moved from their initial values.
    torch.manual_seed(0)
    assert not torch.allclose(torch.nn.Linear(4, 2).weight, weight)
