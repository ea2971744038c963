"""The agent's "restart or give up" policy, one row per situation (launcher/decisions.py)."""

from __future__ import annotations

import signal

import pytest

from ringtorch.launcher.decisions import (
    Action,
    GroupState,
    Observation,
    decide,
    group_state,
    workers_to_replace,
)

H, S, F = GroupState.HEALTHY, GroupState.SUCCEEDED, GroupState.FAILED

# (group, remaining restarts, nodes waiting, job closed by a peer, signal) -> action
CASES = [
    (H, 0, 0, False, None, Action.WATCH),
    (H, 3, 0, False, None, Action.WATCH),
    (S, 0, 0, False, None, Action.FINISH),
    (S, 2, 1, False, None, Action.FINISH),  # done is done: waiting nodes do not matter
    (F, 1, 0, False, None, Action.RESTART),
    (F, 5, 2, False, None, Action.RESTART),
    (F, 0, 0, False, None, Action.GIVE_UP),
    (F, 0, 3, False, None, Action.GIVE_UP),
    (F, 2, 0, True, None, Action.GIVE_UP),  # the job is closed: no new round to restart in
    (H, 0, 1, False, None, Action.REJOIN),  # admitting new nodes costs no restart...
    (H, 2, 2, False, None, Action.REJOIN),
    (H, 2, 0, True, None, Action.STOP_FOR_PEER),  # ...and another node's give-up stops us
    (S, 0, 0, True, None, Action.STOP_FOR_PEER),
    (H, 0, 1, True, None, Action.STOP_FOR_PEER),
    (H, 1, 0, False, signal.SIGINT, Action.STOP_FOR_SIGNAL),  # a signal wins over all
    (F, 1, 0, False, signal.SIGTERM, Action.STOP_FOR_SIGNAL),
    (S, 0, 0, True, signal.SIGHUP, Action.STOP_FOR_SIGNAL),
]


@pytest.mark.parametrize(("group", "remaining", "waiting", "closed", "sig", "expected"), CASES)
def test_decide_follows_the_policy_table(group: GroupState, remaining: int, waiting: int,
                                         closed: bool, sig: int | None,
                                         expected: Action) -> None:
    obs = Observation(group=group, remaining_restarts=remaining, nodes_waiting=waiting,
                      job_closed=closed, signal=sig)
    assert decide(obs) is expected


# (group, remaining restarts, a peer restarted our round, nodes waiting) -> action
PEER_RESTART_CASES = [
    (H, 2, True, 0, Action.RESTART),  # follow the peer, and count it like the peer did
    (H, 1, True, 3, Action.RESTART),
    (H, 0, True, 0, Action.GIVE_UP),  # the budget is spent: the job cannot go on
    (F, 1, True, 0, Action.RESTART),  # our own failure: the same restart
    (S, 1, True, 0, Action.FINISH),  # our workers are done; nothing to restart
    (H, 1, False, 0, Action.WATCH),
]


@pytest.mark.parametrize(("group", "remaining", "peer_restart", "waiting", "expected"),
                         PEER_RESTART_CASES)
def test_a_peer_restart_restarts_this_node_too(group: GroupState, remaining: int,
                                               peer_restart: bool, waiting: int,
                                               expected: Action) -> None:
    obs = Observation(group=group, remaining_restarts=remaining, nodes_waiting=waiting,
                      peer_restart=peer_restart)
    assert decide(obs) is expected


@pytest.mark.parametrize(("codes", "expected"), [
    ([None, None], H),
    ([0, None, None], H),
    ([0, 0, 0], S),
    ([0], S),
    ([None, 1, None], F),
    ([0, -9], F),  # killed by SIGKILL
    ([None, None, 2], F),
])
def test_group_state_summarises_exit_codes(codes: list[int | None], expected: GroupState) -> None:
    assert group_state(codes) is expected


# (group, remaining restarts, a peer left our round gracefully, job closed, signal) -> action
PEER_LEFT_CASES = [
    (H, 0, True, False, None, Action.REJOIN),  # go on without it, free of charge
    (F, 0, True, False, None, Action.REJOIN),  # our workers lost their peers there: no fault
    (F, 2, True, False, None, Action.REJOIN),  # ...and no restart spent on it
    (S, 0, True, False, None, Action.FINISH),
    (F, 1, True, True, None, Action.GIVE_UP),  # closed: the job ends, no new round
    (F, 0, True, True, None, Action.GIVE_UP),
    (H, 1, True, True, None, Action.STOP_FOR_PEER),
    (H, 1, True, False, signal.SIGTERM, Action.STOP_FOR_SIGNAL),
]


@pytest.mark.parametrize(("group", "remaining", "peer_left", "closed", "sig", "expected"),
                         PEER_LEFT_CASES)
def test_a_graceful_leave_of_a_peer_makes_a_free_new_round(group: GroupState, remaining: int,
                                                           peer_left: bool, closed: bool,
                                                           sig: int | None,
                                                           expected: Action) -> None:
    obs = Observation(group=group, remaining_restarts=remaining, peer_left=peer_left,
                      job_closed=closed, signal=sig)
    assert decide(obs) is expected


# exit codes (None: running) -> state, with --on-worker-failure=continue (keep_going)
KEEP_GOING_CASES = [
    ([None, None, -9], H),  # a worker was killed: the others go on
    ([0, None, 1], H),
    ([0, 0, -9], S),  # the survivors finished the job
    ([1, 0, 0], S),
    ([-9, 1, 1], F),  # nobody succeeded
    ([0, 0, 0], S),
    ([None, None, None], H),
]


@pytest.mark.parametrize(("codes", "expected"), KEEP_GOING_CASES)
def test_with_keep_going_a_failed_worker_fails_the_group_only_if_none_succeeds(
        codes: list[int | None], expected: GroupState) -> None:
    assert group_state(codes, keep_going=True) is expected
    # torchrun's behaviour stays the default: any failure fails the group
    assert group_state(codes) is (F if any(c not in (None, 0) for c in codes) else expected)


# (exit codes, --on-worker-failure=continue, restarts left) -> local ranks restarted alone
REPLACE_CASES = [
    ([None, -9, None], True, 1, [1]),
    ([None, -9, 1, None], True, 1, [1]),  # one restart left: the lowest local rank gets it
    ([None, -9, 1, None], True, 3, [1, 2]),
    ([None, -9, None], True, 0, []),  # no restart left: the others go on without it
    ([None, -9, None], False, 1, []),  # by default a failure stops the group instead
    ([-9, 0, 0], True, 1, []),  # nobody runs: decide() handles the group
    ([None, 0, None], True, 1, []),  # exited 0: finished, not failed
]


@pytest.mark.parametrize(("codes", "keep_going", "remaining", "expected"), REPLACE_CASES)
def test_failed_workers_are_restarted_alone_only_while_others_run(
        codes: list[int | None], keep_going: bool, remaining: int, expected: list[int]) -> None:
    assert workers_to_replace(codes, keep_going, remaining) == expected
