"""The hang report's analysis on made-up flight records and stacks (hang_report.py is a pure
function of the ranks' answers): who is late, who mismatched, what an RPC waits for, which
frames are worth showing. The records are written here by hand in the documented format."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringtorch._observe.hang_ask import is_hang, save_report, thread_id
from ringtorch._observe.hang_report import (
    Answer,
    analyse,
    format_report,
    parse_stacks,
    useful_frames,
)
from ringtorch._observe.hang_signal import parse_header, stacks_header

MAIN = "0x00007f0000000001"
READER = "0x00007f0000000002"


def _entry(seq: int, op: str = "allreduce", state: str = "completed", nbytes: int = 64,
           site: str = "/job/train.py:10") -> dict:
    return {"id": seq, "kind": "collective", "group": "0", "op": op, "seq": seq, "state": state,
            "site": site, "nbytes": nbytes,
            "call": {"op": op, "seq": seq, "dtype": "float32", "redop": "SUM", "root": -1,
                     "nbytes": nbytes}}


def _flight(rank: int, entries: list[dict], ranks: list[int]) -> dict:
    return {"format": "ringtorch-flight-record", "rank": rank, "entries": entries,
            "groups": {"0": {"ranks": ranks, "rank": rank, "size": len(ranks)}}}


def _stacks(main_frames: list[tuple[str, int, str]]) -> str:
    lines = [f"Thread {READER} (most recent call first):",
             '  File "/usr/lib/python3.11/threading.py", line 320 in wait',
             "", f"Current thread {MAIN} (most recent call first):"]
    lines += [f'  File "{f}", line {n} in {fn}' for f, n, fn in main_frames]
    return "\n".join(lines) + "\n"


def test_the_rank_that_did_not_arrive_is_the_one_everybody_waits_for() -> None:
    ranks = [0, 1, 2]
    answers = [Answer(r, _flight(r, [_entry(0), _entry(1, state="running", site="/job/t.py:12")],
                                 ranks)) for r in (0, 2)]
    answers.insert(1, Answer(1, _flight(1, [_entry(0)], ranks),
                             _stacks([("/job/t.py", 30, "load"), ("/job/t.py", 12, "main")]),
                             MAIN))
    facts = analyse(answers, 3, "test")
    assert facts["culprits"] == [1]
    group = facts["groups"]["0"]
    assert (group["diverge_seq"], group["late"], group["waiting"]) == (1, [1], [0, 2])
    text = format_report(facts)
    assert "  rank 1: done with allreduce #0 (64 bytes, float32) at /job/train.py:10; not in a " \
           "collective\n" in text
    assert ("  first divergence: allreduce #1 (64 bytes, float32): ranks [1] did not arrive; "
            "ranks [0, 2] are waiting in it\n") in text
    assert ("rank 1 is doing:\n  main thread 0x00007f0000000001:\n"
            '    File "/job/t.py", line 30 in load\n    File "/job/t.py", line 12 in main\n') in text


def test_different_ops_at_one_sequence_number_are_a_mismatch() -> None:
    answers = [Answer(0, _flight(0, [_entry(0), _entry(1, "allreduce", "failed")], [0, 1])),
               Answer(1, _flight(1, [_entry(0), _entry(1, "broadcast", "failed", 32,
                                                       "/job/t.py:9")], [0, 1]))]
    facts = analyse(answers, 2, "test")
    assert facts["mismatches"] == [{"group": "0", "seq": 1, "calls": {
        0: "allreduce #1 (64 bytes, float32) at /job/train.py:10",
        1: "broadcast #1 (32 bytes, float32) at /job/t.py:9"}}]
    text = format_report(facts)
    assert ("  first divergence: #1: the ranks called different collectives; ranks [0, 1] "
            "failed in it\n") in text
    assert ("MISMATCH on group '0' at #1: rank 0 called allreduce #1 (64 bytes, float32) at "
            "/job/train.py:10; rank 1 called broadcast #1 (32 bytes, float32) at /job/t.py:9\n"
            ) in text


def test_same_op_with_different_sizes_is_a_mismatch_too() -> None:
    answers = [Answer(r, _flight(r, [_entry(0, nbytes=64 * (r + 1), state="running")], [0, 1]))
               for r in (0, 1)]
    assert [m["seq"] for m in analyse(answers, 2, "test")["mismatches"]] == [0]


def test_ranks_in_step_give_no_divergence_and_no_culprit() -> None:
    answers = [Answer(r, _flight(r, [_entry(0), _entry(1)], [0, 1])) for r in (0, 1)]
    facts = analyse(answers, 2, "test")
    assert facts["groups"]["0"]["diverge_seq"] is None and facts["culprits"] == []
    assert "  every rank is in step\n" in format_report(facts)


def test_records_dropped_from_a_ring_do_not_count_as_missing() -> None:
    # rank 1's ring kept only seq 5 on: it is not "late" for seq 3
    answers = [Answer(0, _flight(0, [_entry(s) for s in range(3, 6)], [0, 1])),
               Answer(1, _flight(1, [_entry(5)], [0, 1]))]
    assert analyse(answers, 2, "test")["groups"]["0"]["diverge_seq"] is None


def test_a_silent_rank_is_named_and_suspected_when_nobody_is_visibly_late() -> None:
    answers = [Answer(0, _flight(0, [_entry(0, state="running")], [0, 1])),
               Answer(1, None, _stacks([("/job/t.py", 44, "spin")]), MAIN,
                      note="did not answer within 3 s; stacks by SIGUSR1")]
    facts = analyse(answers, 2, "test")
    assert facts["culprits"] == [1]
    text = format_report(facts)
    assert "rank 1: did not answer within 3 s; stacks by SIGUSR1\n" in text
    assert "  rank 1: unknown (no flight record)\n" in text
    assert 'rank 1 is doing:\n  main thread 0x00007f0000000001:\n    File "/job/t.py", line 44' \
        in text


def test_a_rank_that_published_nothing_is_reported_silent() -> None:
    facts = analyse([Answer(0, _flight(0, [], [0, 1]))], 2, "test")
    assert facts["silent"] == {1: "did not publish where it runs (no process group yet?)"}


def test_an_rpc_in_flight_points_at_its_callee() -> None:
    call = {"id": 0, "kind": "rpc", "group": "trainer", "op": "rpc_sync", "seq": -1,
            "state": "running", "site": "/job/t.py:7", "peer": "ps", "detail": "step",
            "nbytes": -1}
    answers = [Answer(0, {"entries": [call], "groups": {}}, name="trainer"),
               Answer(1, {"entries": [], "groups": {}}, _stacks([("/job/ps.py", 3, "step")]),
                      MAIN, name="ps")]
    facts = analyse(answers, 2, "test")
    assert facts["culprits"] == [1]
    assert "rank 0 waits for rpc_sync to ps (rank 1) (step) at /job/t.py:7\n" in \
        format_report(facts)


def test_parse_stacks_keeps_the_last_of_several_dumps() -> None:
    text = _stacks([("/job/a.py", 1, "old")]) + _stacks([("/job/a.py", 2, "new")])
    threads = parse_stacks(text)
    assert [t.ident for t in threads] == [READER, MAIN]
    assert threads[1].current and threads[1].frames == [("/job/a.py", 2, "new")]


def test_useful_frames_keep_the_innermost_then_the_users_own() -> None:
    import threading

    (thread,) = [t for t in parse_stacks(_stacks([
        (threading.__file__, 320, "wait"), (threading.__file__, 600, "wait"),
        ("/job/t.py", 5, "step"), ("/job/t.py", 9, "<module>")])) if t.ident == MAIN]
    assert useful_frames(thread) == [(threading.__file__, 320, "wait"), ("/job/t.py", 5, "step"),
                                     ("/job/t.py", 9, "<module>")]


def test_the_stacks_header_round_trips() -> None:
    info = {"pid": 42, "host": "node-a", "main_thread": thread_id(0x7f01)}
    assert parse_header(stacks_header(3, info)) == {"rank": 3, "pid": 42, "host": "node-a",
                                                   "main_thread": "0x0000000000007f01"}
    assert parse_header("Current thread 0x01 (most recent call first):") is None


@pytest.mark.parametrize(("message", "expected"), [
    ("all_reduce #1 on group '0' timed out after 0:00:03 (Timed out waiting 3000ms: the "
     "collective's timeout): ranks [2] did not arrive", True),
    ("collective mismatch on group '0': rank 1 called broadcast #1", True),
    ("all_reduce #1 failed: the group was aborted: rank 1 (pid 9) died", False),
])
def test_only_timeouts_and_mismatches_make_a_report(message: str, expected: bool) -> None:
    assert is_hang(message) is expected


def test_reports_saved_within_one_second_do_not_overwrite_each_other(tmp_path: Path) -> None:
    paths = [save_report(f"report {i}\n", str(tmp_path), "ringrun") for i in range(3)]
    assert len(set(paths)) == 3
    assert [Path(p).read_text() for p in paths] == ["report 0\n", "report 1\n", "report 2\n"]


def test_after_a_shrink_ranks_are_named_by_their_new_number_and_the_one_they_started_as() -> None:
    # started as ranks 0-3; rank 1 died and the others shrank: the world is [0, 2, 3], where
    # 2 is now 1 and 3 is now 2; the report asks those three only
    world = [0, 2, 3]

    def flight(rank: int, entries: list[dict]) -> dict:
        record = _flight(rank, entries, world)
        record["groups"] = {"0~1.0": record["groups"]["0"]}
        return record

    def shrunk(seq: int, state: str = "completed") -> dict:
        return {**_entry(seq, state=state), "group": "0~1.0"}

    old = _entry(7, state="failed")  # the records of the group that was shrunk
    answers = [Answer(0, flight(0, [old, shrunk(0), shrunk(1, "running")]), now=0),
               Answer(2, flight(2, [old, shrunk(0)]), _stacks([("/job/t.py", 5, "main")]),
                      MAIN, now=1),
               Answer(3, None, note="did not answer within 3 s; stacks by SIGUSR1", now=2)]
    facts = analyse(answers, len(world), "test", world)
    assert facts["silent"] == {3: "did not answer within 3 s; stacks by SIGUSR1"}  # not 1
    assert facts["renumbered"] == {2: 1, 3: 2}
    text = format_report(facts)
    assert text.startswith("=== ringtorch hang report: 3 rank(s) ===\n")
    assert "rank 2 (was 3): did not answer within 3 s; stacks by SIGUSR1\n" in text
    assert "group '0~1.0' (ranks 0, 1 (was 2), 2 (was 3)):\n" in text
    assert "group '0' (ranks 0, 1 (was 2), no longer in use):\n" in text
    assert "  rank 1 (was 2): done with allreduce #0 (64 bytes, float32)" in text
    assert ("  first divergence: allreduce #1 (64 bytes, float32): ranks [1 (was 2)] did not "
            "arrive; ranks [0] are waiting in it\n") in text
    assert "everybody waits for: ranks [1 (was 2)]\n" in text
    assert 'rank 1 (was 2) is doing:\n  main thread 0x00007f0000000001:\n    File "/job/t.py"' \
        in text


def test_a_rank_behind_in_a_shrunk_away_group_is_not_whom_everybody_waits_for() -> None:
    # ranks 0 and 2 entered allreduce #1 of group '0' before it was shrunk away; rank 1 never
    # did. In the group they use now all three are in step: nobody holds anybody up.
    def flight(rank: int, old: list[dict]) -> dict:
        new = [{**_entry(0), "group": "0~1.0"}]
        return {"format": "ringtorch-flight-record", "rank": rank, "entries": old + new,
                "groups": {"0~1.0": {"ranks": [0, 1, 2], "rank": rank, "size": 3}}}

    ahead = [_entry(0), _entry(1, state="failed")]
    answers = [Answer(0, flight(0, ahead)), Answer(1, flight(1, [_entry(0)])),
               Answer(2, flight(2, ahead))]
    facts = analyse(answers, 3, "test")
    assert facts["groups"]["0"]["gone"] and facts["groups"]["0"]["late"] == [1]
    assert facts["culprits"] == []
