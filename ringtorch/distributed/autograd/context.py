"""Distributed autograd contexts: ids, per-worker state, and the RPC agent's autograd hook.

A context id is unique across workers: ``(worker_id << 48) + counter``. Each worker keeps the
contexts it has seen (created by ``context()`` on the root, or by the first message stamped
with the id elsewhere). A context records, per RPC message it sent, the tensors that required
grad (the "send" side), and per message it received, the rebuilt tensors that require grad
(the "recv" side, made leaves of this worker's graph). The rule it keeps: tensors that do not
require grad are never recorded, and messages sent outside a context are not stamped.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from ringtorch.distributed.rpc.extensions import Agent, WorkerInfo


class DistAutogradContext:
    """One context on one worker: its sends, its receives, its gradients."""

    def __init__(self, context_id: int) -> None:
        self.context_id = context_id
        self.lock = threading.Lock()
        self.messages = itertools.count(1)
        # message id -> {tensor index: tensor that required grad}
        self.sends: dict[int, dict[int, torch.Tensor]] = {}
        # id(recv leaf) -> (src worker id, message id, tensor index)
        self.recvs: dict[int, tuple[int, int, int]] = {}
        self.recv_tensors: list[torch.Tensor] = []
        self.grads: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.workers: set[int] = set()
        self.backward_done = False
        self.retained = True

    def accumulate(self, tensor: torch.Tensor, grad: torch.Tensor) -> None:
        """Add ``grad`` to ``tensor``'s gradient in this context (never to ``.grad``)."""
        with self.lock:
            old = self.grads.get(id(tensor))
            self.grads[id(tensor)] = (tensor, grad if old is None else old[1] + grad)


Backward = Callable[[int, list[torch.Tensor], bool], None]


class Container:
    """The contexts of this worker, and the hook the RPC agent calls for every message.

    One per RPC agent, made the first time the agent or the user needs it (engine.attach):
    it holds everything distributed autograd keeps for a run (the contexts, each thread's
    current context, the releases not yet sent), so it all goes with the agent at shutdown.
    """

    def __init__(self, agent: Agent, backward: Backward) -> None:
        self.agent = agent
        self.worker_id = agent.info.id
        self.lock = threading.Lock()
        self.contexts: dict[int, DistAutogradContext] = {}
        self._counter = itertools.count(1)
        self._backward = backward
        self._thread = threading.local()
        self._releases: dict[int, list[int]] = {}  # worker id -> context ids to release there

    def backward(self, context_id: int, roots: list[torch.Tensor], retain_graph: bool) -> None:
        """``dist_autograd.backward`` for RPC code, which may not import this package
        (``RRef.backward`` on the owner)."""
        self._backward(context_id, roots, retain_graph)

    def current(self) -> DistAutogradContext | None:
        """The context this thread records into (None outside ``context()``)."""
        ctx: DistAutogradContext | None = getattr(self._thread, "context", None)
        return ctx

    def set_current(self, ctx: DistAutogradContext | None) -> None:
        self._thread.context = ctx

    def new_context(self) -> DistAutogradContext:
        ctx = DistAutogradContext((self.worker_id << 48) + next(self._counter))
        with self.lock:
            self.contexts[ctx.context_id] = ctx
        return ctx

    def get_or_create(self, context_id: int) -> DistAutogradContext:
        with self.lock:
            ctx = self.contexts.get(context_id)
            if ctx is None:
                ctx = self.contexts[context_id] = DistAutogradContext(context_id)
            return ctx

    def retrieve(self, context_id: int) -> DistAutogradContext:
        """The context with this id.

        Raises:
            RuntimeError: no such context on this worker (torch's message).
        """
        with self.lock:
            ctx = self.contexts.get(context_id)
        if ctx is None:
            raise RuntimeError(f"Could not find autograd context with id: {context_id}")
        return ctx

    def release(self, context_id: int) -> DistAutogradContext | None:
        with self.lock:
            return self.contexts.pop(context_id, None)

    def queue_release(self, worker_ids: list[int], context_id: int) -> None:
        """Release ``context_id`` on those workers with the next batch (``take_releases``)."""
        with self.lock:
            for worker_id in worker_ids:
                self._releases.setdefault(worker_id, []).append(context_id)

    def take_releases(self) -> dict[int, list[int]]:
        """The releases queued since the last call, by worker."""
        with self.lock:
            batch, self._releases = self._releases, {}
        return batch

    # ---- the agent's hook (rpc.extensions.AutogradHook) -------------------------------

    def _record_send(self, ctx: DistAutogradContext, dst: WorkerInfo,
                     tensors: list[torch.Tensor]) -> tuple[int, int]:
        message_id = next(ctx.messages)
        needing = {i: t for i, t in enumerate(tensors) if t.requires_grad}
        with ctx.lock:
            ctx.workers.add(dst.id)
            if needing:
                ctx.sends[message_id] = needing
        return ctx.context_id, message_id

    def on_send(self, dst: WorkerInfo, tensors: list[torch.Tensor]) -> tuple[int, int]:
        ctx = getattr(self._thread, "context", None)
        if ctx is None:
            return -1, -1
        return self._record_send(ctx, dst, tensors)

    def on_reply(self, dst: WorkerInfo, context_id: int,
                 tensors: list[torch.Tensor]) -> tuple[int, int]:
        with self.lock:
            ctx = self.contexts.get(context_id)
        if ctx is None:
            return -1, -1
        return self._record_send(ctx, dst, tensors)

    def on_recv(self, src: WorkerInfo, context_id: int,
                message_id: int) -> Callable[[torch.Tensor], torch.Tensor]:
        ctx = self.get_or_create(context_id)
        with ctx.lock:
            ctx.workers.add(src.id)
        index = itertools.count()

        def on_tensor(tensor: torch.Tensor) -> torch.Tensor:
            i = next(index)
            if tensor.requires_grad:
                with ctx.lock:
                    ctx.recvs[id(tensor)] = (src.id, message_id, i)
                    ctx.recv_tensors.append(tensor)  # keeps the id valid
            return tensor
        return on_tensor

    @contextmanager
    def running(self, context_id: int) -> Iterator[None]:
        """Run a served request inside ``context_id`` (its own RPCs are stamped with it)."""
        previous = self.current()
        self.set_current(self.get_or_create(context_id))
        try:
            yield
        finally:
            self.set_current(previous)
