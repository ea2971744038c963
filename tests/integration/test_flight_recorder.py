"""The flight recorder: every rank's last operations, with sizes, call sites and times.

Real ranks run real collectives, point-to-point operations and RPC calls and dump their
record; the expected values come from what the rank code did (its own lines, its tensors'
sizes), never from the recorder's code.
"""

from __future__ import annotations

import json

import pytest

from ringtorch._observe import hang_report
from ringtorch.collectives.algorithms.select import ALGORITHMS
from ringtorch.testing import run_ranks
from tests.integration import _recorder_ranks as ranks


def _by_op(entries: list[dict], op: str) -> list[dict]:
    return [e for e in entries if e["op"] == op]


@pytest.mark.parametrize("transport", ["shm", "sockets"])
def test_each_operation_is_recorded_with_its_sizes_site_times_and_route(transport: str) -> None:
    env = {"RINGTORCH_SHM": "1" if transport == "shm" else "0",
           "RINGTORCH_ALGORITHMS": "all_reduce=ring"}
    results = run_ranks(ranks.mixed_operations, 2, args=(transport,), env=env)
    for rank, result in enumerate(results):
        record, lines, path = result["record"], result["lines"], result["file"]
        json.dumps(record)  # plain JSON data
        assert record["format"] == "ringtorch-flight-record" and record["version"] == 1
        assert record["rank"] == rank and record["world_size"] == 2 and record["dropped"] == 0
        assert record["groups"]["0"]["ranks"] == [0, 1]
        assert record["groups"]["0"]["issued"] == 4  # all_reduce, broadcast, all_gather, barrier
        entries = record["entries"]
        collectives = [e for e in entries if e["kind"] == "collective"]
        assert [e["seq"] for e in collectives] == [0, 1, 2, 3]
        assert [e["id"] for e in entries] == sorted(e["id"] for e in entries)
        (reduce,) = _by_op(entries, "allreduce")
        assert reduce["call"] == {"op": "all_reduce", "seq": 0, "dtype": "float32",
                                  "redop": "SUM", "root": -1, "nbytes": 1024}
        assert reduce["nbytes"] == 1024 and reduce["state"] == "completed"
        assert reduce["site"] == f"{path}:{lines['all_reduce']}"
        assert reduce["function"] == "mixed_operations"
        assert reduce["transport"] == transport
        if transport == "sockets":
            assert reduce["algorithm"] == "ring"  # forced, so the record must say so
        else:
            assert reduce["algorithm"] == "slots"
        (bcast,) = _by_op(entries, "broadcast")
        assert bcast["call"]["root"] == 1 and bcast["call"]["dtype"] == "int64"
        assert bcast["nbytes"] == 24 and bcast["site"] == f"{path}:{lines['broadcast']}"
        assert bcast["algorithm"] in (set(ALGORITHMS["broadcast"]) if transport == "sockets"
                                      else {"slots"})
        gather = collectives[2]
        assert gather["call"]["op"] == "all_gather" and gather["call"]["nbytes"] == 8
        barrier = collectives[3]
        assert barrier["op"] == "barrier" and barrier["call"]["op"] == "barrier"
        (p2p,) = [e for e in entries if e["kind"] == "p2p"]
        mine = "send" if rank == 0 else "recv"
        assert p2p["op"] == mine and p2p["peer"] == 1 - rank and p2p["nbytes"] == 20
        assert p2p["site"] == f"{path}:{lines[mine]}" and p2p["state"] == "completed"
        for e in entries:
            assert e["enqueued_ns"] <= e["started_ns"] <= e["finished_ns"] <= record["dumped_at_ns"]
        assert "error" not in reduce


def test_the_ring_keeps_only_the_last_operations() -> None:
    record, _ = run_ranks(ranks.capacity_bound, 2, args=(8, 30))
    assert record["capacity"] == 8
    assert [e["seq"] for e in record["entries"]] == list(range(22, 30))
    assert record["dropped"] == 22


def test_the_ring_holds_the_operations_themselves_and_keeps_no_tensor_alive() -> None:
    # the Works' tensors are dropped by the rank: once finished, an operation the ring still
    # holds must not keep them (nor its profiler range, which records its inputs)
    for result in run_ranks(ranks.tensors_left_alive, 2):
        assert result["held"] and result["entries"] == 5
        assert result["alive"] == []


def test_a_failed_collective_is_recorded_as_failed_with_its_error() -> None:
    records = run_ranks(ranks.failed_collective, 2)
    for record, op in zip(records, ["allreduce", "broadcast"], strict=True):
        (entry,) = _by_op(record["entries"], op)
        assert entry["state"] == "failed"
        kind = entry["error"].split(":")[0]  # what the rank raised: DistBackendError or
        assert kind in {"DistBackendError", "ShmPeerError"}  # its shared-memory subclass
        assert "all_reduce" in entry["error"] and "broadcast" in entry["error"]
        assert entry["finished_ns"] >= entry["started_ns"] > 0


def test_rpc_calls_are_recorded_on_the_caller_with_callee_and_function() -> None:
    record = run_ranks(ranks.rpc_calls, 2)[0]
    entries = [e for e in record["entries"] if e["kind"] == "rpc"]
    assert [(e["op"], e["peer"], e["detail"]) for e in entries] == [
        ("rpc_sync", "w1", "torch.add"), ("rpc_async", "w1", "torch.mul"),
        ("remote", "w1", "torch.ones"), ("rpc_sync", "w1", "builtins.int")]
    assert all(e["group"] == "w0" for e in entries)
    assert [e["state"] for e in entries] == ["completed"] * 3 + ["failed"]
    assert entries[3]["error"].startswith("ValueError")
    assert all(e["site"].endswith(".py:" + e["site"].rsplit(":", 1)[1]) for e in entries)
    assert all("_recorder_ranks.py" in e["site"] for e in entries)


def test_zero_capacity_turns_the_recorder_off() -> None:
    result = run_ranks(ranks.recorder_off, 2, env={"RINGTORCH_FLIGHT_RECORDER": "0"})[0]
    assert result == {"enabled": False, "entries": []}


def test_a_negative_capacity_is_refused_with_the_reason() -> None:
    from ringtorch.distributed import flight_recorder

    with pytest.raises(ValueError, match="capacity must be >= 0, got -1"):
        flight_recorder.reset(-1)


def test_the_call_site_is_the_users_frame_whatever_the_shape_of_the_stack() -> None:
    # Through the public function, inside a user's helper, a group's method called
    # directly, and one line that calls the public function and the helper in turn: each
    # repeated, so that sites the recorder remembers are checked as well as sites it walks.
    # A point-to-point call in the same loop has its own line on each rank.
    for rank, result in enumerate(run_ranks(ranks.sites_of_each_call_shape, 2)):
        path, lines = result["file"], result["lines"]
        one_round = [lines["direct"], lines["helper"], lines["group method"],
                     lines["through a variable"], lines["helper"]]
        assert result["sites"] == [f"{path}:{line}" for line in one_round * 3]
        send_line, recv_line = result["p2p_lines"]
        assert result["p2p"] == [f"{path}:{(send_line, recv_line)[rank]}"] * 3


def test_an_object_collective_is_one_operation_whose_tensor_collectives_are_its_parts() -> None:
    results = run_ranks(ranks.object_collectives, 2)
    for rank, result in enumerate(results):
        entries, lines, path = result["record"]["entries"], result["lines"], result["file"]
        (whole,) = _by_op(entries, "all_gather_object")
        assert (whole["kind"], whole["state"], whole["seq"]) == ("collective", "completed", -1)
        assert whole["site"] == f"{path}:{lines['all_gather_object']}"
        # its parts: the sizes' all_gather, then the frames' (the tensor collectives it ran)
        parts = [e for e in entries if e.get("parent", {}).get("id") == whole["id"]]
        assert [(e["op"], e["seq"]) for e in parts] == [("allgather", 0), ("allgather", 1)]
        assert all(e["parent"]["op"] == "all_gather_object" for e in parts)
        assert whole["started_ns"] <= parts[0]["started_ns"]
        assert parts[-1]["finished_ns"] <= whole["finished_ns"]
        assert hang_report._describe(parts[0]).endswith(" of all_gather_object")
        op = "send_object_list" if rank == 0 else "recv_object_list"
        (p2p,) = _by_op(entries, op)
        assert (p2p["kind"], p2p["peer"], p2p["state"]) == ("p2p", 1 - rank, "completed")
        assert p2p["site"] == f"{path}:{lines[op]}"
        p2p_parts = [e for e in entries if e.get("parent", {}).get("id") == p2p["id"]]
        assert [e["op"] for e in p2p_parts] == (
            ["send", "send"] if rank == 0 else ["recv_anysource", "recv"])
        # nothing else was recorded: every tensor operation is a part of an object one
        assert len(entries) == 2 + len(parts) + len(p2p_parts)
