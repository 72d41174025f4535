"""Exact resume of ``DistributedDataParallel`` on more than two ranks.

DDP groups gradients into buckets for its all-reduces. A new process starts
with the buckets laid out in the reverse order of the parameters, and after
its first backward pass rebuilds them in the order the gradients became
ready. gloo's all-reduce over more than two ranks sums an element in an
order that depends on where it sits in its bucket, so the first step of a
resumed process (the construction-time layout) sums differently from the
same step of the uninterrupted run (the rebuilt one), and the parameters
drift in their last bits from then on. (Two ranks are exact: ``a + b``
equals ``b + a``.)

:func:`rebuild_buckets` runs one forward and backward pass that changes
nothing (no optimizer step; gradients, the RNG states and the module's
buffers put back as they were) so that DDP rebuilds its buckets before the
first real step. Call it once after a resume, before training::

    resume = ckpt.latest()
    if resume is not None:
        ...  # load the model, optimizer and sampler state
        relaunch.ddp.rebuild_buckets(model, next(iter(loader))[0])

It costs one forward and backward pass at start, instead of the pass over
the autograd graph that ``find_unused_parameters=True`` (the other way to
keep one layout: DDP never rebuilds then) costs at every step.
"""

from __future__ import annotations

from typing import Any

__all__ = ["rebuild_buckets"]


def rebuild_buckets(model: Any, *inputs: Any, **kwargs: Any) -> None:
    """Makes ``model`` (a ``DistributedDataParallel``) rebuild its gradient
    buckets now, from one forward and backward pass on ``inputs`` (a batch as
    the training loop feeds it), leaving no trace: gradients, RNG states
    (CPU and CUDA) and buffers (batch-norm statistics) are restored. Every
    rank must call it (the backward pass all-reduces)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        raise TypeError(
            f"rebuild_buckets takes the DistributedDataParallel model, not {type(model).__name__}"
        )
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
    buffers = [b.detach().clone() for b in model.buffers()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        out = model(*inputs, **kwargs)
        total = sum(t.float().sum() for t in _tensors(out) if t.requires_grad)
        if not isinstance(total, torch.Tensor):
            raise ValueError(
                "rebuild_buckets: the model's output holds no tensor that needs a gradient"
            )
        # A zero loss: the gradients' values do not matter, their order does.
        (total * 0).backward()
    finally:
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.grad = g
            for b, saved in zip(model.buffers(), buffers, strict=True):
                b.copy_(saved)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    # DDP rebuilds its buckets at the start of the forward pass that follows
    # the first backward; that is now the first real step's.


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return (
        [t for v in vars(value).values() for t in _tensors(v)] if hasattr(value, "__dict__") else []
    )
