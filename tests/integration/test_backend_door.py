"""The backend door: a plain torch program on backend "ringtorch" computes what gloo computes.

One job per world size runs every process-group operation twice in the same processes, on
the default group (backend "ringtorch") and on a gloo group (tests/integration/_door_ranks.py),
and the test compares each pair: gloo is the oracle. AVG and PREMUL_SUM, which gloo lacks,
are checked against gloo's SUM scaled here.
"""

from __future__ import annotations

import functools

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _door_ranks as D


@functools.cache
def differential(ws: int) -> list[dict]:
    return run_ranks(D.differential, ws, timeout=120)


@pytest.mark.parametrize("ws", [1, 2, 3, 4])
def test_every_operation_on_backend_ringtorch_matches_gloo(ws: int) -> None:
    results = differential(ws)
    names = [k for k in results[0] if k not in ("backend", "gloo", "dist.monitored_barrier")]
    assert len(names) >= 50, names  # every op, and each reduction over several dtypes
    for rank, res in enumerate(results):
        assert (res["backend"], res["gloo"]) == ("ringtorch", "gloo")
        for name in names:
            door, gloo = res[name]
            if name.endswith(" AVG"):
                gloo = gloo / ws if gloo.is_floating_point() else gloo // ws
            torch.testing.assert_close(door, gloo, rtol=0, atol=0,
                                       msg=lambda m, n=name, r=rank: f"{n} on rank {r}: {m}")


def test_torch_monitored_barrier_admits_gloo_only_the_group_method_is_ringtorchs() -> None:
    # the group's own monitored_barrier ran (the job went on); torch's function says gloo only
    for res in differential(2):
        assert res["dist.monitored_barrier"] == (
            "monitored_barrier is only implemented for GLOO backend.")
