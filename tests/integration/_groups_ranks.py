"""Rank-side code of tests/integration/test_groups.py: subgroups, members and non-members."""

from __future__ import annotations

import threading
import warnings
from typing import Any

import torch

import ringtorch.distributed as dist


def _call(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """(result or (error type, message), warnings) of one call."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            result = (type(exc).__name__, str(exc))
    return result, [str(w.message) for w in caught]


def _info(g: Any) -> dict[str, Any]:
    if g == dist.GroupMember.NON_GROUP_MEMBER:
        return {"member": False, "rank": dist.get_rank(g), "size": dist.get_world_size(g)}
    return {"member": True, "rank": dist.get_rank(g), "size": dist.get_world_size(g),
            "name": g.group_name, "ranks": dist.get_process_group_ranks(g),
            "backend": dist.get_backend(g), "pg_rank": g.rank(), "pg_size": g.size()}


def subgroups(rank: int, ws: int) -> dict[str, Any]:
    """Disjoint and overlapping subgroups: identity, collectives, rank translation."""
    dist.init_process_group("gloo")
    out: dict[str, Any] = {"default_name": dist.group.WORLD.group_name}
    evens = dist.new_group([r for r in range(ws) if r % 2 == 0])
    odds = dist.new_group([r for r in range(ws) if r % 2 == 1])
    first = dist.new_group(list(range(ws - 1, 0, -1)))  # every rank but 0, given unsorted
    out["pg_count"] = dist.get_pg_count()
    members = {"evens": [r for r in range(ws) if r % 2 == 0],
               "odds": [r for r in range(ws) if r % 2 == 1], "first": list(range(1, ws))}
    for label, g in (("evens", evens), ("odds", odds), ("first", first)):
        out[f"{label}/info"] = _info(g)
        t = torch.full((3,), float(rank + 1))
        out[f"{label}/all_reduce"] = (_call(dist.all_reduce, t, group=g), t.tolist())
        if members[label]:
            b = torch.full((2,), float(rank))
            src = max(members[label])
            out[f"{label}/broadcast_src"] = (_call(dist.broadcast, b, src=src, group=g),
                                             b.tolist())
            b2 = torch.full((2,), float(rank))
            out[f"{label}/broadcast_group_src"] = (
                _call(dist.broadcast, b2, group=g, group_src=0), b2.tolist())
    out["both_src"] = _call(dist.broadcast, torch.zeros(1), 0, group_src=0)
    out["no_src"] = _call(dist.broadcast, torch.zeros(1))
    if ws >= 2:
        out["translate"] = (_call(dist.get_group_rank, first, rank),
                            _call(dist.get_global_rank, first, 0))
        r = torch.full((1,), float(rank * 10))
        out["reduce_group_dst"] = (_call(dist.reduce, r, group=first, group_dst=0), r.tolist())
        gl = [torch.zeros(1) for _ in range(ws - 1)] if rank == ws - 1 else None
        out["gather_dst"] = (_call(dist.gather, torch.full((1,), float(rank)), gl,
                                   dst=ws - 1, group=first),
                             None if gl is None else [x.item() for x in gl])
        got = torch.zeros(1)
        out["p2p"] = _p2p_in_subgroup(rank, ws, first, got)
    out["every_op"] = _every_op(rank, ws, first)
    dist.barrier()  # rank 0 hosts the store: nobody leaves early
    dist.destroy_process_group()
    return out


def _every_op(rank: int, ws: int, g: Any) -> dict[str, Any]:
    """Every collective on the group of global ranks 1 .. ws-1 (rank 0 is outside it)."""
    n = ws - 1
    out: dict[str, Any] = {}
    parts = [torch.zeros(1) for _ in range(n)]
    out["all_gather"] = (_call(dist.all_gather, parts, torch.full((1,), float(rank)), group=g),
                         [p.item() for p in parts])
    o = torch.zeros(max(n, 1))
    out["all_gather_single"] = (_call(dist.all_gather_single, o[:n],
                                      torch.full((1,), float(rank)), group=g), o.tolist())
    gl = [torch.zeros(1) for _ in range(n)] if rank == ws - 1 else None
    out["gather"] = (_call(dist.gather, torch.full((1,), float(rank)), gl, dst=ws - 1, group=g),
                     None if gl is None else [x.item() for x in gl])
    o = torch.zeros(1)
    sl = [torch.full((1,), 10.0 + i) for i in range(n)] if rank == 1 else None
    out["scatter"] = (_call(dist.scatter, o, sl, group=g, group_src=0), o.item())
    o = torch.zeros(1)
    out["reduce_scatter"] = (_call(dist.reduce_scatter, o,
                                   [torch.full((1,), float(rank * 100 + i)) for i in range(n)],
                                   group=g), o.item())
    o = torch.zeros(max(n, 1))
    out["all_to_all_single"] = (_call(dist.all_to_all_single, o[:n],
                                      torch.arange(float(n)) + 10 * rank, group=g), o.tolist())
    out["barrier"] = _call(dist.barrier, group=g)
    out["monitored_barrier"] = _call(dist.monitored_barrier, group=g)
    box: list[Any] = [f"from {rank}"]
    out["broadcast_object_list"] = (_call(dist.broadcast_object_list, box, src=ws - 1, group=g),
                                    box[0])
    return out


def _p2p_in_subgroup(rank: int, ws: int, g: Any, got: torch.Tensor) -> Any:
    """In group [1 .. ws-1], global rank ws-1 sends to global rank 1 (group rank 0), which
    names the sender by its group rank; rank 0, outside the group, tries to receive."""
    if ws < 3:
        return None
    if rank == ws - 1:
        return _call(dist.send, torch.full((1,), 42.0), dst=1, group=g)
    if rank == 1:
        src = _call(dist.recv, got, group=g, group_src=ws - 2)
        return src, got.item()
    if rank == 0:
        return _call(dist.recv, got, src=1, group=g)
    return None


def subgroup_helpers(rank: int, ws: int) -> dict[str, Any]:
    """new_subgroups, new_subgroups_by_enumeration, split_group and their errors."""
    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    cur, all_groups = dist.new_subgroups(group_size=2)
    t = torch.full((1,), float(rank))
    dist.all_reduce(t, group=cur)
    out["pairs"] = (t.item(), len(all_groups), dist.get_process_group_ranks(cur))
    cur, _ = dist.new_subgroups_by_enumeration([[0, 3], [1, 2]])
    t = torch.full((1,), float(rank))
    dist.all_reduce(t, group=cur)
    out["enumerated"] = (t.item(), dist.get_process_group_ranks(cur))
    mine = dist.split_group(split_ranks=[[0, 1, 2], [3]])
    t = torch.full((1,), 1.0)
    dist.all_reduce(t, group=mine)
    out["split"] = (t.item(), dist.get_process_group_ranks(mine))
    out["errors"] = [
        _call(dist.new_subgroups, group_size=3)[0],
        _call(dist.new_subgroups, group_size=0)[0],
        _call(dist.new_subgroups, group_size=8)[0],
        _call(dist.new_subgroups)[0],
        _call(dist.new_subgroups_by_enumeration, [])[0],
    ]
    out["overlap"] = _call(dist.new_subgroups_by_enumeration, [[0, 1], [1, 2]])[0]
    dist.barrier()  # rank 0 hosts the store: nobody leaves early
    dist.destroy_process_group()
    return out


def threads_and_lifecycle(rank: int, ws: int) -> dict[str, Any]:
    """Overlapping groups driven from two threads at once; destroy and re-init (env://, the
    same store port as the first time)."""
    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    left = dist.new_group([0, 1, 2])
    right = dist.new_group([1, 2, 3])
    results: dict[str, list[float]] = {"left": [], "right": []}

    def drive(name: str, g: Any) -> None:
        for i in range(30):
            t = torch.full((4,), float(rank * 100 + i))
            dist.all_reduce(t, group=g)
            results[name].append(t[0].item())

    threads = [threading.Thread(target=drive, args=(n, g)) for n, g in
               (("left", left), ("right", right)) if g != dist.GroupMember.NON_GROUP_MEMBER]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out["threads"] = results
    dist.destroy_process_group(left)
    out["after_subgroup_destroy"] = (_call(dist.all_reduce, torch.zeros(1), group=left)[0]
                                     if left != dist.GroupMember.NON_GROUP_MEMBER else None)
    out["destroy_twice"] = (_call(dist.destroy_process_group, left)[0]
                            if left != dist.GroupMember.NON_GROUP_MEMBER else None)
    dist.barrier()  # rank 0 hosts the store: nobody leaves early
    dist.destroy_process_group()
    out["after_destroy"] = (dist.is_initialized(), _call(dist.get_rank)[0], dist.get_pg_count())
    out["destroy_uninitialized"] = _call(dist.destroy_process_group)[0]
    dist.init_process_group("gloo")
    g = dist.new_group([0, 1])
    t = torch.ones(2)
    dist.all_reduce(t)
    out["reinit"] = (dist.group.WORLD.group_name, _info(g).get("name"), t.tolist(),
                     dist.get_pg_count())
    dist.barrier()  # rank 0 hosts the store: nobody leaves early
    dist.destroy_process_group()
    return out


def non_members(rank: int, ws: int) -> dict[str, Any]:
    """What a rank outside a group gets from every operation (torch's behaviour)."""
    dist.init_process_group("gloo")
    g = dist.new_group([0])
    out: dict[str, Any] = {"group": g if isinstance(g, int) else "pg"}
    t = torch.ones(2)
    calls = {
        "all_reduce": lambda: dist.all_reduce(t, group=g),
        "broadcast": lambda: dist.broadcast(t, src=0, group=g),
        "reduce": lambda: dist.reduce(t, dst=0, group=g),
        "all_gather": lambda: dist.all_gather([torch.zeros(2)], t, group=g),
        "gather": lambda: dist.gather(t, group=g),
        "scatter": lambda: dist.scatter(t, group=g),
        "reduce_scatter": lambda: dist.reduce_scatter(t, [t], group=g),
        "all_to_all": lambda: dist.all_to_all([t], [t], group=g),
        "all_to_all_single": lambda: dist.all_to_all_single(t, t, group=g),
        "barrier": lambda: dist.barrier(group=g),
        "monitored_barrier": lambda: dist.monitored_barrier(group=g),
        "isend": lambda: dist.isend(t, dst=0, group=g),
        "irecv": lambda: dist.irecv(t, src=0, group=g),
        "recv": lambda: dist.recv(t, src=0, group=g),
        "all_gather_object": lambda: dist.all_gather_object([None], 1, group=g),
        "broadcast_object_list": lambda: dist.broadcast_object_list([None], group=g),
        "get_rank": lambda: dist.get_rank(g),
        "get_world_size": lambda: dist.get_world_size(g),
        "get_backend": lambda: dist.get_backend(g),
        "destroy": lambda: dist.destroy_process_group(g),
    }
    if rank != 0:  # rank 0 is the group's only member
        for name, fn in calls.items():
            out[name] = _call(fn)
    out["tensor_untouched"] = t.tolist()
    dist.barrier()
    dist.destroy_process_group()
    return out
