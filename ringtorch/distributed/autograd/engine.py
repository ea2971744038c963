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

import threading
from typing import Any

import torch

from ringtorch.distributed.autograd import context as _context
from ringtorch.distributed.rpc import messages
from ringtorch.distributed.rpc.agent import current_agent
from ringtorch.futures import Future

BACKWARD = 32   # (context_id, [(message_id, tensor index, grad)]): run the sender's piece
RELEASE = 33    # one-way, [context_id]: drop the contexts here and on the workers they knew

_container: _context.Container | None = None


def container() -> _context.Container:
    """This worker's context container (the hook installed on its RPC agent).

    Raises:
        RuntimeError: RPC is not initialized.
    """
    agent = current_agent()
    if _container is None or agent.autograd_hook is not _container:
        install(agent)
    assert _container is not None
    return _container


def install(agent: Any) -> None:
    """Install a fresh container as ``agent``'s autograd hook (on every ``init_rpc``)."""
    global _container
    _container = _context.Container(agent.info.id)
    agent.autograd_hook = _container
    with _release_lock:
        _releases.clear()
    agent.periodic_tasks.append(lambda now: flush_releases(agent))


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


def run_piece(ctx: _context.DistAutogradContext, outputs: list[torch.Tensor],
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


def _propagate(ctx: _context.DistAutogradContext,
               onward: dict[int, list[tuple[int, int, torch.Tensor]]]) -> None:
    if not onward:
        return
    agent = current_agent()
    previous = _context.current()
    _context.set_current(None)  # engine messages are not part of the recorded graph
    try:
        if len(onward) == 1:  # the common case: wait on the reply ourselves, no hand-off
            ((worker_id, entries),) = onward.items()
            agent.request(agent.workers[worker_id], BACKWARD, (ctx.context_id, entries), 0,
                          "distributed autograd backward", sync=True)
            return
        pendings = []
        for worker_id, entries in onward.items():
            future: Future[Any] = Future()
            agent.request(agent.workers[worker_id], BACKWARD, (ctx.context_id, entries), 0,
                          "distributed autograd backward", future=future)
            pendings.append(future)
    finally:
        _context.set_current(previous)
    for future in pendings:
        future.wait()


def _run_backward(agent: Any, src: Any, payload: Any) -> None:
    context_id, entries = payload
    ctx = container().retrieve(context_id)
    outputs, grads = [], []
    for message_id, index, grad in entries:
        outputs.append(ctx.sends[message_id][index])
        grads.append(grad)
    run_piece(ctx, outputs, grads)


_release_lock = threading.Lock()
_releases: dict[int, list[int]] = {}  # worker id -> context ids to release there


def release_everywhere(context_id: int, skip: int | None = None) -> None:
    """Drop a context here; tell every worker it knew (batched, sent by ``flush_releases``)."""
    ctx = container().release(context_id)
    if ctx is None:
        return
    me = current_agent().info.id
    with _release_lock:
        for worker_id in ctx.workers:
            if worker_id != skip and worker_id != me:
                _releases.setdefault(worker_id, []).append(context_id)


def flush_releases(agent: Any) -> None:
    """Send the queued releases, one one-way message per worker (the agent's periodic task,
    so a training step does not pay a message for the release of the previous one)."""
    with _release_lock:
        batch = dict(_releases)
        _releases.clear()
    for worker_id, context_ids in batch.items():
        if worker_id not in agent.dead and not agent.closing:
            agent.request(agent.workers[worker_id], RELEASE, context_ids, 0,
                          "release distributed autograd contexts", one_way=True)


def _run_release(agent: Any, src: Any, context_ids: list[int]) -> None:
    for context_id in context_ids:
        release_everywhere(context_id, skip=src.id)


messages.register_handler(messages.Handler(BACKWARD, _run_backward))
messages.register_handler(messages.Handler(RELEASE, _run_release))
