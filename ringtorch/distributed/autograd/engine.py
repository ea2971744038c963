"""The distributed backward pass: local pieces of the graph, joined by RPC.

Each worker runs ``torch.autograd.grad`` on its own piece of the graph, from the roots (on the
root worker) or from the tensors it once sent (when their gradients come back), to the leaves
the piece reaches: parameter leaves accumulate in the context, never in ``.grad`` (except that
a piece whose leaves have post-accumulate-grad hooks, DDP's, lends them ``.grad`` while it
runs: ``_grads_through_hooks``); leaves that were received over RPC have their gradient sent
back to the worker that sent them, which runs its own piece and so on (torch's FAST mode).
Guarantee: a BACKWARD request is answered only when every piece it triggered, on every
worker, is done, so ``backward`` on the root returns when the whole pass is over (and raises
the first error of any piece).
"""

from __future__ import annotations

from typing import Any

import torch

from ringtorch.distributed.autograd.context import Container, DistAutogradContext
from ringtorch.distributed.rpc.extensions import (
    Agent,
    Handler,
    WorkerInfo,
    current_agent,
    register_handler,
)
from ringtorch.futures import Future

BACKWARD = 32   # (context_id, [(message_id, tensor index, grad)]): run the sender's piece
RELEASE = 33    # one-way, [context_id]: drop the contexts here and on the workers they knew

_SECOND_BACKWARD = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward.")


def attach(agent: Agent) -> Container:
    """The RPC extension's attach function (rpc.extensions): a fresh container for ``agent``,
    which keeps it as its autograd hook for the rest of its life."""
    container = Container(agent, backward)
    agent.every_tick(lambda now: flush_releases(container))
    return container


def container() -> Container:
    """This worker's context container (attached to its RPC agent on first use).

    Raises:
        RuntimeError: RPC is not initialized.
    """
    hook = current_agent().context_hook()
    assert isinstance(hook, Container), f"the RPC agent's autograd hook is a {type(hook)}"
    return hook


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
    """``dist_autograd.backward`` (see api.py): check, then run the root's piece."""
    ctx = container().retrieve(context_id)
    roots = list(roots)
    _check_roots(roots)
    with ctx.lock:
        if ctx.backward_done and not ctx.retained:
            raise RuntimeError(_SECOND_BACKWARD)
        ctx.backward_done = True
        ctx.retained = retain_graph
    run_piece(ctx, roots, [torch.ones_like(r) for r in roots])


def _leaves(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The leaves requiring grad that the graph of ``outputs`` reaches (each once)."""
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    stack = []
    for out in outputs:
        if out.grad_fn is None:
            found[id(out)] = out
        else:
            stack.append(out.grad_fn)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None:
            found[id(variable)] = variable
            continue
        for child, _ in node.next_functions:
            if child is not None and id(child) not in seen:
                stack.append(child)
    return list(found.values())


def run_piece(ctx: DistAutogradContext, outputs: list[torch.Tensor],
              grads: list[torch.Tensor] | None) -> None:
    """Backward through this worker's graph from ``outputs``; forward to the senders."""
    inputs = _leaves(outputs)
    if not inputs:
        return
    if any(_post_accumulate_hooks(t) for t in inputs):
        results = _grads_through_hooks(outputs, inputs, grads)
    else:
        results = torch.autograd.grad(outputs, inputs, grads, retain_graph=True,
                                      allow_unused=True)
    onward: dict[int, list[tuple[int, int, torch.Tensor]]] = {}
    for tensor, grad in zip(inputs, results, strict=True):
        if grad is None:
            continue
        origin = ctx.recvs.get(id(tensor))
        if origin is None:
            ctx.accumulate(tensor, grad)
        else:
            onward.setdefault(origin[0], []).append((origin[1], origin[2], grad))
    _propagate(ctx, onward)


def _post_accumulate_hooks(tensor: torch.Tensor) -> bool:
    return bool(getattr(tensor, "_post_accumulate_grad_hooks", None))


def _grads_through_hooks(outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                         grads: list[torch.Tensor] | None) -> list[torch.Tensor | None]:
    """The leaves' gradients of a piece where some leaf has post-accumulate-grad hooks (DDP's
    reducer registers them): as torch's engine runs an AccumulateGrad's hooks with the
    gradient it captures for the context, this backward lets them run and see, and change,
    the piece's gradient in ``.grad`` (DDP averages it there, across its group, before the
    backward returns). ``.grad`` is put back as it was afterwards: what the context gets is
    what the hooks left. Leaves with such hooks are used by one backward at a time (DDP's
    rule), so borrowing their ``.grad`` is safe; pieces without them never touch ``.grad``.
    """
    saved = [t.grad for t in inputs]
    for t in inputs:
        t.grad = None
    try:
        torch.autograd.backward(outputs, grads, retain_graph=True, inputs=inputs)
        results = [t.grad for t in inputs]
    finally:
        for t, grad in zip(inputs, saved, strict=True):
            t.grad = grad
    # a gradient DDP left as a view of its bucket would change with the next iteration
    return [g.clone() if g is not None and g._base is not None else g for g in results]


def _propagate(ctx: DistAutogradContext,
               onward: dict[int, list[tuple[int, int, torch.Tensor]]]) -> None:
    if not onward:
        return
    agent = current_agent()
    hooks = container()
    previous = hooks.current()
    hooks.set_current(None)  # engine messages are not part of the recorded graph
    pendings = []
    try:
        if len(onward) == 1:  # the common case: wait on the reply ourselves, no hand-off
            ((worker_id, entries),) = onward.items()
            agent.request(agent.worker(worker_id), BACKWARD, (ctx.context_id, entries), 0,
                          "distributed autograd backward", sync=True)
            return
        for worker_id, entries in onward.items():
            future: Future[Any] = Future()
            agent.request(agent.worker(worker_id), BACKWARD, (ctx.context_id, entries), 0,
                          "distributed autograd backward", future=future)
            pendings.append(future)
    finally:
        hooks.set_current(previous)
    for future in pendings:
        future.wait()


def _run_backward(agent: Agent, src: WorkerInfo, payload: Any) -> None:
    context_id, entries = payload
    ctx = container().retrieve(context_id)
    outputs, grads = [], []
    for message_id, index, grad in entries:
        outputs.append(ctx.sends[message_id][index])
        grads.append(grad)
    run_piece(ctx, outputs, grads)


def release_everywhere(context_id: int, skip: int | None = None) -> None:
    """Drop a context here; tell every worker it knew (batched, sent by ``flush_releases``)."""
    hooks = container()
    ctx = hooks.release(context_id)
    if ctx is None:
        return
    me = hooks.worker_id
    hooks.queue_release([w for w in ctx.workers if w != skip and w != me], context_id)


def flush_releases(hooks: Container) -> None:
    """Send the queued releases, one one-way message per worker (the agent's periodic task,
    so a training step does not pay a message for the release of the previous one)."""
    agent = hooks.agent
    for worker_id, context_ids in hooks.take_releases().items():
        if not agent.is_dead(worker_id) and not agent.closing:
            agent.request(agent.worker(worker_id), RELEASE, context_ids, 0,
                          "release distributed autograd contexts", one_way=True)


def _run_release(agent: Agent, src: WorkerInfo, context_ids: list[int]) -> None:
    for context_id in context_ids:
        release_everywhere(context_id, skip=src.id)


register_handler(Handler(BACKWARD, _run_backward))
register_handler(Handler(RELEASE, _run_release))
