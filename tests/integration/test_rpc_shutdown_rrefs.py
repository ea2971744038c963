"""Graceful shutdown deletes a worker's user RRefs only once every worker has reached it:
until then a call running there may still use the RRefs it was given (3 real workers)."""

from __future__ import annotations

import torch

from ringtorch.testing import run_ranks
from tests.integration import _rpc_shutdown_ranks as R


def test_a_call_running_on_a_worker_in_shutdown_can_use_the_rrefs_it_received() -> None:
    result = run_ranks(R.scenario, 3, timeout=60)[0]
    assert torch.equal(result, torch.arange(3.0) * 2)
