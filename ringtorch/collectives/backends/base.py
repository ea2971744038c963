"""The contract between a ProcessGroup and the backend that moves its bytes.

A ProcessGroup (process_group.py) validates the caller's arguments, turns tensors and NumPy
arrays into flat contiguous torch tensors (copying non-contiguous ones in and out), orders
work on the group's communication thread, stamps each collective with the group's sequence
number, and wraps results in Work objects. The backend below it does one thing: run one
operation to completion on buffers that are already right, or raise.

Every tensor a backend receives is a 1-D, contiguous CPU tensor (any dtype torch has,
including bfloat16, float16, bool and complex); ``tensor.view(torch.uint8).numpy()`` gives
its bytes without a copy. Ranks are group ranks (0 .. size-1).

Each collective receives its operation ``o`` (ringtorch._observe.operation.Operation), the
one object of the call: ``o.seq`` is the group's sequence number of the operation, identical
on every rank for the same collective (backends put it on the wire so that mismatched
collectives are detected, never silently computed), and ``o.deadline`` the absolute
``time.monotonic()`` second by which it must finish. The backend attaches what it learns to
the operation, not to itself: ``o.call`` (the CollectiveCall it runs it as) and ``o.route``
(an object whose ``route(o)`` says what it travelled by, for the flight recorder); anything
one call must undo goes in ``o.scratch``. A backend keeps no per-call state, so the
operation is all a status query, a timeout message or a dump needs. Point-to-point
operations carry no sequence number (they are not collective) but a ``tag`` and a deadline.

The group checks every argument before the backend sees it (checks.py: tensors, sizes,
roots, reduce op against dtype): a backend may assume them right.

Errors: a backend raises ``DistBackendError`` (from ``ringtorch._errors``) naming the peer and
the operation when a peer dies, a timeout passes, or ranks disagree on op, size or dtype.
After a peer failure, every later call raises at once with the same cause (the backend is
then "aborted"). ``deadline`` arguments are absolute ``time.monotonic()`` seconds.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from ringtorch._observe.operation import Operation


@dataclass(frozen=True)
class BackendContext:
    """What a backend is created with; the same on every rank of the group except ``rank``.

    Attributes:
        store: a Store (torch API: set/get/add/wait/check) private to this group: keys written
            here cannot collide with other groups' keys (it is a PrefixStore).
        rank: this process's rank in the group.
        size: the number of ranks in the group.
        timeout: the group's default timeout for one operation.
        group_name: the group's name, for messages ("default", "1", ...).
        global_ranks: the global rank of each group rank, for messages.
        setup_timeout: how long making the group may take (its members meeting, its
            transports opening); None: ``timeout``. shrink_group bounds it, so that a member
            that dies while the new group is made is noticed in seconds.
    """

    store: Any
    rank: int
    size: int
    timeout: timedelta
    group_name: str
    global_ranks: tuple[int, ...]
    setup_timeout: timedelta | None = None

    @property
    def setup_deadline(self) -> float:
        """The absolute time.monotonic() by which the group must be made."""
        return time.monotonic() + (self.setup_timeout or self.timeout).total_seconds()


class Backend(ABC):
    """One group's data mover. Methods run to completion on the calling thread.

    Attributes:
        supports_shrinking: whether ``shrink_group`` may replace this backend's group with one
            of its survivors (torch's ``Backend.supports_shrinking``).
    """

    supports_shrinking = False

    def __init__(self, ctx: BackendContext) -> None:
        self.ctx = ctx

    def route(self, record: Any) -> tuple[str, str]:
        """(transport, algorithm) a recorded operation travelled by, for the flight
        recorder's dump; a backend that knows better says so."""
        return (type(self).__name__, "")

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def size(self) -> int:
        return self.ctx.size

    @abstractmethod
    def broadcast(self, buf: torch.Tensor, root: int, o: Operation) -> None:
        """Copy root's ``buf`` into every rank's ``buf`` (same numel and dtype everywhere)."""

    @abstractmethod
    def all_reduce(self, buf: torch.Tensor, op: Any, o: Operation) -> None:
        """Reduce ``buf`` element-wise across ranks with ``op`` (a ReduceOp), in place on every
        rank. The result is bitwise identical on every rank (a fixed reduction order)."""

    @abstractmethod
    def reduce(self, buf: torch.Tensor, op: Any, root: int, o: Operation) -> None:
        """Like all_reduce, but only ``root``'s ``buf`` must hold the result afterwards."""

    @abstractmethod
    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, o: Operation) -> None:
        """``out`` (size * inp.numel()) receives every rank's ``inp``, in rank order."""

    def all_gather_parts(self, outs: list[torch.Tensor], inp: torch.Tensor,
                         o: Operation) -> None:
        """Like all_gather, but rank j's ``inp`` lands in ``outs[j]`` (one tensor per rank, each
        of inp's size and dtype, anywhere in memory): the list form, when its tensors are not
        one buffer. This default gathers into a scratch buffer and copies the parts out; a
        backend that can write every part in place overrides it."""
        flat = torch.empty(len(outs) * inp.numel(), dtype=inp.dtype)
        self.all_gather(flat, inp, o)
        n = inp.numel()
        for j, part in enumerate(outs):
            part.copy_(flat[j * n:(j + 1) * n])

    @abstractmethod
    def gather(self, out: torch.Tensor | None, inp: torch.Tensor, root: int,
               o: Operation) -> None:
        """Root's ``out`` (size * inp.numel()) receives every rank's ``inp`` in rank order;
        ``out`` is None on other ranks."""

    @abstractmethod
    def scatter(self, out: torch.Tensor, inp: torch.Tensor | None, root: int,
                o: Operation) -> None:
        """Rank r's ``out`` receives slice r of root's ``inp`` (size * out.numel());
        ``inp`` is None on other ranks."""

    @abstractmethod
    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: Any,
                       o: Operation) -> None:
        """``inp`` is size * out.numel(); rank r's ``out`` receives the reduction over ranks
        of slice r. ``inp`` is only read (the ProcessGroup hands over the caller's tensor),
        and never overlaps ``out``."""

    def reduce_scatter_parts(self, out: torch.Tensor, ins: list[torch.Tensor], op: Any,
                             o: Operation) -> None:
        """Like reduce_scatter, with the input as one tensor per rank (``ins[j]``: the piece
        rank j receives the reduction of; each of out's size and dtype, only read). This
        default concatenates them; a backend that can read every part in place overrides it."""
        self.reduce_scatter(out, torch.cat(ins), op, o)

    @abstractmethod
    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                   in_splits: list[int], o: Operation) -> None:
        """Rank r sends ``inp``'s slice j (``in_splits[j]`` elements) to rank j, and receives
        from rank j into ``out``'s slice j (``out_splits[j]`` elements)."""

    @abstractmethod
    def barrier(self, o: Operation) -> None:
        """Return once every rank has entered the barrier."""

    @abstractmethod
    def send(self, buf: torch.Tensor, dst: int, tag: int, deadline: float) -> None:
        """Send ``buf`` to group rank ``dst``; matched by a recv with the same tag."""

    @abstractmethod
    def recv(self, buf: torch.Tensor, src: int | None, tag: int, deadline: float) -> int:
        """Receive into ``buf`` from group rank ``src`` (any rank when None); returns the
        sender's group rank."""

    @property
    def shares_memory(self) -> bool:
        """Whether :meth:`shared_tensor` can place tensors in memory shared by the group's
        ranks (a capability: False unless a backend says otherwise)."""
        return False

    @property
    def one_host(self) -> bool | None:
        """Whether every rank of the group is on this host, as the group's rendezvous learnt
        it (the same answer on every rank); None where the backend does not know."""
        return None

    def shared_tensor(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Collective: a zero-filled 1-D tensor for repeated all_reduces, in shared memory
        where the backend has it (then its all_reduce skips a copy). Every rank calls it
        with the same arguments at the same place among the group's collectives. This
        default, for backends without shared memory, returns an ordinary tensor."""
        return torch.zeros(numel, dtype=dtype)

    @abstractmethod
    def abort(self, reason: str) -> None:
        """Fail every pending and later operation with ``reason``; tell the peers."""

    @abstractmethod
    def close(self) -> None:
        """Release connections and memory; later calls raise."""
