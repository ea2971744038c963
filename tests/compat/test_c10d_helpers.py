"""The helpers libraries import from torch.distributed's modules behave as torch's.

tests/compat/_c10d_helpers.py probes them (default group and store, group names and tags,
non-member checks, argument checks, the object <-> tensor helpers Lightning uses, module-state
sync as DDP-style wrappers call it, the elastic store utilities) under torch gloo and under
ringtorch, in real processes; every value must be the same.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist
from torch.distributed.elastic.utils import store as torch_store_utils

import ringtorch.distributed as rdist
from ringtorch.distributed.elastic.utils import store as ring_store_utils
from ringtorch.testing import run_ranks
from tests.compat import _c10d_helpers as H
from tests.compat._compare import assert_same


def test_private_helpers_behave_as_torchs() -> None:
    theirs = run_ranks(H.probe, 2, args=("torch",), timeout=120)
    ours = run_ranks(H.probe, 2, args=("ringtorch",), timeout=120)
    for rank in range(2):
        assert_same(theirs[rank], ours[rank], f"rank {rank}")
    assert ours[1]["not_in_group"] == (True, False, False)
    assert ours[0]["object"] == {"from": 1, "items": [1, 2]}
    assert ours[1]["synchronized"] == [b"r0", b"r1"]
    # rank 1's module now holds rank 0's values, except the ignored bias
    for name, value in ours[1]["module"].items():
        if name != "0.bias" and value.is_floating_point():
            assert torch.equal(value, ours[0]["module"][name]), name
    assert not torch.equal(ours[1]["module"]["0.bias"], ours[0]["module"]["0.bias"])


@pytest.mark.parametrize(("what", "messages"), [
    ("shape", ["no error", "RuntimeError: [1]: params[1] in this process with sizes [4] appears "
                           "not to match sizes of the same param in process 0."]),
    ("count", ["RuntimeError: DDP expects same model across all ranks, but Rank 0 has 2 params, "
               "while rank 1 has inconsistent 3 params.",
               "RuntimeError: DDP expects same model across all ranks, but Rank 1 has 3 params, "
               "while rank 0 has inconsistent 2 params."]),
])
def test_mismatched_models_are_reported_as_torch(what: str, messages: list[str]) -> None:
    theirs = run_ranks(H.mismatched_model, 2, args=("torch", what), timeout=120)
    ours = run_ranks(H.mismatched_model, 2, args=("ringtorch", what), timeout=120)
    assert ours == theirs == messages


def test_store_barrier_timeout_names_the_missing_rank_as_torch() -> None:
    messages = []
    for store, utils, error in ((tdist.HashStore(), torch_store_utils, tdist.DistStoreError),
                                (rdist.HashStore(), ring_store_utils, rdist.DistStoreError)):
        with pytest.raises(error) as info:
            utils.barrier(store, 2, key_prefix="lonely", barrier_timeout=0.5, rank=0,
                          trace_timeout=0.2)
        messages.append(str(info.value))
    assert messages[0] == messages[1] == (
        "Timed out waiting on barrier on rank 0, for key prefix: lonely (world_size=2, "
        "missing_ranks=[1], timeout=0.5)")
