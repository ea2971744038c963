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
from typing import Any

import torch

_tls = threading.local()


class DistAutogradContext:
    """One context on one worker: its sends, its receives, its gradients."""

    def __init__(self, context_id: int) -> None:
        self.context_id = context_id
        self.lock = threading.Lock()
        self.messages = itertools.count(1)
        # (dst worker id, message id) -> {tensor index: tensor that required grad}
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


class Container:
    """The contexts of this worker, and the hook the RPC agent calls for every message."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id
        self.lock = threading.Lock()
        self.contexts: dict[int, DistAutogradContext] = {}
        self._counter = itertools.count(1)

    def backward(self, context_id: int, roots: list[torch.Tensor], retain_graph: bool) -> None:
        """``dist_autograd.backward`` for RPC code, which may not import this package
        (``RRef.backward`` on the owner)."""
        from ringtorch.distributed.autograd import api

        api.backward(context_id, roots, retain_graph)

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

    # ---- the agent's hook ---------------------------------------------------------------

    def _record_send(self, ctx: DistAutogradContext, dst: Any,
                     tensors: list[torch.Tensor]) -> tuple[int, int]:
        message_id = next(ctx.messages)
        needing = {i: t for i, t in enumerate(tensors) if t.requires_grad}
        with ctx.lock:
            ctx.workers.add(dst.id)
            if needing:
                ctx.sends[message_id] = needing
        return ctx.context_id, message_id

    def on_send(self, dst: Any, tensors: list[torch.Tensor]) -> tuple[int, int]:
        ctx = getattr(_tls, "context", None)
        if ctx is None:
            return -1, -1
        return self._record_send(ctx, dst, tensors)

    def on_reply(self, dst: Any, context_id: int,
                 tensors: list[torch.Tensor]) -> tuple[int, int]:
        with self.lock:
            ctx = self.contexts.get(context_id)
        if ctx is None:
            return -1, -1
        return self._record_send(ctx, dst, tensors)

    def on_recv(self, src: Any, context_id: int,
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
        previous = getattr(_tls, "context", None)
        _tls.context = self.get_or_create(context_id)
        try:
            yield
        finally:
            _tls.context = previous


def current() -> DistAutogradContext | None:
    return getattr(_tls, "context", None)


def set_current(ctx: DistAutogradContext | None) -> None:
    _tls.context = ctx
