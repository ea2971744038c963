"""Rank programs of the shrink tests (module-level, so that run_ranks can start them by name).

A rank that must die forks a child that plays it and is SIGKILLed at the chosen point; the
parent waits for it and reports how it ended, so run_ranks still gets a result from every rank.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

import ringtorch.distributed as dist
from ringtorch.testing import wait_for


def _as_victim(play: Callable[[], Any]) -> dict[str, Any]:
    """Run ``play`` in a forked child that is expected to be SIGKILLed; report its end."""
    pid = os.fork()
    if pid == 0:
        try:
            play()
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    return {"victim_signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}


def _init(rank: int, world_size: int, timeout_s: float = 60.0) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))


def _error_of(fn: Callable[[], Any]) -> tuple[str, str] | None:
    try:
        fn()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


def two_die(rank: int, world_size: int, victims: list[int]) -> dict[str, Any]:
    """``victims`` are SIGKILLed after the first all_reduce; the others shrink them away with
    shrink_group, first from a subgroup of ranks 0-2, then from the default group, and
    all_reduce on each new group."""
    def play() -> None:
        _init(rank, world_size)
        dist.new_group([0, 1, 2])
        dist.all_reduce(torch.ones(4))
        os.kill(os.getpid(), signal.SIGKILL)

    if rank in victims:
        return _as_victim(play)
    _init(rank, world_size)
    trio = dist.new_group([0, 1, 2])
    dist.all_reduce(torch.ones(4))
    error = _error_of(lambda: [dist.all_reduce(torch.ones(4)) for _ in range(1000)])
    refused = _refused_inputs(rank, world_size)
    pair = dist.shrink_group([r for r in victims if r < 3], group=trio)
    p = torch.tensor([float(10 ** rank)])
    dist.all_reduce(p, group=pair)
    subgroup = {"ranks": dist.get_process_group_ranks(pair), "rank": dist.get_rank(pair),
                "size": dist.get_world_size(pair), "sum": p.item(),
                "default_kept": dist.get_world_size() == world_size}
    old = dist.group.WORLD
    group = dist.shrink_group(list(victims))
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    return {"error": error, "rank": dist.get_rank(), "size": dist.get_world_size(),
            "is_default": dist.group.WORLD is group, "old_is_new": old is group,
            "sum": t.tolist(), "ranks": dist.get_process_group_ranks(group),
            "old_call": _error_of(lambda: old.allreduce([torch.ones(1)]).wait()),
            "refused": refused, "subgroup": subgroup}


def _client() -> Any:
    """A store client of the job's store (the one init_process_group's env:// reaches)."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=False, timeout=timedelta(seconds=60))


def _census_store(client: Any) -> Any:
    """The key space of the first shrink of the default group "0" (shrink.py's layout)."""
    return dist.PrefixStore("rt_shrink/1/", dist.PrefixStore(
        "0/", dist.PrefixStore("default_pg", client)))


def _refused_inputs(rank: int, world_size: int) -> list[tuple[str, str] | None]:
    """What shrink_group says to bad arguments (before it touches anything)."""
    checks = [lambda: dist.shrink_group((1,)), lambda: dist.shrink_group([]),
              lambda: dist.shrink_group([1], shrink_flags=2),
              lambda: dist.shrink_group([world_size]), lambda: dist.shrink_group([3, 3]),
              lambda: dist.shrink_group(list(range(world_size))),
              lambda: dist.shrink_group([rank]), lambda: dist.shrink_group(["1"])]
    return [_error_of(check) for check in checks]


def dies_during_shrink(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 3 dies; rank 2 joins the agreement (its census post is in the store) and is
    SIGKILLed there; ranks 0 and 1 start shrinking only then, and must end up alone."""
    if rank == 3:
        def play3() -> None:
            _init(rank, world_size)
            dist.all_reduce(torch.ones(4))
            os.kill(os.getpid(), signal.SIGKILL)
        return _as_victim(play3)
    if rank == 2:
        pid = os.fork()
        if pid == 0:
            try:
                _init(rank, world_size)
                dist.all_reduce(torch.ones(4))
                _error_of(lambda: [dist.all_reduce(torch.ones(4)) for _ in range(1000)])
                dist.shrink_group([3])
            finally:
                os._exit(3)
        client = _client()
        census = _census_store(client)
        census.wait(["0/in/2"])  # rank 2 has taken part in the agreement: it dies now
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        client.set("t/rank2-dead", "1")
        return {"victim": 2}
    _init(rank, world_size)
    dist.all_reduce(torch.ones(4))
    _error_of(lambda: [dist.all_reduce(torch.ones(4)) for _ in range(1000)])
    _client().wait(["t/rank2-dead"])
    began = time.monotonic()
    group = dist.shrink_group([3])
    took = time.monotonic() - began
    t = torch.tensor([10.0 * (rank + 1)])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "size": dist.get_world_size(), "sum": t.item(),
            "name": group.group_name, "took": took}


def frozen_then_resumed(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 2 is stopped (SIGSTOP) mid-job; the others time out, recover without it and train
    on; then it is continued (SIGCONT) and must be refused, loudly, when it tries to recover."""
    if rank != 2:
        _init(rank, world_size, timeout_s=3.0)
        dist.all_reduce(torch.ones(4))
        client = _client()
        client.wait(["t/rank2-stopped"])
        error = _error_of(lambda: dist.all_reduce(torch.ones(4)))
        world = dist.shrink_on_failure()
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        client.add("t/shrunk", 1)
        return {"error": error, "world": (world.rank, world.world_size, world.lost_ranks),
                "sum": t.item()}
    pid = os.fork()
    if pid == 0:
        try:
            _init(rank, world_size, timeout_s=3.0)
            dist.all_reduce(torch.ones(4))
            client = _client()
            client.set("t/rank2-pid", str(os.getpid()))
            client.wait(["t/rank2-stopped"])  # stopped before it can go on
            first = _error_of(lambda: dist.all_reduce(torch.ones(4)))
            refused = _error_of(dist.shrink_on_failure)
            client.set("t/rank2-result", json.dumps([first, refused]))
        finally:
            os._exit(3)
    client = _client()
    client.wait(["t/rank2-pid"])
    os.kill(pid, signal.SIGSTOP)
    client.set("t/rank2-stopped", "1")
    wait_for(lambda: client.add("t/shrunk", 0) >= 2, 60,  # the survivors train on without it
             "the two survivors to shrink and train on", interval=0.01)
    os.kill(pid, signal.SIGCONT)
    client.wait(["t/rank2-result"])
    os.waitpid(pid, 0)
    return {"resumed": client.get("t/rank2-result").decode()}


def store_host_dies(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 0, which hosts the store, dies: the survivors cannot agree and say why."""
    if rank == 0:
        def play0() -> None:
            _init(rank, world_size)
            dist.all_reduce(torch.ones(4))
            os.kill(os.getpid(), signal.SIGKILL)
        return _as_victim(play0)
    _init(rank, world_size)
    dist.all_reduce(torch.ones(4))
    error = _error_of(lambda: [dist.all_reduce(torch.ones(4)) for _ in range(1000)])
    return {"error": error, "shrink": _error_of(dist.shrink_on_failure)}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def _batch(rank: int) -> torch.Tensor:
    return torch.arange(8, dtype=torch.float32).reshape(2, 4) * (rank + 1) / 10


def recovers_ddp_zero_and_subgroups(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 3 dies in a training step; the others call shrink_on_failure, re-wrap DDP and
    ZeRO, and report what the driver checks: the rebuilt subgroups, the gradients of one step
    at world 3, and the optimizer state of each parameter before and after the re-wrap."""
    from ringtorch.distributed.optim import ZeroRedundancyOptimizer
    from ringtorch.nn.parallel import DistributedDataParallel

    def setup() -> tuple[Any, Any, Any, Any]:
        _init(rank, world_size)
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        ddp = DistributedDataParallel(_model())
        opt = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
        ddp(_batch(rank)).sum().backward()
        opt.step()  # every rank now has momentum for the parameters it owns
        return pairs, ddp, opt, _states(opt)

    if rank == 3:
        def play() -> None:
            setup()
            os.kill(os.getpid(), signal.SIGKILL)
        return _as_victim(play)
    pairs, ddp, opt, before = setup()
    error = _error_of(lambda: ddp(_batch(rank)).sum().backward())
    world = dist.shrink_on_failure()
    mine = world.replacement(pairs[0] if rank < 2 else pairs[1])
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=mine)
    ddp, opt = ddp.rewrap(), opt.rewrap()
    after = _states(opt)
    params = [p.detach().clone() for p in ddp.parameters()]
    opt.zero_grad()
    ddp(_batch(rank)).sum().backward()
    return {"error": error, "world": (world.rank, world.world_size, world.lost_ranks,
                                      world.previous_rank, world.previous_world_size),
            "pair": (dist.get_world_size(mine), t.item(),
                     dist.get_process_group_ranks(mine)),
            "before": before, "after": after, "params": params,
            "grads": [p.grad.clone() for p in ddp.parameters()]}


def _states(opt: Any) -> dict[int, list[float]]:
    """The momentum of each parameter this rank's shard holds, by parameter index."""
    return {opt._param_to_index[p]: s["momentum_buffer"].flatten().tolist()
            for p, s in opt.optim.state.items()}


def shrinks_across_fake_hosts(rank: int, world_size: int, hosts: str,
                              victim: int) -> dict[str, Any]:
    """Ranks on fake hosts (RINGTORCH_HOST_ID per rank: ``hosts[rank]``), so that the group is
    hierarchical (shared memory within a host, sockets between hosts); ``victim`` is SIGKILLed
    after the first all_reduce and the others shrink it away: the new group's topology and an
    all_reduce of ``rank + 1`` (the ranks as started) on it."""
    os.environ.update({"RINGTORCH_HOST_ID": f"host-{hosts[rank]}",
                       "RINGTORCH_SOCKET_ADDR": "127.0.0.1"})

    def play() -> None:
        _init(rank, world_size)
        dist.all_reduce(torch.ones(4))
        os.kill(os.getpid(), signal.SIGKILL)

    if rank == victim:
        return _as_victim(play)
    _init(rank, world_size)
    before = dist.group.WORLD._get_backend().topology
    dist.all_reduce(torch.ones(4))
    error = _error_of(lambda: [dist.all_reduce(torch.ones(4)) for _ in range(1000)])
    world = dist.shrink_on_failure()
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    return {"error": error, "before": before, "rank": world.rank,
            "topology": dist.group.WORLD._get_backend().topology, "sum": t.tolist()}
