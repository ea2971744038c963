"""The same script under torch.distributed (gloo) and ringtorch.distributed gives the same results.

tests/compat/_same_script.py is written once against a ``dist`` module; it runs here under
both, with odd and even world sizes, and every value each rank got must be equal (the data
are small integers, so every reduction order gives the same bits).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.compat import _same_script as S


def _same(a: Any, b: Any, where: str) -> None:
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where}: torch {a} vs ringtorch {b}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


@pytest.mark.parametrize("ws", [2, 3])
def test_torch_gloo_and_ringtorch_give_the_same_results(ws: int) -> None:
    theirs = run_ranks(S.script, ws, args=("torch.distributed",), timeout=90)
    ours = run_ranks(S.script, ws, args=("ringtorch.distributed",), timeout=90)
    for rank in range(ws):
        _same(theirs[rank], ours[rank], f"rank {rank}")
