"""torch.distributed.autograd's public API: context(), backward(), get_gradients()."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ringtorch.distributed.autograd import engine


@contextmanager
def context() -> Iterator[int]:
    """A distributed autograd context; RPCs inside it record the graph across workers.

    Yields the context id; on exit the context is released on every worker it reached.
    """
    container = engine.container()
    ctx = container.new_context()
    previous = container.current()
    container.set_current(ctx)
    try:
        yield ctx.context_id
    finally:
        container.set_current(previous)
        engine.release_everywhere(ctx.context_id)


def backward(context_id: int, roots: list[torch.Tensor], retain_graph: bool = False) -> None:
    """Run the backward pass from ``roots`` through every worker the forward touched.

    Gradients accumulate in the context on each worker (``get_gradients``), never in
    ``.grad``. Returns when the whole pass is done.

    Raises:
        RuntimeError: unknown context, a second backward without ``retain_graph``, roots
        that are not scalars or do not require grad; any error of a remote piece.
    """
    engine.backward(context_id, roots, retain_graph)


def get_gradients(context_id: int) -> dict[torch.Tensor, torch.Tensor]:
    """The gradients accumulated in this context on this worker, by tensor.

    Raises:
        RuntimeError: unknown context.
    """
    ctx = engine.container().retrieve(context_id)
    with ctx.lock:
        return {tensor: grad for tensor, grad in ctx.grads.values()}
