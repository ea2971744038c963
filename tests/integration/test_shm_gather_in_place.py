"""all_gather and reduce_scatter through ringtorch.distributed on shared memory move the
caller's own memory: the one-tensor forms (all_gather_into_tensor, reduce_scatter_tensor), the
list forms with separate tensors and the coalesced forms hand the shared-memory algorithms the
caller's tensors themselves (no scratch buffer, no clone, no copy afterwards), and the results
are right. Expected values come from NumPy."""

from __future__ import annotations

import numpy as np

from ringtorch.testing import run_ranks
from tests.integration import _shm_gather_ranks as ranks

N = ranks.N


def _inputs(rank: int, part: int) -> np.ndarray:
    return np.arange(N, dtype=np.float32) * (rank + 1) + 1000 * part


def test_every_gather_and_scatter_form_moves_the_callers_memory_at_world_2() -> None:
    p = 2
    results = run_ranks(ranks.every_form, p, timeout=90, env={"RINGTORCH_SHM": "1"})
    gathered = np.concatenate([_inputs(r, 0) for r in range(p)])
    for rank, got in enumerate(results):
        reduced = [np.sum([_inputs(r, j) for r in range(p)], axis=0) for j in range(p)]
        res = got["results"]
        np.testing.assert_array_equal(res["all_gather_into_tensor"], gathered)
        np.testing.assert_array_equal(np.concatenate(res["all_gather"]), gathered)
        np.testing.assert_array_equal(res["allgather_into_tensor_coalesced/0"], gathered)
        np.testing.assert_array_equal(res["allgather_into_tensor_coalesced/1"], 2 * gathered)
        for name in ("reduce_scatter_tensor", "reduce_scatter",
                     "reduce_scatter_tensor_coalesced/0"):
            np.testing.assert_array_equal(res[name], reduced[rank], err_msg=name)
        # the algorithms were handed exactly the caller's tensors, in this order
        names = list(got["handed"])
        assert [kind for kind, _ in got["seen"]] == got["kinds"], f"rank {rank}"
        seen = {name: addresses for name, (_, addresses) in zip(names, got["seen"], strict=True)}
        assert seen == got["handed"], f"rank {rank}: a form went through a copy"
