"""torch.distributed.autograd's public API: context(), backward(), get_gradients()."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ringtorch.distributed.autograd import context as _context
from ringtorch.distributed.autograd import engine

_SECOND_BACKWARD = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward.")


@contextmanager
def context() -> Iterator[int]:
    """A distributed autograd context; RPCs inside it record the graph across workers.

    Yields the context id; on exit the context is released on every worker it reached.
    """
    container = engine.container()
    ctx = container.new_context()
    previous = _context.current()
    _context.set_current(ctx)
    try:
        yield ctx.context_id
    finally:
        _context.set_current(previous)
        engine.release_everywhere(ctx.context_id)


def _check_roots(roots: list[torch.Tensor]) -> None:
    if not roots:
        raise RuntimeError("No tensors provided for gradient computation.")
    for root in roots:
        if not isinstance(root, torch.Tensor):
            raise TypeError(f"roots must be tensors, got {type(root).__name__}")
        if not root.requires_grad:
            raise RuntimeError("requires_grad not set on root")
        if root.numel() != 1:
            raise RuntimeError(" is not a scalar, all roots need to be scalar")


def backward(context_id: int, roots: list[torch.Tensor], retain_graph: bool = False) -> None:
    """Run the backward pass from ``roots`` through every worker the forward touched.

    Gradients accumulate in the context on each worker (``get_gradients``), never in
    ``.grad``. Returns when the whole pass is done.

    Raises:
        RuntimeError: unknown context, a second backward without ``retain_graph``, roots
        that are not scalars or do not require grad; any error of a remote piece.
    """
    ctx = engine.container().retrieve(context_id)
    roots = list(roots)
    _check_roots(roots)
    with ctx.lock:
        if ctx.backward_done and not ctx.retained:
            raise RuntimeError(_SECOND_BACKWARD)
        ctx.backward_done = True
        ctx.retained = retain_graph
    engine.run_piece(ctx, roots, [torch.ones_like(r) for r in roots])


def get_gradients(context_id: int) -> dict[torch.Tensor, torch.Tensor]:
    """The gradients accumulated in this context on this worker, by tensor.

    Raises:
        RuntimeError: unknown context.
    """
    ctx = engine.container().retrieve(context_id)
    with ctx.lock:
        return {tensor: grad for tensor, grad in ctx.grads.values()}
