"""The same script under torch.distributed (gloo) and ringtorch.distributed gives the same results.

tests/compat/_same_script.py is written once against a ``dist`` module; it runs here under
both, with odd and even world sizes, and every value each rank got must be equal (the data
are small integers, so every reduction order gives the same bits).
"""

from __future__ import annotations

import pytest

from ringtorch.testing import run_ranks
from tests.compat import _same_script as S
from tests.compat._compare import assert_same


@pytest.mark.parametrize("ws", [2, 3])
def test_torch_gloo_and_ringtorch_give_the_same_results(ws: int) -> None:
    theirs = run_ranks(S.script, ws, args=("torch.distributed",), timeout=90)
    ours = run_ranks(S.script, ws, args=("ringtorch.distributed",), timeout=90)
    for rank in range(ws):
        assert_same(theirs[rank], ours[rank], f"rank {rank}")
