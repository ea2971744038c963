"""The backend door under torch's own libraries and life cycle, and what ringtorch adds to it.

Plain torch programs (tests/integration/_door_ranks.py) on backend "ringtorch": torch's Work
API, functional collectives (with a gradient check), new_group, DeviceMesh and DTensor;
store=, file:// and "cpu:ringtorch"; destroy, re-init and abort; the messages of calls that
cannot run; a killed rank named on the survivors. Expected values are worked out here by
hand from the ranks' inputs.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _door_ranks as D

WS = 4
RANKS = Path(D.__file__)


def _line_of(comment: str) -> int:
    return next(n for n, text in enumerate(RANKS.read_text().splitlines(), 1)
                if text.endswith(comment))


@functools.cache
def features() -> list[dict]:
    return run_ranks(D.features, WS, timeout=120)


@functools.cache
def lifecycle(tmp: str) -> list[dict]:
    return run_ranks(D.lifecycle, 2, args=(f"{tmp}/init",), timeout=120)


@pytest.fixture(scope="module")
def life(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return lifecycle(str(tmp_path_factory.mktemp("door")))


def test_works_wait_complete_and_carry_torchs_future_value() -> None:
    total = float(sum(range(WS)))
    for res in features():
        assert res["wait"] is True
        completed, exception, tensor = res["work"]
        assert completed and exception is None
        torch.testing.assert_close(tensor, torch.full((3,), total))
        torch.testing.assert_close(res["future"], [torch.full((2,), float(WS))])
        torch.testing.assert_close(res["then"], torch.full((2,), 2.0 * WS))


def test_functional_collectives_find_the_group_by_name_and_differentiate() -> None:
    scale = sum(r + 1 for r in range(WS))
    for rank, res in enumerate(features()):
        torch.testing.assert_close(res["fc"], torch.arange(4.0) * scale)
        torch.testing.assert_close(res["c10d_functional"],
                                   torch.full((2,), sum(range(WS)) / WS))
        # d/dx of sum(gathered * arange): every rank's upstream gradient summed over the
        # ranks (all_gather's backward is a reduce-scatter), times this rank's factor
        upstream = torch.arange(2.0 * rank, 2.0 * rank + 2)
        torch.testing.assert_close(res["grad"], upstream * WS * (rank + 1))


def test_new_group_and_device_mesh_groups_run_on_ringtorch() -> None:
    for rank, res in enumerate(features()):
        if rank % 2 == 0:
            assert res["evens"][0] == "ringtorch"
            torch.testing.assert_close(res["evens"][1],
                                       torch.tensor([float(sum(range(0, WS, 2)))]))
        dp_peers = [r for r in range(WS) if r % (WS // 2) == rank % (WS // 2)]
        tp_peers = [r for r in range(WS) if r // (WS // 2) == rank // (WS // 2)]
        for dim, peers in (("dp", dp_peers), ("tp", tp_peers)):
            backend, value = res[dim]
            assert backend == "ringtorch"
            torch.testing.assert_close(value, torch.tensor([float(sum(peers))]), msg=dim)


def test_a_device_mesh_dimension_can_be_overridden_to_ringtorch() -> None:
    for rank, res in enumerate(run_ranks(D.mesh_override, WS, timeout=60)):
        dp_peers = [r for r in range(WS) if r % (WS // 2) == rank % (WS // 2)]
        tp_peers = [r for r in range(WS) if r // (WS // 2) == rank // (WS // 2)]
        assert res == {"dp": ("gloo", float(sum(dp_peers))),
                       "tp": ("ringtorch", float(sum(tp_peers)))}, res


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_torchs_ddp_and_fsdp2_train_on_ringtorch_as_one_process_on_the_whole_batch(
        wrapper: str) -> None:
    ws = 2
    results = run_ranks(getattr(D, wrapper), ws, timeout=60)
    # both average the ranks' gradients: one process stepping on the mean of their losses
    model = D.ddp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        optimizer.zero_grad()
        (sum(model(D.ddp_batch(r, step)).square().sum() for r in range(ws)) / ws).backward()
        optimizer.step()
    for rank, params in enumerate(results):
        for got, want in zip(params, model.parameters(), strict=True):
            torch.testing.assert_close(got, want.detach(), msg=lambda m, r=rank: f"rank {r}: {m}")


def test_dtensor_redistributes_shard_to_replicate() -> None:
    full = torch.arange(WS * 2 * 3, dtype=torch.float32).view(WS * 2, 3)
    for rank, res in enumerate(features()):
        torch.testing.assert_close(res["shard"], full[2 * rank: 2 * rank + 2])
        torch.testing.assert_close(res["replicate"], full)


def test_split_group_is_refused_by_torch_on_a_cpu_only_default_group() -> None:
    # torch splits only groups bound to an accelerator; it says so before any backend runs
    for res in features():
        assert res["split_group"] == ("No device associated with the default pg, not safe "
                                      "to split any process groups")


def test_store_file_init_device_string_destroy_reinit_and_abort(life: list[dict]) -> None:
    for res in life:
        assert res["store"] == 2.0 and res["file"] == 4.0
        assert res["again"] == ("cpu:ringtorch", 6.0)
        assert res["after_destroy"] is False and res["after_abort"] is False


def test_torchs_backend_only_extras_are_refused_in_torchs_words(life: list[dict]) -> None:
    for res in life:
        assert res["set_pg_timeout"] == [
            "Set timeout is now only supported for either nccl or gloo."]
        assert res["time_estimator"].startswith(
            "collective time estimator is not supported in the current version of backend "
            "<RingtorchGroup ")


def test_work_wait_gives_up_at_its_own_timeout_and_the_operation_goes_on(
        life: list[dict]) -> None:
    kind, message, completed = life[0]["wait_timeout"]
    assert (kind, completed) == ("DistBackendError", False)
    assert message == ("broadcast #1 on group '0' did not complete within 0:00:00.200000 "
                       "(Work.wait timed out; the operation itself keeps its own deadline)")


def test_calls_that_cannot_run_say_why_in_torchs_words_where_torch_has_them(
        life: list[dict]) -> None:
    said = life[0]["errors"]
    for case in ("MAX on complex", "bad splits"):
        assert said[case][0] == said[case][1], case  # word for word what gloo says
    assert said["BAND on float"][0] == (said["BAND on float"][1] + " torch.float32")
    assert said["AVG on int"][0] == (
        "RuntimeError: all_reduce: ReduceOp.AVG needs a floating or complex dtype, got "
        "torch.int64: the average of integers is not an integer (torch's gloo fails the same "
        "way); use SUM and divide, or convert the tensor to a floating dtype")
    assert said["meta tensor"][0].startswith(
        "RuntimeError: ProcessGroup::allreduce: ringtorch's native backend runs on CPU "
        "tensors; got a tensor on meta")


def test_a_killed_rank_is_named_on_every_survivor_within_seconds() -> None:
    results = run_ranks(D.killed, 3, args=(2,), timeout=60)
    assert results[2] == {"signal": 9}
    for rank, res in enumerate(results[:2]):
        # the survivor learns it from the socket (PeerLostError) or from the shared-memory
        # segment the dead rank held (ShmPeerError), whichever comes first
        assert re.match(rf"(PeerLostError|ShmPeerError): all_reduce #1 \(float32, 4 bytes, op "
                        rf"SUM\) on group '0' \(rank {rank}\) failed: rank 2 ",
                        res["error"]), res["error"]
        assert res["seconds"] < 5.0
        # the Work says it completed, unsuccessfully, and holds the error wait() raised
        assert res["work"] == (True, False, True)
        assert res["later"] in ("PeerLostError", "ShmPeerError", "DistBackendError")


def test_the_flight_recorder_sees_the_calls_torchs_libraries_made() -> None:
    for rank, res in enumerate(features()):
        ops, groups, site = res["recorded"]
        # distribute_tensor scatters the shards; Shard(0) -> Replicate gathers them
        assert ops[-2:] == ["scatter", "all_gather_single"], ops
        # the call site is the program's line, above torch's and ringtorch's frames
        assert site == f"{RANKS}:{_line_of('# recorded here')}", site
        assert res["sites"] == [f"{RANKS}:{_line_of('# recorded three times')}"] * 3
        assert groups["0"] == "ringtorch" and set(groups.values()) == {"ringtorch"}
        # the default group (the 1-D mesh uses it), the 2-D mesh's dp and tp groups, evens
        assert len(groups) == 3 + (rank % 2 == 0), groups


def test_a_stalled_collective_warns_then_times_out_naming_the_missing_rank() -> None:
    results = run_ranks(D.stalled, 2, timeout=60, env={"RINGTORCH_STALL_WARNING_S": "1"})
    error, log = results[0]["error"], results[0]["log"]
    assert re.match(r"\w+Error: all_reduce #1 \(float32, 4 bytes, op SUM\) on group '0' "
                    r"\(rank 0\) timed out after 0:00:03 .*: ranks \[1\] did not arrive "
                    r"\(rank 1 is at all_reduce #0 .*\) \(hang report: (\S+)\)$", error), error
    assert re.search(r"all_reduce #1 \(float32, 4 bytes, op SUM\) on group '0' \(rank 0\) has "
                     r"waited \d+\.\d s: ranks \[1\] have not arrived", log), log
    # the report names the line of the program each rank is at, above torch's frames
    assert f"rank 0: in allreduce #1 (4 bytes, float32), running at {RANKS}:" in log, log
