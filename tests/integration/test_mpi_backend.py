"""The MPI backend under mpirun, world sizes 1 to 4: what is particular to MPI.

Each world is launched once (``mpirun -n N python tests/mpi/backend_ops.py``, shared with
tests/conformance/test_backend.py, which checks the backend conformance suite the same run
went through); its ranks run every case and save what they got. World 2 runs at
MPI_THREAD_SERIALIZED, the others at MPI_THREAD_MULTIPLE. Needs the ``mpi`` extra (mpi4py and
an MPI whose mpirun is in the venv's bin or on PATH).
"""

from __future__ import annotations

import pickle
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.integration._mpi_jobs import SCRIPTS, THREAD_LEVEL, launch, mpirun, run
from tests.integration._mpi_leftovers import OpenMpiLeftovers

WORLDS = [1, 2, 3, 4]


@pytest.fixture(scope="module", autouse=True)
def _no_open_mpi_files_left_in_dev_shm() -> Iterator[None]:
    """Jobs that kill or abort ranks leave Open MPI's segment files behind; run() removes the
    ones its job created, and none may be left when the module is done."""
    shm = OpenMpiLeftovers()
    yield
    assert shm.left() == set(), "Open MPI segment files left in /dev/shm"


@pytest.fixture(scope="module", params=WORLDS, ids=lambda n: f"world{n}")
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return launch(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"world{n}")
def multi_world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return launch(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=[3, 4], ids=lambda n: f"world{n}")
def sub_world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return launch(request.param, tmp_path_factory)


def _case(world: list[dict], name: str) -> list[dict]:
    """One case's result on every rank; fails with the rank's traceback if it raised."""
    results = []
    for rank, book in enumerate(world):
        assert name in book, f"rank {rank} did not run {name}"
        expected_error = name.startswith(("errors/", "p2p/recv_", "p2p/neg", "timeout/",
                                          "facade/monitored_barrier", "facade/local_sync_group",
                                          "facade/shrink_group"))
        if "traceback" in book[name] and not expected_error:
            pytest.fail(f"rank {rank}, {name}:\n{book[name]['traceback']}")
        results.append(book[name])
    return results


def test_every_rank_gets_its_rank_and_the_world_size_from_mpi(world: list[dict]) -> None:
    for rank, book in enumerate(world):
        assert (book["meta"]["rank"], book["meta"]["size"]) == (rank, len(world))


def test_mpi_gives_the_thread_level_asked_for(world: list[dict]) -> None:
    expected = "MPI_THREAD_SERIALIZED" if len(world) in THREAD_LEVEL else "MPI_THREAD_MULTIPLE"
    assert {book["meta"]["thread_level"] for book in world} == {expected}


def test_unsupported_dtype_or_op_raises_a_clear_error_before_sending(world: list[dict]) -> None:
    expected = {
        "errors/fp8_sum": ("RuntimeError",
                           "all_reduce: no RedOpType.SUM reduction exists for dtype torch.float8_e4m3fn"),
        "errors/band_float": ("RuntimeError",
                              "Cannot use ReduceOp.BAND with non-integral dtype torch.float32"),
        "errors/max_complex": ("ValueError", "all_reduce does not support RedOpType.MAX on complex tensors"),
    }
    for name, error in expected.items():
        for rank, r in enumerate(_case(world, name)):
            assert r.get("error") == error, f"{name} rank {rank}: {r}"
    for r in _case(world, "errors/avg_int"):
        assert r["error"][0] == "RuntimeError"
        assert r["error"][1].startswith("all_reduce: ReduceOp.AVG needs a floating or complex dtype")


def test_a_group_whose_ranks_are_not_mpis_is_refused(world: list[dict]) -> None:
    n = len(world)
    for rank, r in enumerate(_case(world, "errors/ranks_not_mpis")):
        assert r["error"] == (
            "DistBackendError",
            f"MPI backend for group 'wrong': the group's ranks [{rank + 1}] (this process is "
            f"group rank 0) do not match MPI_COMM_WORLD, where this process is rank {rank} of "
            f"{n}: start the job with mpirun and let init_process_group('mpi') take the ranks "
            f"from MPI")


def test_a_closed_backend_refuses_every_operation(world: list[dict]) -> None:
    for r in _case(world, "errors/after_close"):
        assert r["error"] == ("DistBackendError", "barrier on group 'default': the MPI backend is closed")


def test_recv_of_a_message_of_another_size_raises(multi_world: list[dict]) -> None:
    shorter = _case(multi_world, "p2p/recv_shorter_message")[0]
    assert shorter["error"] == ("DistBackendError", "recv on group 'default' from rank 1 (tag 12): "
                                                    "expected 8 bytes, the message had 4")
    longer = _case(multi_world, "p2p/recv_longer_message")[0]
    assert longer["error"][0] == "DistBackendError"
    assert longer["error"][1].startswith(
        "recv from rank 1 (tag 12) on group 'default' failed in MPI: ")
    assert "truncated" in longer["error"][1]  # Open MPI: MPI_ERR_TRUNCATE: message truncated


def test_a_negative_tag_is_refused(multi_world: list[dict]) -> None:
    for r in _case(multi_world, "p2p/negative_tag"):
        assert r["error"][0] == "ValueError"
        assert re.fullmatch(r"send: tag -1 is out of range for the MPI backend: MPI tags go "
                            r"from 0 to \d+", r["error"][1])


def test_mismatched_collectives_raise_on_every_rank_naming_each_call(multi_world: list[dict]) -> None:
    n = len(multi_world)
    results = _case(multi_world, "errors/mismatched_collective")
    seq = results[0]["seq"]
    calls = "; ".join([f"rank 0 called all_reduce #{seq} (SUM, torch.float32, 12 bytes)"]
                      + [f"rank {r} called broadcast #{seq} (12 bytes, root 0)" for r in range(1, n)])
    for rank, r in enumerate(results):
        name = "all_reduce" if rank == 0 else "broadcast"
        assert r["error"] == ("DistBackendError", f"{name} #{seq} on group 'default': the ranks called "
                              f"different collectives or disagree on their arguments: {calls}")
    for r in _case(multi_world, "errors/mismatched_size"):
        assert r["error"][0] == "DistBackendError"
        assert f"rank {n - 1} called all_reduce #{seq + 1} (SUM, torch.float32, 16 bytes)" in r["error"][1]
    for r in _case(multi_world, "errors/after_mismatch_still_works"):
        assert r["out"] == n


def test_subgroups_reduce_and_talk_over_their_own_communicators(sub_world: list[dict]) -> None:
    n = len(sub_world)
    for name, ranks in (("tail", list(range(1, n))), ("ends", [0, n - 1])):
        results = {g: sub_world[g][f"subgroup/{name}"] for g in ranks}
        for r in results.values():
            assert "traceback" not in r, r.get("traceback")
        expected = np.sum([results[g]["in"] for g in ranks], axis=0)
        for group_rank, g in enumerate(ranks):
            r = results[g]
            assert r["group_rank"] == group_rank
            np.testing.assert_array_equal(r["out"], expected, err_msg=f"{name} global rank {g}")
        assert results[ranks[0]]["peer_global"] == ranks[-1]
        assert results[ranks[-1]]["peer_global"] == ranks[0]
        for g in set(range(n)) - set(ranks):
            assert f"subgroup/{name}" not in sub_world[g]


def test_a_subgroup_forms_even_when_its_members_name_it_differently(sub_world: list[dict]) -> None:
    ends = [0, len(sub_world) - 1]
    for rank, book in enumerate(sub_world):
        r = book["subgroup/names_differ"]
        assert "traceback" not in r, r.get("traceback")
        assert r["out"] == (2.0 if rank in ends else None)


def test_groups_run_collectives_at_once_from_their_own_threads(sub_world: list[dict]) -> None:
    n = len(sub_world)
    for name, ranks in (("world", list(range(n))), ("tail", list(range(1, n))), ("ends", [0, n - 1])):
        for g in ranks:
            r = sub_world[g][f"concurrent/{name}"]
            assert "traceback" not in r, r.get("traceback")
            assert r["out"] == [float(len(ranks))] * 20


def test_a_receive_nobody_answers_times_out_and_the_group_goes_on(multi_world: list[dict]) -> None:
    timed_out = _case(multi_world, "timeout/recv")[0]
    assert timed_out["error"][0] == "DistBackendError"
    assert re.fullmatch(r"recv from rank 1 \(tag 99\) on group 'default' timed out after \d+\.\d s "
                        r"\(Timed out waiting \d+ms\)", timed_out["error"][1])
    assert 0.3 <= timed_out["seconds"] < 10
    for r in _case(multi_world, "timeout/recv_then_barrier"):
        assert "error" not in r


def test_under_serialized_mpi_a_late_collective_times_out_and_aborts_the_group(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    world2 = launch(2, tmp_path_factory)  # the MPI_THREAD_SERIALIZED world
    first, last = _case(world2, "timeout/collective")
    for r, seconds in ((first, 0.3), (last, 1.0)):
        assert r["error"][0] == "DistBackendError"
        assert re.fullmatch(r"barrier on group 'default' timed out after \d+\.\d s \(Timed out "
                            r"waiting \d+ms\), and MPI cannot "
                            r"take the operation back, so the group cannot be used any more",
                            r["error"][1])
        assert seconds <= r["seconds"] < seconds + 10
    for r in _case(world2, "timeout/after_collective_timeout"):
        assert r["error"][1].startswith("barrier on group 'default': the MPI backend was aborted: "
                                        "barrier on group 'default' timed out after")


def test_init_process_group_takes_rank_and_size_from_mpi_and_warns_about_given_ones(
        world: list[dict]) -> None:
    n = len(world)
    for rank, r in enumerate(_case(world, "facade/init")):
        assert "error" not in r
        assert r["warnings"] == ["For MPI backend, world_size (9) and rank (7) are ignored since "
                                 "they are assigned by the MPI runtime."]
        assert _case(world, "facade/identity")[rank]["out"] == (rank, n, "mpi", True)


def test_facade_collectives_are_in_the_flight_record(world: list[dict]) -> None:
    for r in _case(world, "facade/flight_record"):
        assert r["out"]["op"] == "allreduce" and r["out"]["state"] == "completed"
        assert r["out"]["call"]["dtype"] == "float64" and r["out"]["call"]["nbytes"] == 48
        assert (r["out"]["transport"], r["out"]["algorithm"]) == ("mpi", "the MPI library's")


def test_facade_subgroups_reduce_over_their_members_only(world: list[dict]) -> None:
    n = len(world)
    members = list(range(n - 1, -1, -2))
    for rank, r in enumerate(_case(world, "facade/subgroup")):
        assert r["member"] == (rank in members)
        expected = sum(m + 1 for m in members) if rank in members else rank + 1
        assert r["out"] == [float(expected)] * 2, f"rank {rank}"


def test_facade_batch_isend_irecv_around_a_ring_of_large_messages(world: list[dict]) -> None:
    n = len(world)
    for rank, r in enumerate(_case(world, "facade/ring_isend_irecv")):
        left = float((rank - 1) % n)
        assert r["out"] == (left, left), f"rank {rank}"


def test_facade_object_collectives(world: list[dict]) -> None:
    n = len(world)
    for r in _case(world, "facade/objects"):
        gathered, box = r["out"]
        assert gathered == [{"rank": k, "tag": "x" * k} for k in range(n)]
        assert box == f"from rank 0 of {n}"


def test_monitored_barrier_is_refused_on_mpi_as_torch_refuses_it(world: list[dict]) -> None:
    for r in _case(world, "facade/monitored_barrier"):
        assert r["error"] == ("ValueError", "monitored_barrier is only implemented for GLOO backend.")
    for r in _case(world, "facade/destroy"):
        assert "error" not in r


def test_new_group_with_local_synchronization_is_refused_on_mpi_as_torch_refuses_it(
        world: list[dict]) -> None:
    for r in _case(world, "facade/local_sync_group"):
        assert r["error"] == ("ValueError", "MPI backend doesn't support use_local_synchronization=True")


def test_shrink_group_is_refused_on_mpi_as_torch_refuses_it_on_backends_other_than_nccl(
        world: list[dict]) -> None:
    expected = (("ValueError", "Cannot shrink a process group with size 1. Group must have at "
                 "least 2 ranks to support shrinking.") if len(world) == 1 else
                ("TypeError", "Process group backend for '0' does not support shrinking "
                 "operations."))
    for r in _case(world, "facade/shrink_group"):
        assert r["error"] == expected
    for r in _case(world, "facade/destroy"):  # the refusal left the world usable to the end
        assert "error" not in r


def _singleton(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "seen.pkl"
    done = run([sys.executable, str(SCRIPTS / "singleton.py"), str(out), *args], timeout=60)
    assert done.returncode == 0, done.stdout[-4000:]
    return pickle.loads(out.read_bytes())


def test_outside_mpirun_the_world_has_one_rank_and_a_warning_says_why(tmp_path: Path) -> None:
    seen = _singleton(tmp_path)
    assert not seen["mpi_loaded_by_import"], "importing the MPI backend must not load MPI"
    assert seen["rank_and_size"] == (0, 1)
    assert seen["all_reduce"] == [1.5, -2.0]
    assert seen["warnings"] == [
        "init_process_group('mpi'): this process was not started by an MPI launcher "
        "(no OMPI_COMM_WORLD_*, PMI_*, PMIX_RANK or SLURM_PROCID variables), so MPI runs it "
        "alone: world size 1. Start the job with `mpirun -n N python script.py` (or srun)."]


def test_mpi_without_thread_support_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    seen = _singleton(tmp_path, "single")
    assert seen["error"] == (
        "DistBackendError",
        "the MPI backend needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE, but MPI was "
        "initialised with MPI_THREAD_SINGLE: groups call MPI from their own threads. Leave "
        "mpi4py.rc.thread_level at its default ('multiple') before `from mpi4py import MPI`, "
        "or use an MPI built with thread support")


def test_a_rank_that_dies_makes_the_launcher_end_the_whole_job() -> None:
    start = time.monotonic()
    done = run([*mpirun(), "-n", "2", sys.executable, str(SCRIPTS / "dead_rank.py")], timeout=60)
    assert "rank 1 exits now" in done.stdout
    assert "rank 0 returned" not in done.stdout
    assert done.returncode != 0
    assert time.monotonic() - start < 30


def test_abort_ends_the_whole_job_through_mpi_abort_and_says_why() -> None:
    start = time.monotonic()
    done = run([*mpirun(), "-n", "2", sys.executable, str(SCRIPTS / "dead_rank.py"), "abort"],
                timeout=60)
    assert ("ringtorch: the MPI backend of group 'default' aborts the MPI job: the test asked "
            "for it") in done.stdout
    assert "returned" not in done.stdout
    assert done.returncode != 0
    assert time.monotonic() - start < 30


@pytest.mark.parametrize(("env", "expected"), [
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}, (2, 4)),      # Open MPI
    ({"PMI_RANK": "1", "PMI_SIZE": "3"}, (1, 3)),                              # MPICH Hydra
    ({"PMIX_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, (0, 2)),                 # PMIx
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}, (5, 8)),                      # srun
    ({"PMI_RANK": "x", "PMI_SIZE": "3"}, None),                                # garbage
    ({}, None),                                                                # no launcher
])
def test_the_launcher_is_recognised_from_its_environment_without_loading_mpi(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: tuple[int, int] | None) -> None:
    from ringtorch.collectives.backends import mpi_env

    for name in [v for pair in mpi_env._LAUNCHER_VARIABLES for v in pair]:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert mpi_env.launcher_rank_and_size() == expected
    assert mpi_env.launched_by_mpi() == (expected is not None)


def test_without_mpi4py_the_backend_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from ringtorch.collectives.backends import mpi_env

    monkeypatch.setattr(mpi_env, "_mpi_available", False)
    monkeypatch.setattr(mpi_env, "_MPI", None)  # as in a process that never loaded MPI
    assert not mpi_env.is_mpi_available()
    with pytest.raises(RuntimeError, match=r"^the MPI backend needs mpi4py and an MPI library, and "
                       r"mpi4py cannot be imported: install them with `pip install ringtorch\[mpi\]`"):
        mpi_env.init_mpi()
