"""Graceful shutdown: all workers agree that no RPC message is in flight, then all close.

Each worker counts the messages it has sent and the ones it has finished handling (replies
are part of their request; shutdown's own reports are not counted). In rounds, every worker
waits until its own calls are answered and reports its two counters to the leader (rank 0),
which answers everybody once all have reported. Termination is agreed when the totals of
sent and handled messages are equal and did not change since the previous round (the
four-counter method: a message still in flight, or one sent in between, shows up as a
difference). A worker that dies during the agreement makes it fail at once with an error
naming it; nobody waits for a timeout.
"""

from __future__ import annotations

import threading
import time

from ringtorch.distributed.rpc import messages
from ringtorch.distributed.rpc._interfaces import Agent, Handler, RunningAgent
from ringtorch.distributed.rpc._server import Deferred
from ringtorch.distributed.rpc._state import STATE
from ringtorch.distributed.rpc._workerinfo import WorkerInfo, describe
from ringtorch.distributed.rpc.errors import RpcPeerDiedError, RpcTimeoutError
from ringtorch.distributed.rpc.extensions import register_handler
from ringtorch.futures import Future


class ShutdownLeader:
    """The leader's side of the agreement (every agent has one; rank 0's is used)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.lock = threading.Lock()
        self.reports: dict[int, dict[int, tuple[int, int]]] = {}
        self.waiters: dict[int, list[tuple[int, Future[bool]]]] = {}
        self.previous: tuple[int, int] | None = None
        self.agreed = False
        agent.on_peer_death(self._peer_died)

    def report(self, rank: int, round_no: int, counts: tuple[int, int]) -> Future[bool]:
        """Record one worker's counters; the future says whether everybody may close."""
        answer: Future[bool] = Future()
        with self.lock:
            dead = ", ".join(describe(self.agent.worker(r)) for r in self.agent.dead_ranks())
            if dead:
                answer.set_exception(RpcPeerDiedError(
                    f"graceful RPC shutdown cannot complete: {dead} died or left"))
                return answer
            self.reports.setdefault(round_no, {})[rank] = (counts[0], counts[1])
            self.waiters.setdefault(round_no, []).append((rank, answer))
            if len(self.reports[round_no]) < self.agent.world_size:
                return answer
            sent = sum(c[0] for c in self.reports[round_no].values())
            handled = sum(c[1] for c in self.reports[round_no].values())
            agreed = sent == handled and self.previous == (sent, handled)
            self.previous = (sent, handled)
            self.agreed = agreed
            waiters = self.waiters.pop(round_no)
            del self.reports[round_no]
        # the leader's own answer last: once it has it, it may close its connections, and
        # every other worker's answer must be on its way by then
        me = self.agent.info.id
        for _, waiter in sorted(waiters, key=lambda item: item[0] == me):
            waiter.set_result(agreed)
        return answer

    def _peer_died(self, rank: int, error: BaseException) -> None:
        with self.lock:
            if self.agreed or not self.waiters:
                return
            waiters = [w for ws in self.waiters.values() for _, w in ws]
            self.waiters.clear()
            self.reports.clear()
        failure = RpcPeerDiedError(f"graceful RPC shutdown failed: "
                                   f"{describe(self.agent.worker(rank))} died ({error})")
        for waiter in waiters:
            waiter.set_exception(failure)


def _run_report(agent: Agent, src: WorkerInfo,
                payload: tuple[int, tuple[int, int]]) -> Deferred:
    round_no, counts = payload
    leader = STATE.shutdown_leader
    if leader is None:
        raise RuntimeError(f"RPC was shut down on {describe(agent.info)}")
    return Deferred(leader.report(src.id, round_no, counts))


register_handler(Handler(messages.SHUTDOWN_REPORT, _run_report, inline=True, counted=False))


def _wait_quiet(agent: RunningAgent, deadline: float | None) -> None:
    delay = 0.0005
    while agent.pending_calls():
        if deadline is not None and time.monotonic() > deadline:
            raise RpcTimeoutError(f"graceful RPC shutdown of {describe(agent.info)} timed out: "
                                  f"{agent.pending_calls()} calls still pending")
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def agree_to_close(agent: RunningAgent, timeout: float) -> None:
    """Block until every worker has reached shutdown and no message is in flight.

    Raises:
        RpcTimeoutError: not agreed within ``timeout`` seconds (0: no limit).
        RpcPeerDiedError: a worker died meanwhile (the message names it).
    """
    deadline = None if timeout <= 0 else time.monotonic() + timeout
    agent.begin_shutdown()
    leader = agent.worker(0)
    round_no = 0
    while True:
        _wait_quiet(agent, deadline)
        remaining = 0.0 if deadline is None else max(1e-3, deadline - time.monotonic())
        try:
            agreed = agent.request(leader, messages.SHUTDOWN_REPORT, (round_no, agent.counts()),
                                   remaining, f"graceful shutdown round {round_no} on "
                                   f"{describe(leader)}", sync=True)
        except RpcTimeoutError:
            raise RpcTimeoutError(f"graceful RPC shutdown of {describe(agent.info)} timed out "
                                  f"after {timeout:g} s: not every worker reached shutdown "
                                  f"with its calls answered") from None
        if agreed:
            return
        if round_no == 0:
            # Every worker has reached shutdown with its calls answered (the leader answers
            # round 0 only then): no call is still running that may use a user RRef, one
            # that came in its arguments included. Delete them now, as torch does after its
            # wait for all workers; the rounds go on until the deletes are delivered.
            if STATE.rrefs is not None:
                STATE.rrefs.delete_all_users()
        round_no += 1
