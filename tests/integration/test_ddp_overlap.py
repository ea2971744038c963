"""Communication overlaps backward: early buckets are reduced while later gradients are computed.

The model's first layer has a backward that sleeps 1.5 s, so its gradients come last and late.
With one parameter per bucket, the buckets of the later layers are launched as soon as their
gradients exist; the test checks, from the order of recorded events (no timing), that the first
bucket's all_reduce has not only started but finished before the first layer's gradient exists.
"""

from __future__ import annotations

from ringtorch.testing import run_ranks
from tests.integration import _ddp_ranks as ranks


def test_first_bucket_is_reduced_before_the_last_gradient_is_computed():
    for rank, events in enumerate(run_ranks(ranks.overlap, 2, timeout=60)):
        order = [e for e in events]
        grad_at = order.index(("grad", "l1.weight"))
        assert order.index(("launch", 0)) < grad_at, f"rank {rank}: {order}"
        assert order.index(("done", 0)) < grad_at, f"rank {rank}: {order}"
        launches = [e[1] for e in order if e[0] == "launch"]
        assert launches == list(range(8)), f"rank {rank}: buckets launched out of order {order}"
        assert order[-1] == ("backward returned", None)
        assert all(("done", i) in order[:-1] for i in range(8)), f"rank {rank}: {order}"
