"""ZeroRedundancyOptimizer through a shrink and a grow back, against torch's plain optimizer.

World 3, real processes, DDP and ZeRO over SGD with momentum (tests/integration/
_zero_elastic_ranks.py): the rank started as 1 is SIGKILLed at a step boundary, the other two
shrink and re-wrap, train at world 2, then admit its replacement (a fresh process with a fresh
optimizer) and train on at world 3. What docs/recovery.md promises, step by step: the optimizer
state a survivor held is kept through both re-wraps (re-sharded); the state the lost rank held
is gone and starts afresh, as a fresh optimizer's; a replacement gets its share of the kept
state, and steps its shard with the members' settings (they lower ``lr`` once shrunk, as a
scheduler would; the replacement's constructor has the first one). The reference is one
process with ``torch.optim.SGD`` over the whole model, whose gradient at each step is the mean
over the ranks that trained it, and which forgets the momentum of the one weight the lost rank
owned (torch's greedy partition at world 3 gives it the 20-element weight: largest first, each
to the least loaded rank) when it dies, and lowers ``lr`` there. The same run checks that
torch.distributed's own functions see each world (one world: the facade's groups are torch's
groups).
"""

from __future__ import annotations

import torch

from ringtorch.testing import run_ranks
from tests.integration import _zero_elastic_ranks as ranks

STEPS = 12


def _reference(worlds: list[list[int]], lost_at: int) -> list[torch.Tensor]:
    net = ranks.model()
    opt = torch.optim.SGD(net.parameters(), lr=ranks.LR, momentum=ranks.MOMENTUM)
    lost = list(net.parameters())[1]  # the 20-element weight: rank 1's shard at world 3
    for step, world in enumerate(worlds):
        if step == lost_at:
            opt.state.pop(lost)
            for group in opt.param_groups:
                group["lr"] = ranks.LR_AFTER_SHRINK
        opt.zero_grad()
        losses = [torch.nn.functional.mse_loss(net(x), y)
                  for x, y in (ranks.batch(step, slot) for slot in world)]
        (sum(losses) / len(losses)).backward()  # DDP's gradient: the mean over the ranks
        opt.step()
    return [p.detach() for p in net.parameters()]


def test_zero_keeps_the_survivors_state_through_a_shrink_and_a_grow_back(tmp_path) -> None:
    results = run_ranks(ranks.train, 3, args=(STEPS, str(tmp_path)), timeout=120)
    worlds = results[0]["worlds"]
    lost_at = ranks.KILL_AFTER + 1
    grown_at = lost_at + ranks.AT_TWO
    assert worlds == ([[0, 1, 2]] * lost_at + [[0, 2]] * ranks.AT_TWO
                      + [[0, 1, 2]] * (STEPS - grown_at)), worlds
    for got in results:
        assert got["world"] == [0, 1, 2]
    assert results[2]["worlds"] == worlds
    assert results[1]["worlds"] == worlds[grown_at:]  # the replacement's steps
    # torch.distributed's own functions see the same worlds: its default group is the
    # shrunk one, then the grown one, and the subgroup new_group([0, 2]) rebuilt by the shrink
    # is in its table (both survivors are in it: ranks 0 and 1 now)
    for slot, rank in ((0, 0), (2, 1)):
        assert results[slot]["torch"]["shrunk"] == {
            "size": 2, "rank": rank, "sum": 101.0, "sub": (2, rank, 101.0)}
    for slot in range(3):
        assert results[slot]["torch"]["grown"] == {"size": 3, "rank": slot, "sum": 111.0}
    expected = _reference(worlds, lost_at)
    for rank, got in enumerate(results):
        for i, (mine, want) in enumerate(zip(got["params"], expected, strict=True)):
            torch.testing.assert_close(mine, want, msg=f"rank {rank}, parameter {i}")
