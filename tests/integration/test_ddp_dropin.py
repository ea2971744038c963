"""DistributedDataParallel as a drop-in: pickling, no_sync with unused parameters, GradBucket.

Each program (tests/integration/_ddp_dropin_ranks.py) runs twice on 2 ranks, under torch's
own DDP on gloo and under ringtorch's, and ringtorch must give what torch gives: the same
gradients and weights (to fp tolerance), the same flags, the same error texts.
"""

from __future__ import annotations

from typing import Any

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

