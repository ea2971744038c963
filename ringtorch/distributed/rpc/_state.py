"""The one process-global object of RPC (and of distributed autograd and the optimizer above it).

Everything ``init_rpc`` makes for a run is recorded here and nowhere else: the agent, the
RRef context and the shutdown agreement (distributed autograd's hook hangs off the agent,
made when first needed). ``shutdown()`` empties the run (``clear_run``); what outlives a run
is named as such below: the registries of message handlers and extensions, the init counter
(a later ``init_rpc`` must use fresh store keys, as torch's ``rpc_prefix_N``) and the latest
rendezvous (torch keeps its latest ``rendezvous_iterator`` too, so the master's store stays up
for workers still leaving). Per-thread slots sit in one ``threading.local``.

The rule this module keeps: no other module of rpc/, autograd/ or optim/ holds mutable
module-level state, and this one imports only the leaf modules of rpc/ (no cycle can pass
through it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ringtorch.distributed.rpc._interfaces import (
    Extension,
    Handler,
    RunningAgent,
    ShutdownReports,
)
from ringtorch.distributed.rpc._rref_context import RRefContext


class PerThread(threading.local):
    """What one thread is doing for RPC; every slot is None when it does nothing.

    ``encode``/``decode``: the message being pickled/loaded (_serialization.py);
    ``pickling``: the thread's reusable pickler; ``inline``: the request this thread serves
    on its connection's reader (_server.py); ``future_list``: the futures ``_wait_all``
    collects (api.py).
    """

    encode: Any = None
    decode: Any = None
    pickling: Any = None
    inline: Any = None
    future_list: list[Any] | None = None


@dataclass
class RpcState:
    """All process-global state of ringtorch.distributed.rpc. Nothing else is global."""

    # the run: made by init_rpc, emptied by shutdown
    agent: RunningAgent | None = None
    rrefs: RRefContext | None = None
    shutdown_leader: ShutdownReports | None = None
    # outlive a run
    handlers: dict[int, Handler] = field(default_factory=dict)
    extensions: dict[str, Extension] = field(default_factory=dict)
    init_count: int = 0
    rendezvous: Iterator[Any] | None = None
    init_lock: threading.Lock = field(default_factory=threading.Lock)
    thread: PerThread = field(default_factory=PerThread)

    def start_run(self, agent: RunningAgent, rrefs: RRefContext,
                  shutdown_leader: ShutdownReports) -> None:
        """Record what ``init_rpc`` made (before the agent connects: requests may arrive)."""
        self.agent, self.rrefs, self.shutdown_leader = agent, rrefs, shutdown_leader

    def clear_run(self) -> None:
        """Forget the run (``shutdown()`` and a failed ``init_rpc``)."""
        self.agent = self.rrefs = self.shutdown_leader = None

    def run_is_empty(self) -> bool:
        """Whether nothing of a run is left (what ``shutdown()`` guarantees)."""
        return self.agent is None and self.rrefs is None and self.shutdown_leader is None


STATE = RpcState()

_NOT_INITIALIZED = "RPC has not been initialized. Call ringtorch.distributed.rpc.init_rpc first."


def current_agent() -> RunningAgent:
    """This process's RPC agent.

    Raises:
        RuntimeError: RPC is not initialized (torch's message).
    """
    agent = STATE.agent
    if agent is None:
        raise RuntimeError(_NOT_INITIALIZED)
    return agent


def current_rrefs() -> RRefContext:
    """This process's RRef context.

    Raises:
        RuntimeError: RPC is not initialized (torch's message).
    """
    rrefs = STATE.rrefs
    if rrefs is None:
        raise RuntimeError(_NOT_INITIALIZED)
    return rrefs


__all__ = ["STATE", "PerThread", "RpcState", "current_agent", "current_rrefs"]
