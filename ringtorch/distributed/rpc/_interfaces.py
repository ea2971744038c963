"""What RPC's collaborators call on each other: small Protocols and the two registration records.

The agent (agent.py) is the one implementation of ``Agent``; the RRef context, the shutdown
agreement, the message handlers and the extensions above RPC (distributed autograd) see it
only through that Protocol, so none of them imports the agent and the agent imports none of
their internals. The rule this module keeps: it imports nothing of rpc/ but leaf modules
(``_workerinfo``), so every other module may import it without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ringtorch.distributed.rpc._workerinfo import WorkerInfo

if TYPE_CHECKING:
    import torch

    from ringtorch.futures import Future


class Agent(Protocol):
    """The calls this worker's RPC agent offers the layers that plug into it."""

    @property
    def info(self) -> WorkerInfo:
        """This worker's name and rank."""

    @property
    def world_size(self) -> int:
        """How many workers the RPC group has."""

    @property
    def rpc_timeout(self) -> float:
        """The default timeout of calls, in seconds (0: none)."""

    @property
    def closing(self) -> bool:
        """Whether the agent is closing (nothing more should be sent)."""

    def worker(self, rank: int) -> WorkerInfo:
        """The WorkerInfo of ``rank`` (a rank of the group)."""

    def is_dead(self, rank: int) -> bool:
        """Whether the connection to ``rank`` broke (it died or left)."""

    def dead_ranks(self) -> list[int]:
        """The ranks whose connection broke, sorted."""

    def request(self, dst: WorkerInfo, kind: int, payload: Any, timeout: float, what: object,
                *, sync: bool = False, future: Future[Any] | None = None,
                on_done: Callable[[Any, BaseException | None], None] | None = None,
                one_way: bool = False) -> Any:
        """Send a request of ``kind`` to ``dst`` (see ``RpcAgent.request``)."""

    def release_hold(self, peer: WorkerInfo, message_id: int) -> None:
        """``peer`` has loaded our reply to its request ``message_id``: let its holds go."""

    def on_peer_death(self, listener: Callable[[int, BaseException], None]) -> None:
        """Call ``listener(rank, error)`` when a worker's connection breaks."""

    def every_tick(self, task: Callable[[float], None]) -> None:
        """Call ``task(time.monotonic())`` from the housekeeping thread (every 5-100 ms)."""

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the agent's worker pool."""


class RunningAgent(Agent, Protocol):
    """What api.py and the shutdown agreement call on the current agent, besides ``Agent``."""

    def get_worker_info(self, to: WorkerInfo | str | int | None = None) -> WorkerInfo:
        """The WorkerInfo of a name, a rank or a WorkerInfo (this worker's for None)."""

    def set_rpc_timeout(self, seconds: float) -> None:
        """Change the default timeout of later calls."""

    def context_hook(self) -> AutogradHook:
        """The hook of the extension that owns context ids, attached on first use."""

    def pending_calls(self) -> int:
        """How many calls of this worker await their replies."""

    def counts(self) -> tuple[int, int]:
        """(messages sent, messages handled) for graceful shutdown's agreement."""

    def begin_shutdown(self) -> None:
        """Peers may close any moment from now on: their leaving is not reported."""

    def close(self) -> None:
        """Close every connection and stop every thread (local, immediate)."""


class AutogradHook(Protocol):
    """What the agent calls for every message when distributed autograd is loaded: the
    header's ``context_id``/``context_message_id`` are its to stamp and read
    (docs/design/distributed-autograd.md, "Hooks used in the RPC agent")."""

    def on_send(self, dst: WorkerInfo, tensors: list[torch.Tensor]) -> tuple[int, int]:
        """(context id, message id) to stamp on a request; (-1, -1) outside a context."""

    def on_reply(self, dst: WorkerInfo, context_id: int,
                 tensors: list[torch.Tensor]) -> tuple[int, int]:
        """(context id, message id) to stamp on the reply to a stamped request."""

    def on_recv(self, src: WorkerInfo, context_id: int,
                message_id: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """The function every tensor rebuilt from a stamped message passes through."""

    def running(self, context_id: int) -> AbstractContextManager[None]:
        """Serve a stamped request inside its context (its own calls are stamped too)."""

    def backward(self, context_id: int, roots: list[torch.Tensor], retain_graph: bool) -> None:
        """``dist_autograd.backward`` (for ``RRef.backward`` on the owner).

        Raises:
            RuntimeError: no such context on this worker (torch's message).
        """


class ShutdownReports(Protocol):
    """The leader's side of graceful shutdown, as the SHUTDOWN_REPORT handler calls it."""

    def report(self, rank: int, round_no: int, counts: tuple[int, int]) -> Future[bool]:
        """Record one worker's counters; the future says whether everybody may close."""


@dataclass(frozen=True)
class AgentStatistics:
    """A snapshot of one agent (``RpcAgent.statistics()``), for diagnostics and tests."""

    sent: int                          # counted messages sent (graceful shutdown's counter)
    handled: int                       # counted messages handled
    pending_calls: int                 # calls awaiting their replies
    dead: dict[int, str]               # rank -> why its connection broke
    refused_connections: int           # connections refused (handshake or identity), ever
    transports: dict[int, str]         # rank -> "AF_UNIX", "AF_INET", ... or "loopback"
    by_reference: dict[int, bool]      # rank -> it may copy our tensors out of our memory
    address: dict[str, Any]            # where this agent listens
    handshakes_in_flight: int = 0      # connections to our listener not yet authenticated
    dropped_connections: dict[str, int] = field(default_factory=dict)  # by reason, ever
    accept_pauses: int = 0             # accepts paused for want of file descriptors, ever


@dataclass(frozen=True)
class Handler:
    """How the callee serves one request kind.

    ``prepare(agent, src, payload)`` runs on the connection's reader thread, in message
    order, and must not block; it returns the argument given to ``run`` (often the payload).
    ``run(agent, src, prepared)`` returns the reply value or a Future of it; it runs inline
    on the reader thread when ``inline`` (protocol messages that never block), otherwise on
    the worker pool (or inline with a rescue, see _server.py).
    """

    kind: int
    run: Callable[[Agent, WorkerInfo, Any], Any]
    prepare: Callable[[Agent, WorkerInfo, Any], Any] | None = None
    inline: bool = False
    counted: bool = True  # counts towards graceful shutdown's quiescence agreement


@dataclass(frozen=True)
class Extension:
    """A package above RPC that plugs into the agent, loaded on first use.

    ``attach`` names, as ``"module:function"``, the function that importing the package
    makes available: ``function(agent)`` returns the object the agent keeps for this
    extension for the rest of its life (for the extension that owns the header's context
    ids, an ``AutogradHook``). Importing ``module`` also registers the handlers of the
    request ``kinds`` the extension serves.
    """

    name: str
    attach: str
    kinds: range = range(0)
    context_ids: bool = False  # owns the header's context_id / context_message_id


__all__ = ["Agent", "AgentStatistics", "AutogradHook", "Extension", "Handler", "RunningAgent",
           "ShutdownReports"]
