"""DistributedDataParallel as a drop-in: pickling, no_sync with unused parameters, GradBucket.

Each program (tests/integration/_ddp_dropin_ranks.py) runs twice on 2 ranks, under torch's
own DDP on gloo and under ringtorch's, and ringtorch must give what torch gives: the same
gradients and weights (to fp tolerance), the same flags, the same error texts.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _ddp_dropin_ranks as R

LIBS = ("torch", "ringtorch")


def _both(fn: Any, *args: Any) -> dict[str, list[Any]]:
    return {lib: run_ranks(fn, 2, args=(lib, *args), timeout=90) for lib in LIBS}


def _assert_close(theirs: Any, ours: Any, where: str) -> None:
    """Same structure; tensors close, None where torch has None."""
    if isinstance(theirs, dict):
        assert theirs.keys() == ours.keys(), where
        for key in theirs:
            _assert_close(theirs[key], ours[key], f"{where}.{key}")
    elif isinstance(theirs, (list, tuple)):
        assert len(theirs) == len(ours), where
        for i, (a, b) in enumerate(zip(theirs, ours, strict=True)):
            _assert_close(a, b, f"{where}[{i}]")
    elif isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), f"{where}: torch has a tensor, ringtorch {ours!r}"
        torch.testing.assert_close(ours, theirs, msg=lambda m: f"{where}: {m}")
    else:
        assert theirs == ours, f"{where}: torch {theirs!r} vs ringtorch {ours!r}"


def _assert_ranks_agree(per_rank: list[Any], where: str) -> None:
    for rank in range(1, len(per_rank)):
        _assert_close(per_rank[0], per_rank[rank], f"{where}: rank 0 vs rank {rank}")


@pytest.fixture(scope="module")
def pickled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("ddp-pickles")
    saved = _both(R.pickle_and_save, str(folder))
    loaded = _both(R.load_and_train, str(folder))
    return {"saved": saved, "loaded": loaded, "folder": folder}


def test_a_pickled_ddp_model_loads_in_the_same_job_on_the_default_group(pickled) -> None:
    saved = pickled["saved"]
    for rank, result in enumerate(saved["ringtorch"]):
        assert result["copy_is_ddp"] and result["copy_on_default_group"], rank
    _assert_close(saved["torch"], saved["ringtorch"], "save and reload in one job")
    # the copy's gradients are averaged: every rank sees the same ones
    _assert_ranks_agree([r["copy_trained"] for r in saved["ringtorch"]], "reloaded copy")


def test_a_pickled_ddp_model_trains_averaged_in_a_new_job_as_torchs(pickled) -> None:
    loaded = pickled["loaded"]
    _assert_close(loaded["torch"], loaded["ringtorch"], "loaded in a new job")
    _assert_ranks_agree(loaded["ringtorch"], "loaded in a new job")
    # the new job carries on from the saved weights: the same as training on in the first job
    _assert_close(pickled["saved"]["ringtorch"][0]["copy_trained"], loaded["ringtorch"][0],
                  "new job vs same job")


def test_pickling_a_ddp_model_on_another_group_fails_with_torchs_message(pickled) -> None:
    theirs = pickled["saved"]["torch"][0]["other_group_error"]
    assert theirs is not None and "only supported when using DDP with the default" in theirs
    for result in pickled["saved"]["ringtorch"]:
        assert result["other_group_error"] == theirs


def test_unpickling_without_a_default_group_fails_with_torchs_message(pickled) -> None:
    messages = {}
    for lib in LIBS:
        data = (pickled["folder"] / f"{lib}-0.pt").read_bytes()
        with pytest.raises(ValueError) as info:
            torch.load(io.BytesIO(data), weights_only=False)
        messages[lib] = str(info.value)
    assert "Default process group has not been initialized" in messages["torch"]
    assert messages["ringtorch"] == messages["torch"]


def test_no_sync_gradients_of_parameters_used_on_one_rank_are_averaged_as_torchs() -> None:
    got = _both(R.no_sync_unused)
    torch_ranks, ring_ranks = got["torch"], got["ringtorch"]
    # before the synced step rank 0 never used b, rank 1 did
    assert ring_ranks[0]["local"]["b.weight"] is None
    assert ring_ranks[1]["local"]["b.weight"] is not None
    _assert_close(torch_ranks, ring_ranks, "no_sync then synced steps")
    for key in ("synced", "after"):
        _assert_ranks_agree([r[key] for r in ring_ranks], key)
    # the synced step averages b's accumulated gradient although no rank used b in it
    expected = ring_ranks[1]["local"]["b.weight"] / 2
    torch.testing.assert_close(ring_ranks[0]["synced"]["b.weight"], expected)
    # the next synced step starts counting afresh: unused everywhere, b keeps no gradient
    assert [r["after"]["b.weight"] for r in ring_ranks] == [None, None]


def test_a_hook_annotated_with_dist_grad_bucket_is_defined_registered_and_called() -> None:
    got = _both(R.hook_annotated_with_grad_bucket)
    for rank, result in enumerate(got["ringtorch"]):
        assert result["calls"], rank
        assert all(call[0] for call in result["calls"]), "the hook got a dist.GradBucket"
    _assert_close([r["seen"] for r in got["torch"]], [r["seen"] for r in got["ringtorch"]],
                  "training with the hook")
    # one bucket here under both: same index and last flag, the same gradients and parameters
    # (ringtorch lays a bucket out in reverse parameter order: docs/design/ddp-buckets.md)
    def summary(calls: list[Any]) -> list[Any]:
        return [(ok, index, last, sorted(grads), sorted(params))
                for ok, index, last, grads, params in calls]

    assert summary(got["ringtorch"][0]["calls"]) == summary(got["torch"][0]["calls"])


def test_grad_bucket_is_exported_with_torchs_methods() -> None:
    import torch.distributed as tdist

    import ringtorch.distributed as rdist
    from ringtorch.nn.parallel import GradBucket

    assert rdist.GradBucket is GradBucket and "GradBucket" in rdist.__all__

    def public(cls: type) -> set[str]:
        return {n for n in dir(cls) if not n.startswith("_")}

    assert public(tdist.GradBucket) == public(rdist.GradBucket)


def test_the_module_path_of_torchs_ddp_gives_ringtorchs_class() -> None:
    import torch.nn.parallel.distributed as torch_module

    import ringtorch.nn.parallel
    from ringtorch.nn.parallel.distributed import DistributedDataParallel, _find_tensors

    assert DistributedDataParallel is ringtorch.nn.parallel.DistributedDataParallel
    module = ringtorch.nn.parallel.distributed
    assert module.__all__ == torch_module.__all__
    for name in ("Join", "JoinHook", "Joinable", "ReduceOp", "gather", "scatter_kwargs",
                 "_DDPJoinHook", "_find_tensors"):
        assert hasattr(torch_module, name) and hasattr(module, name), name
    t = [torch.ones(1), torch.zeros(2)]
    nested = {"a": t[0], "b": [1, (t[1], "x")]}
    assert [id(x) for x in _find_tensors(nested)] == \
        [id(x) for x in torch_module._find_tensors(nested)]

