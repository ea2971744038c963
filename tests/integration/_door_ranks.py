"""Rank functions of the backend door's tests (test_backend_door*.py): plain torch programs.

Nothing here imports ringtorch: each rank says ``init_process_group("ringtorch")`` as a user
would, and the differential job runs every operation twice, on the "ringtorch" group and on
a gloo group made in the same processes, and returns both results for the test to compare.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def _inputs(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    base = torch.arange(n) % 7 + rank + 1
    if dtype == torch.bool:
        return (base % 2).bool()
    return base.to(dtype)


def _both(fn: Any, door: Any, gloo: Any) -> tuple[Any, Any]:
    return fn(door), fn(gloo)


def _ops(rank: int, ws: int) -> list[tuple[str, Any]]:
    """(name, fn(group) -> result) for every operation, for the same inputs on any group."""
    ops: list[tuple[str, Any]] = []

    def all_reduce(dtype: torch.dtype, op: Any) -> Any:
        def run(g: Any) -> Any:
            t = _inputs(rank, 5, dtype)
            dist.all_reduce(t, op=op, group=g)
            return t
        return run

    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16,
                  torch.float16, torch.uint8):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN,
                   dist.ReduceOp.PRODUCT):
            ops.append((f"all_reduce {dtype} {op}", all_reduce(dtype, op)))
    for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        ops.append((f"all_reduce int64 {op}", all_reduce(torch.int64, op)))
    ops.append(("all_reduce bool MAX", all_reduce(torch.bool, dist.ReduceOp.MAX)))
    for dtype in (torch.int8, torch.complex64, torch.complex128):  # gloo refuses int16
        ops.append((f"all_reduce {dtype} SUM", all_reduce(dtype, dist.ReduceOp.SUM)))

    def coalesced(g: Any) -> Any:
        ts = [_inputs(rank, 3, torch.float32), _inputs(rank, 4, torch.float32) * 2]
        dist.all_reduce_coalesced(ts, group=g)
        return ts

    def broadcast(g: Any) -> Any:
        t = _inputs(rank, 6, torch.int64)
        dist.broadcast(t, src=ws - 1, group=g)
        return t

    def reduce(g: Any) -> Any:
        t = _inputs(rank, 6, torch.float32)
        dist.reduce(t, dst=ws - 1, op=dist.ReduceOp.MAX, group=g)
        return t if rank == ws - 1 else None

    def all_gather(g: Any) -> Any:
        out = [torch.zeros(3, dtype=torch.float64) for _ in range(ws)]
        dist.all_gather(out, _inputs(rank, 3, torch.float64), group=g)
        return out

    def all_gather_into_tensor(g: Any) -> Any:
        out = torch.zeros(ws * 2, 3, dtype=torch.int32)
        dist.all_gather_into_tensor(out, _inputs(rank, 6, torch.int32).view(2, 3), group=g)
        return out

    def all_gather_coalesced(g: Any) -> Any:
        outs = [[torch.zeros(2), torch.zeros(3)] for _ in range(ws)]  # per rank, per input
        dist.all_gather_coalesced(outs, [_inputs(rank, 2, torch.float32),
                                         _inputs(rank, 3, torch.float32)], group=g)
        return outs

    def reduce_scatter(g: Any) -> Any:
        out = torch.zeros(2)
        dist.reduce_scatter(out, [_inputs(rank, 2, torch.float32) * (i + 1)
                                  for i in range(ws)], group=g)
        return out

    def reduce_scatter_tensor(g: Any) -> Any:
        out = torch.zeros(3, dtype=torch.float64)
        dist.reduce_scatter_tensor(out, _inputs(rank, 3 * ws, torch.float64), group=g)
        return out

    def all_to_all(g: Any) -> Any:
        outs = [torch.zeros(2, dtype=torch.int64) for _ in range(ws)]
        dist.all_to_all(outs, [_inputs(rank, 2, torch.int64) + 10 * j for j in range(ws)],
                        group=g)
        return outs

    def all_to_all_single_uneven(g: Any) -> Any:
        # rank r sends j + 1 rows to rank j and receives r + 1 rows from each rank
        in_splits = [j + 1 for j in range(ws)]
        out_splits = [rank + 1] * ws
        inp = _inputs(rank, sum(in_splits) * 2, torch.float32).view(-1, 2)
        out = torch.zeros(sum(out_splits), 2)
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=g)
        return out

    def gather(g: Any) -> Any:
        outs = [torch.zeros(4) for _ in range(ws)] if rank == 0 else None
        dist.gather(_inputs(rank, 4, torch.float32), outs, dst=0, group=g)
        return outs

    def scatter(g: Any) -> Any:
        out = torch.zeros(3, dtype=torch.int64)
        ins = [_inputs(0, 3, torch.int64) * (j + 1) for j in range(ws)] if rank == 0 else None
        dist.scatter(out, ins, src=0, group=g)
        return out

    def p2p_ring(g: Any) -> Any:
        got = torch.zeros(3)
        if ws == 1:
            return got
        send = dist.isend(_inputs(rank, 3, torch.float32), (rank + 1) % ws, group=g)
        dist.recv(got, (rank - 1) % ws, group=g)
        send.wait()
        return got

    def recv_any_source(g: Any) -> Any:
        # every other rank sends to rank 0, which receives from whoever comes first
        if rank != 0:
            dist.send(_inputs(rank, 2, torch.float32), 0, group=g)
            return None
        got = []
        for _ in range(ws - 1):
            t = torch.zeros(2)
            src = dist.recv(t, group=g)
            got.append((src, t))
        return sorted(got, key=lambda pair: pair[0])

    def batch_p2p(g: Any) -> Any:
        got = torch.zeros(2)
        if ws == 1:
            return got
        reqs = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, _inputs(rank, 2, torch.float32), (rank + 1) % ws, g),
            dist.P2POp(dist.irecv, got, (rank - 1) % ws, g)])
        for r in reqs:
            r.wait()
        return got

    def objects(g: Any) -> Any:
        out: list[Any] = [None] * ws
        dist.all_gather_object(out, {"rank": rank, "sq": rank * rank}, group=g)
        return out

    def coalescing_manager(g: Any) -> Any:
        ts = [_inputs(rank, 2, torch.float32), _inputs(rank, 3, torch.float32)]
        with dist._coalescing_manager(group=g, async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t, group=g)
        cm.wait()
        return ts

    def coalesced_gather_scatter(g: Any) -> Any:
        # the fast paths torch turns into all_gather_single_coalesced and
        # reduce_scatter_single_coalesced
        gathered = [torch.zeros(2 * ws), torch.zeros(3 * ws)]
        with dist._coalescing_manager(group=g, async_ops=True) as cm:
            for out, n in zip(gathered, (2, 3), strict=True):
                dist.all_gather_into_tensor(out, _inputs(rank, n, torch.float32), group=g)
        cm.wait()
        scattered = [torch.zeros(2), torch.zeros(1)]
        with dist._coalescing_manager(group=g, async_ops=True) as cm:
            for out in scattered:
                dist.reduce_scatter_tensor(out, _inputs(rank, out.numel() * ws,
                                                        torch.float32), group=g)
        cm.wait()
        return gathered + scattered

    def coalescing_on_device(g: Any) -> Any:
        # with a device, each call goes to the group between _start_ and _end_coalescing;
        # gloo does not implement that ("Backend gloo does not implement startCoalescing"):
        # there the same calls run one by one
        ts = [_inputs(rank, 2, torch.float64), _inputs(rank, 4, torch.float64)]
        if dist.get_backend(g) == "gloo":
            dist.all_reduce(ts[0], group=g)
            dist.broadcast(ts[1], src=0, group=g)
            return ts
        with dist._coalescing_manager(group=g, device=torch.device("cpu"), async_ops=True) as cm:
            dist.all_reduce(ts[0], group=g)
            dist.broadcast(ts[1], src=0, group=g)
        cm.wait()
        return ts

    ops += [("all_reduce_coalesced", coalesced),
            ("coalesced all_gather_into_tensor, reduce_scatter_tensor",
             coalesced_gather_scatter),
            ("_coalescing_manager on a device", coalescing_on_device),
            ("broadcast", broadcast), ("reduce", reduce),
            ("all_gather", all_gather), ("all_gather_into_tensor", all_gather_into_tensor),
            ("all_gather_coalesced", all_gather_coalesced), ("reduce_scatter", reduce_scatter),
            ("reduce_scatter_tensor", reduce_scatter_tensor), ("all_to_all", all_to_all),
            ("all_to_all_single uneven", all_to_all_single_uneven), ("gather", gather),
            ("scatter", scatter), ("p2p ring", p2p_ring), ("recv from any source", recv_any_source),
            ("batch_isend_irecv", batch_p2p),
            ("all_gather_object", objects), ("_coalescing_manager", coalescing_manager)]
    return ops


def differential(rank: int, ws: int) -> dict[str, Any]:
    """Every operation on backend "ringtorch" and on gloo; AVG and PREMUL_SUM (which gloo
    lacks) against gloo's SUM, for the test to scale."""
    import warnings

    warnings.simplefilter("ignore")  # torch's deprecation warnings of the old names
    dist.init_process_group("ringtorch")
    gloo = dist.new_group(backend="gloo")
    door = dist.group.WORLD
    out: dict[str, Any] = {"backend": dist.get_backend(), "gloo": dist.get_backend(gloo)}
    for name, fn in _ops(rank, ws):
        out[name] = _both(fn, door, gloo)
    for dtype in (torch.float32, torch.bfloat16):
        t = _inputs(rank, 5, dtype)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        s = _inputs(rank, 5, dtype)
        dist.all_reduce(s, group=gloo)
        out[f"all_reduce {dtype} AVG"] = (t, s)
    for factor in (2.5, torch.tensor([0.5])):
        t = _inputs(rank, 4, torch.float32)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
        s = _inputs(rank, 4, torch.float32)
        dist.all_reduce(s, group=gloo)
        out[f"all_reduce PREMUL_SUM {float(factor)}"] = (t, s * float(factor))
    dist.barrier()
    # torch's dist.monitored_barrier admits gloo only; the group's own method is ringtorch's
    door.monitored_barrier(timedelta(seconds=30))
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=30))
    except ValueError as exc:
        out["dist.monitored_barrier"] = str(exc)
    dist.destroy_process_group()
    return out



def features(rank: int, ws: int) -> dict[str, Any]:
    """torch's libraries over backend "ringtorch": the Work API, functional collectives with
    autograd, new_group, DeviceMesh (1-D and 2-D with named dims), a DTensor redistribute."""
    import warnings

    import torch.distributed._functional_collectives as fc
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    warnings.simplefilter("ignore")
    dist.init_process_group("ringtorch")
    out: dict[str, Any] = {}
    t = torch.full((3,), float(rank))
    work = dist.all_reduce(t, async_op=True)
    out["wait"] = work.wait(timeout=timedelta(seconds=30))
    out["work"] = (work.is_completed(), work.exception(), t)
    out["future"] = dist.all_reduce(torch.ones(2), async_op=True).get_future().wait()
    out["then"] = dist.all_reduce(torch.ones(2), async_op=True).get_future().then(
        lambda f: f.value()[0] * 2).wait()
    # functional collectives find the group by its name (torch's C++ group registry)
    out["fc"] = fc.wait_tensor(fc.all_reduce(torch.arange(4.0) * (rank + 1), "sum",
                                             dist.group.WORLD))
    out["c10d_functional"] = torch.ops._c10d_functional.wait_tensor(
        torch.ops._c10d_functional.all_reduce(torch.full((2,), float(rank)), "avg",
                                              dist.group.WORLD.group_name))
    x = torch.arange(2.0, requires_grad=True)
    gathered = fc.wait_tensor(fc.all_gather_tensor_autograd(x * (rank + 1), 0,
                                                            dist.group.WORLD))
    (gathered * torch.arange(float(gathered.numel()))).sum().backward()
    out["grad"] = x.grad
    evens = dist.new_group([r for r in range(ws) if r % 2 == 0])
    if rank % 2 == 0:
        e = torch.full((1,), float(rank))
        dist.all_reduce(e, group=evens)
        out["evens"] = (dist.get_backend(evens), e)
    mesh = init_device_mesh("cpu", (2, ws // 2), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        z = torch.full((1,), float(rank))
        dist.all_reduce(z, group=mesh[dim].get_group())
        out[dim] = (dist.get_backend(mesh[dim].get_group()), z)
    flat = init_device_mesh("cpu", (ws,))
    full = torch.arange(ws * 2 * 3, dtype=torch.float32).view(ws * 2, 3)
    sharded = distribute_tensor(full, flat, [Shard(0)])
    out["shard"] = sharded.to_local()
    out["replicate"] = sharded.redistribute(flat, [Replicate()]).to_local()  # recorded here
    from ringtorch.c10d.observe import dump  # what a hang report would show of this rank

    record = dump()
    out["recorded"] = ([e["op"] for e in record["entries"][-3:]],
                       {name: g["backend"] for name, g in record["groups"].items()},
                       record["entries"][-1]["site"])
    for _ in range(3):  # the first call's site is found by a walk, the next ones by a guess
        dist.all_reduce(torch.ones(1))  # recorded three times
    out["sites"] = [e["site"] for e in dump()["entries"][-3:]]
    try:
        dist.split_group(split_ranks=[list(range(ws))])
    except RuntimeError as exc:
        out["split_group"] = str(exc)
    dist.destroy_process_group()
    return out


def lifecycle(rank: int, ws: int, path: str) -> dict[str, Any]:
    """Init through store=, file:// and a device:backend string; Work.wait's own timeout;
    destroy and re-init (on the same store); abort; messages of unsupported ops and dtypes."""
    import warnings

    warnings.simplefilter("ignore")
    out: dict[str, Any] = {}
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), ws, rank == 0)
    dist.init_process_group("ringtorch", store=store, rank=rank, world_size=ws,
                            timeout=timedelta(seconds=30))
    t = torch.ones(1)
    dist.all_reduce(t)
    out["store"] = t.item()
    if rank == 0:  # rank 1 joins this broadcast only after rank 0's wait gave up
        work = dist.broadcast(torch.zeros(1), src=1, async_op=True)
        try:
            work.wait(timeout=timedelta(milliseconds=200))
        except Exception as exc:
            out["wait_timeout"] = (type(exc).__name__, str(exc), work.is_completed())
        store.set("door/gave_up", "1")
        work.wait()
    else:
        store.wait(["door/gave_up"])
        dist.broadcast(torch.ones(1), src=1)
    gloo = dist.new_group(backend="gloo")
    out["errors"] = _errors(gloo)
    with warnings.catch_warnings(record=True) as caught:  # torch changes gloo's and nccl's only
        warnings.simplefilter("always")
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=5))
    out["set_pg_timeout"] = [str(w.message) for w in caught]
    try:
        with dist.distributed_c10d._time_estimator():
            pass
    except NotImplementedError as exc:
        out["time_estimator"] = str(exc)
    dist.destroy_process_group()
    out["after_destroy"] = dist.is_initialized()
    dist.init_process_group("ringtorch", init_method=f"file://{path}", rank=rank,
                            world_size=ws)
    t = torch.full((1,), 2.0)
    dist.all_reduce(t)
    out["file"] = t.item()
    dist.destroy_process_group()
    dist.init_process_group("cpu:ringtorch", store=store, rank=rank, world_size=ws)
    t = torch.full((1,), 3.0)
    dist.all_reduce(t)
    out["again"] = (dist.get_backend(), t.item())
    dist.distributed_c10d._abort_process_group()
    out["after_abort"] = dist.is_initialized()
    return out


def _errors(gloo: Any) -> dict[str, tuple[str, str]]:
    """What each group says to a call it cannot run: (ringtorch's error, gloo's error)."""
    cases = {
        "BAND on float": lambda g: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND,
                                                   group=g),
        "MAX on complex": lambda g: dist.all_reduce(torch.ones(2, dtype=torch.complex64),
                                                    op=dist.ReduceOp.MAX, group=g),
        "AVG on int": lambda g: dist.all_reduce(torch.ones(2, dtype=torch.int64),
                                                op=dist.ReduceOp.AVG, group=g),
        "bad splits": lambda g: dist.all_to_all_single(torch.zeros(4), torch.ones(4), [1, 1],
                                                       [3, 3], group=g),
        "meta tensor": lambda g: dist.all_reduce(torch.ones(2, device="meta"), group=g),
    }
    said: dict[str, tuple[str, str]] = {}
    for name, call in cases.items():
        words = []
        for group in (None, gloo):
            try:
                call(group)
                words.append("no error")
            except Exception as exc:
                words.append(f"{type(exc).__name__}: {exc}")
        said[name] = (words[0], words[1])
    return said


def killed(rank: int, ws: int, victim: int) -> dict[str, Any]:
    """``victim`` (a forked child playing the rank) is SIGKILLed after one all_reduce; the
    others' next all_reduce must fail, naming it, in seconds."""
    import signal
    import time

    if rank == victim:
        pid = os.fork()
        if pid == 0:
            try:
                dist.init_process_group("ringtorch")
                dist.all_reduce(torch.ones(1))
                # die once every survivor has its result, not while it still reads it
                store = dist.distributed_c10d._get_default_store()
                store.wait([f"door/finished/{r}" for r in range(ws) if r != victim])
                os.kill(os.getpid(), signal.SIGKILL)
            finally:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        return {"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}
    dist.init_process_group("ringtorch")
    dist.all_reduce(torch.ones(1))
    dist.distributed_c10d._get_default_store().set(f"door/finished/{rank}", "1")
    start = time.monotonic()
    work = dist.all_reduce(torch.ones(1), async_op=True)
    try:
        work.wait()
        said = "no error"
    except Exception as exc:
        said = f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - start
    failed = (work.is_completed(), work.is_success(),
              str(work.exception()) == said.split(": ", 1)[-1])
    try:  # the group stays failed: a later call raises at once
        dist.barrier()
        later = "no error"
    except Exception as exc:
        later = type(exc).__name__
    return {"error": said, "seconds": seconds, "work": failed, "later": later}



def stalled(rank: int, ws: int) -> dict[str, Any]:
    """Rank 1 stays out of rank 0's second all_reduce: rank 0 logs stall warnings, then times
    out naming rank 1, with a hang report (the test sets the stall warning's interval)."""
    import io
    import logging

    dist.init_process_group("ringtorch", timeout=timedelta(seconds=60))
    dist.group.WORLD.set_timeout(timedelta(seconds=3))  # the group's own, as gloo's
    dist.all_reduce(torch.ones(1))
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        store.wait(["door/stalled/done"], timedelta(seconds=60))
        store.set("door/stalled/seen", "1")  # rank 0 (the store's host) may leave now
        return {}
    log = io.StringIO()
    logging.getLogger().addHandler(logging.StreamHandler(log))
    try:
        dist.all_reduce(torch.ones(1))
        said = "no error"
    except Exception as exc:
        said = f"{type(exc).__name__}: {exc}"
    store.set("door/stalled/done", "1")
    store.wait(["door/stalled/seen"], timedelta(seconds=60))
    return {"error": said, "log": log.getvalue()}


def mesh_override(rank: int, ws: int) -> dict[str, Any]:
    """A gloo default group with a DeviceMesh whose "tp" dimension is overridden to
    backend "ringtorch" (init_device_mesh's backend_override)."""
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, ws // 2), mesh_dim_names=("dp", "tp"),
                            backend_override={"tp": "ringtorch"})
    out: dict[str, Any] = {}
    for dim in ("dp", "tp"):
        group = mesh[dim].get_group()
        value = torch.full((1,), float(rank))
        dist.all_reduce(value, group=group)
        out[dim] = (dist.get_backend(group), value.item())
    dist.destroy_process_group()
    return out


def ddp_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def ddp_batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + rank))


def ddp(rank: int, ws: int) -> list[torch.Tensor]:
    """torch's own DistributedDataParallel (its C++ reducer calls the group) trains three
    SGD steps on backend "ringtorch"; returns the parameters."""
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("ringtorch")
    model = ddp_model()
    wrapped = DistributedDataParallel(model, bucket_cap_mb=0.0001)  # several buckets
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    for step in range(3):
        optimizer.zero_grad()
        wrapped(ddp_batch(rank, step)).square().sum().backward()
        optimizer.step()
    dist.destroy_process_group()
    return [p.detach() for p in model.parameters()]


def fsdp(rank: int, ws: int) -> list[torch.Tensor]:
    """torch's FSDP2 (fully_shard over a DeviceMesh; reduce-scatters and all-gathers the
    parameters through the group) trains the same three steps on backend "ringtorch"."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("ringtorch")
    mesh = init_device_mesh("cpu", (ws,))
    model = ddp_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        optimizer.zero_grad()
        model(ddp_batch(rank, step)).square().sum().backward()
        optimizer.step()
    params = [p.full_tensor().detach() for p in model.parameters()]
    dist.destroy_process_group()
    return params


__all__ = ["ddp", "differential", "features", "fsdp", "killed", "lifecycle", "mesh_override",
           "stalled"]
