"""The agent's one decision, as a pure function: given what it observed, what does it do next?

The agent loop (agent.py) observes its worker group, the rendezvous and the signals it got,
calls :func:`decide`, and acts. Keeping the decision here, free of processes and sockets,
lets a table of cases (tests/unit/test_launcher_decisions.py) pin the policy down:

- a signal to the launcher wins over everything: stop the workers and exit;
- our workers failed: restart the whole group in a new rendezvous round while restarts
  remain (each costs one) and the job is still open, else give up;
- another node gave up on the job (it closed the rendezvous): stop our workers too;
- all our workers succeeded: finish; with ``--on-worker-failure=continue``, a failed worker
  fails the group only once no worker runs and none succeeded (group_state), so the others
  may shrink the job and go on (docs/recovery.md);
- another node restarted its group: restart ours too, and count it, so that every node spends
  the same restart budget and sees the same TORCHELASTIC_RESTART_COUNT (torch counts it only
  on the failing node);
- healthy, but new nodes wait to join: restart into a new round to admit them (free of
  charge, as in torch: membership changes do not count as restarts);
- another node left the round gracefully (its launcher was signalled and the job keeps at
  least its minimum of nodes): restart into a new round without it, free of charge too, even
  when our workers failed meanwhile (they lost their peers on that node: the leave, not a
  fault, ended them);
- otherwise keep watching.

Beside the action, with ``--on-worker-failure=continue`` and restarts left, a failed worker
is restarted alone while others still run (:func:`workers_to_replace`): its replacement joins
the running job (``RINGTORCH_JOIN=1``, docs/recovery.md) and costs one restart.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class GroupState(enum.Enum):
    """The local worker group, as one word."""

    HEALTHY = "healthy"  # every worker is running or exited 0, at least one still runs
    SUCCEEDED = "succeeded"  # every worker exited 0
    FAILED = "failed"  # a worker exited non-zero or was killed


class Action(enum.Enum):
    """What the agent does after one look at the world."""

    WATCH = "watch"  # nothing to do; look again after the monitor interval
    FINISH = "finish"  # the job succeeded on this node
    RESTART = "restart"  # stop the group, count one restart, rendezvous again
    REJOIN = "rejoin"  # stop the group, rendezvous again to admit or drop nodes (free)
    GIVE_UP = "give_up"  # stop the group, report the failure, exit non-zero
    STOP_FOR_PEER = "stop_for_peer"  # another node gave up: stop the group, exit non-zero
    STOP_FOR_SIGNAL = "stop_for_signal"  # the launcher was signalled: stop the group, exit


@dataclass(frozen=True)
class Observation:
    """Everything the decision depends on."""

    group: GroupState
    remaining_restarts: int
    nodes_waiting: int = 0
    job_closed: bool = False  # another node gave up and closed the rendezvous
    peer_restart: bool = False  # another node of our round left it to restart its workers
    peer_left: bool = False  # another node of our round left the job gracefully
    signal: int | None = None  # a signal the launcher received (SIGINT, SIGTERM, ...)


def decide(obs: Observation) -> Action:
    """The next action for the observation; see the module docstring for the policy."""
    if obs.signal is not None:
        return Action.STOP_FOR_SIGNAL
    if obs.group is GroupState.FAILED:
        if obs.peer_left and not obs.job_closed:
            return Action.REJOIN
        restartable = obs.remaining_restarts > 0 and not obs.job_closed
        return Action.RESTART if restartable else Action.GIVE_UP
    if obs.job_closed:
        return Action.STOP_FOR_PEER
    if obs.group is GroupState.SUCCEEDED:
        return Action.FINISH
    if obs.peer_restart:
        return Action.RESTART if obs.remaining_restarts > 0 else Action.GIVE_UP
    if obs.nodes_waiting > 0 or obs.peer_left:
        return Action.REJOIN
    return Action.WATCH


def group_state(exit_codes: list[int | None], keep_going: bool = False) -> GroupState:
    """Summarise the workers' exit codes (None: still running) as a :class:`GroupState`.

    ``keep_going`` (``--on-worker-failure=continue``): a failed worker does not fail the
    group while others still run; once none runs, the group succeeded if any worker exited 0.
    """
    if keep_going:
        if any(code is None for code in exit_codes):
            return GroupState.HEALTHY
        return GroupState.SUCCEEDED if 0 in exit_codes else GroupState.FAILED
    if any(code not in (None, 0) for code in exit_codes):
        return GroupState.FAILED
    if all(code == 0 for code in exit_codes):
        return GroupState.SUCCEEDED
    return GroupState.HEALTHY


def workers_to_replace(exit_codes: list[int | None], keep_going: bool,
                       remaining_restarts: int) -> list[int]:
    """The local ranks of the failed workers to restart alone, lowest first: with
    ``keep_going``, while some worker still runs, at most ``remaining_restarts`` of them (the
    others stay failed; once no worker runs, :func:`decide` handles the group)."""
    if not keep_going or remaining_restarts <= 0 or None not in exit_codes:
        return []
    failed = [i for i, code in enumerate(exit_codes) if code not in (None, 0)]
    return failed[:remaining_restarts]


__all__ = ["Action", "GroupState", "Observation", "decide", "group_state", "workers_to_replace"]
