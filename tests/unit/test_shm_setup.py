"""shm_setup.pinned_apart: ranks spin long before yielding only when each may run on one CPU
of its own (then no rank ever holds the CPU its peer needs); shm_setup.spread_out: the ranks
together may run on at least one CPU each (plans that rely on private caches need it)."""

from __future__ import annotations

import pytest

from ringtorch._wire.shm_setup import pinned_apart, spread_out


@pytest.mark.parametrize(("cpus", "apart"), [
    ([[0], [1]], True),
    ([[0], [1], [2], [3]], True),
    ([[0], [0]], False),  # two ranks bound to one CPU
    ([[0], [1], [0]], False),  # world 3 on 2 cores, round robin
    ([[0, 1], [0, 1]], False),  # unbound: the scheduler may put both on one CPU
    ([[0], [0, 1]], False),
    ([[0], None], False),  # a record without CPUs (an older rank)
])
def test_only_ranks_bound_to_distinct_single_cpus_are_apart(cpus, apart):
    records = [{"host": "h"} if c is None else {"host": "h", "cpus": c} for c in cpus]
    assert pinned_apart(records) is apart


@pytest.mark.parametrize(("cpus", "spread"), [
    ([[0, 1], [0, 1]], True),  # unbound, 2 ranks on 2 cores
    ([[0], [1]], True),
    ([[0, 1], [0, 1], [0, 1]], False),  # world 3 on 2 cores
    ([[0], [0]], False),
    ([[0], None], False),
])
def test_spread_out_when_the_ranks_together_have_a_cpu_each(cpus, spread):
    records = [{"host": "h"} if c is None else {"host": "h", "cpus": c} for c in cpus]
    assert spread_out(records) is spread
