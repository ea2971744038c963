"""One rank of a torch program on backend "ringtorch" that loses a rank mid-training and
shrinks: run by test_backend_door_shrink.py.

    python _door_shrink_ranks.py VICTIM STEP   # env:// (RANK, WORLD_SIZE, MASTER_ADDR/PORT)

Every rank all_reduces once per step; rank VICTIM kills itself (SIGKILL) at step STEP. The
survivors catch the error, try torch's checks of shrink_group's arguments, shrink the default
group and run one all_reduce, one functional all_reduce and one DDP step on the new world, then
print one JSON line (``RESULT {...}``) of what they saw. Expected values are the test's.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import ringtorch.c10d


def _error_of(call: Any) -> str:
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def main(victim: int, step_of_death: int) -> None:
    dist.init_process_group("ringtorch")
    rank, size = dist.get_rank(), dist.get_world_size()
    seen: dict[str, Any] = {"rank": rank, "pid": os.getpid()}
    t = torch.ones(8)
    try:
        for step in range(1000):
            if rank == victim and step == step_of_death:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(t)
            t.fill_(1.0)
    except Exception as exc:
        seen["error"] = f"{type(exc).__name__}: {exc}"
    seen["errors"] = {
        "empty": _error_of(lambda: ringtorch.c10d.shrink_group([])),
        "self": _error_of(lambda: ringtorch.c10d.shrink_group([rank])),
        "range": _error_of(lambda: ringtorch.c10d.shrink_group([size])),
        "flags": _error_of(lambda: ringtorch.c10d.shrink_group([victim], shrink_flags=7)),
        "torch": _error_of(lambda: dist.shrink_group([victim])),
    }
    new = ringtorch.c10d.shrink_group([victim])
    seen["default_is_new"] = dist.group.WORLD is new
    seen["rank_after"], seen["size_after"] = dist.get_rank(), dist.get_world_size()
    seen["backend_after"] = dist.get_backend()
    from ringtorch._observe.hang_ask import HANG

    seen["hang_asks"] = HANG.ranks() if HANG.store is not None else None  # the survivors
    x = torch.arange(4, dtype=torch.float64) + 10.0 * rank  # old rank: the test knows it
    dist.all_reduce(x)
    seen["all_reduce"] = x.tolist()
    y = funcol.all_reduce(torch.full((3,), float(rank)), "sum", new)
    seen["functional"] = y.wait().tolist() if hasattr(y, "wait") else y.tolist()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1, bias=False, dtype=torch.float64)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    batch = torch.full((2, 3), float(rank + 1), dtype=torch.float64)
    ddp(batch).sum().backward()
    seen["ddp_grad"] = model.weight.grad.flatten().tolist()
    seen["weight"] = model.weight.detach().flatten().tolist()
    dist.destroy_process_group()
    print("RESULT " + json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
