"""FSDP1's FULL_STATE_DICT with ``offload_to_cpu=True`` returns the model's state on CPU.

torch 2.13 frees the live CPU storage when it "offloads" a CPU module and then reads it:
``RuntimeError: setStorage ...`` (use_orig_params=False) or a segmentation fault (True).
``ringtorch.distributed.fsdp.FullyShardedDataParallel`` returns the unsharded model's state
dict instead, for both rank0_only values and both use_orig_params values, at world 2 on
backend "ringtorch" (tests/integration/_fsdp_state_ranks.py); the expected state is the
single-process model's, built here. torch's own class is run the same way, in the harness's
rank processes (so its segmentation fault kills a rank, not pytest), to show the fix is needed.
"""

from __future__ import annotations

import pytest
import torch

from ringtorch.testing import RankFailed, run_ranks
from tests.integration import _fsdp_state_ranks as R

CASES = [(use_orig_params, rank0_only) for use_orig_params in (True, False)
         for rank0_only in (True, False)]


def test_full_state_dict_offloaded_to_cpu_is_the_unsharded_models() -> None:
    results = run_ranks(R.full_state_dicts, 2, args=("ringtorch", CASES), timeout=120)
    reference = R.model()
    expected = reference.state_dict()
    loss = reference(torch.ones(2, 8)).sum().item()
    for rank, res in enumerate(results):
        for use_orig_params, rank0_only in CASES:
            state, loss_after, sd_type, offload_after = res[f"{use_orig_params} {rank0_only}"]
            where = f"rank {rank}, use_orig_params={use_orig_params}, rank0_only={rank0_only}"
            if rank0_only and rank != 0:
                assert state == {}, where  # torch's rank0_only: the others return nothing
            else:
                assert sorted(state) == sorted(expected), where
                for name, value in expected.items():
                    assert state[name].device == torch.device("cpu"), where
                    torch.testing.assert_close(state[name], value, rtol=0, atol=0,
                                               msg=lambda m, n=name, w=where: f"{n} ({w}): {m}")
            # the live parameters are intact afterwards, and the settings were restored
            assert loss_after == pytest.approx(loss, rel=1e-6), where
            assert (str(sd_type), offload_after) == ("StateDictType.FULL_STATE_DICT", False)


def test_torchs_own_class_fails_on_the_same_program() -> None:
    # use_orig_params=False: the storage is gone when the state dict reads it
    for res in run_ranks(R.full_state_dicts, 2, args=("torch", [(False, False)]), timeout=120):
        assert res["False False"] == (
            "setStorage: sizes [128], strides [1], storage offset 0, and itemsize 4 requiring "
            "a storage size of 512 are out of bounds for storage of size 0")
    # use_orig_params=True: it clones freed memory
    with pytest.raises(RankFailed, match=r"process exited with code -11 without a result"):
        run_ranks(R.full_state_dicts, 2, args=("torch", [(True, False)]), timeout=120)
