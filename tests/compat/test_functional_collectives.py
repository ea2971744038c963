"""ringtorch.distributed.nn.functional gives torch's forward results and torch's gradients.

tests/compat/_functional_script.py runs every differentiable collective (rooted ones with a
non-zero root, on the default group and on a second group) under torch (gloo) and under
ringtorch, at odd and even world sizes; every output and every input gradient must be equal.
A subgroup whose ranks are not numbered as the world's, where torch's rooted functions
compare a global rank with a group rank, is checked against gradients computed here.
"""

from __future__ import annotations

import functools

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.compat import _functional_script as S
from tests.compat._compare import assert_same


@functools.cache
def _results(ws: int, library: str) -> list[dict]:
    return run_ranks(S.script, ws, args=(library,), timeout=120)


@pytest.mark.parametrize("ws", [2, 3])
def test_forward_results_and_gradients_are_torchs(ws: int) -> None:
    theirs, ours = _results(ws, "torch"), _results(ws, "ringtorch")
    for rank in range(ws):
        assert theirs[rank].keys() == ours[rank].keys()
        for case in theirs[rank]:
            assert_same(theirs[rank][case], ours[rank][case], f"rank {rank} {case}")


@pytest.mark.parametrize("ws", [2, 3])
def test_every_collective_was_checked_on_both_groups(ws: int) -> None:
    names = {case.split("/")[0] for case in _results(ws, "ringtorch")[0]}
    assert {"broadcast", "gather", "scatter", "reduce", "all_gather", "all_to_all",
            "all_to_all_single", "all_reduce", "reduce_scatter"} <= names
    assert all(f"{name}/pair" in _results(ws, "ringtorch")[1] for name in names)


def _renumbered_group(rank: int, ws: int) -> dict:
    import ringtorch.distributed as dist
    import ringtorch.distributed.nn.functional as F

    dist.init_process_group("gloo")
    tail = dist.new_group([1, 2])  # group ranks 0, 1 are global ranks 1, 2; the root is 2
    out: dict = {}
    if rank in (1, 2):
        x = torch.full((3,), float(rank), requires_grad=True)
        (F.broadcast(x, 2, group=tail) * (rank + 1)).sum().backward()
        out["broadcast"] = x.grad
        y = torch.full((2,), float(rank), requires_grad=True)
        gathered = F.gather(y, 2, group=tail)
        sum((g * (10 * i + rank)).sum() for i, g in enumerate(gathered)).backward()
        out["gather"] = (y.grad, [g.detach() for g in gathered])
        pieces = [torch.full((2,), float(10 * rank + j), requires_grad=True) for j in range(2)]
        (F.scatter(pieces, 2, group=tail) * (rank + 5)).sum().backward()
        out["scatter"] = [p.grad for p in pieces]
    dist.destroy_process_group()
    return out


def test_rooted_collectives_on_a_group_numbered_apart_from_the_world() -> None:
    results = run_ranks(_renumbered_group, 3, timeout=60)
    assert results[0] == {}
    # broadcast from 2: rank 2's input gets both ranks' output gradients, rank 1's nothing
    torch.testing.assert_close(results[2]["broadcast"], torch.full((3,), 2.0 + 3.0))
    torch.testing.assert_close(results[1]["broadcast"], torch.zeros(3))
    # gather to 2: rank 2 holds [y of 1, y of 2]; the gradient of slot i goes to group rank i
    grad, gathered = results[2]["gather"]
    torch.testing.assert_close(gathered, [torch.full((2,), 1.0), torch.full((2,), 2.0)])
    torch.testing.assert_close(results[1]["gather"][0], torch.full((2,), 2.0))   # 10*0 + 2
    torch.testing.assert_close(grad, torch.full((2,), 12.0))                   # 10*1 + 2
    # scatter from 2: group rank i got piece i of rank 2; their gradients come back to it
    torch.testing.assert_close(results[2]["scatter"], [torch.full((2,), 6.0),
                                                       torch.full((2,), 7.0)])
    torch.testing.assert_close(results[1]["scatter"], [torch.zeros(2), torch.zeros(2)])
