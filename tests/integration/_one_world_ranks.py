"""Rank function of test_one_world.py: a program written against ``ringtorch.distributed.*``
paths only, then the backend door's groups used through the facade.

The first part is a torch program whose ``torch.distributed`` imports were changed to
``ringtorch.distributed``: it initializes through ``ringtorch.distributed.init_process_group``
and runs torch's modern stack (DeviceMesh, DTensor, FSDP2, DCP, functional collectives) on
that group, destroys it, meets the error paths, and initializes again. The last part
initializes through ``torch.distributed.init_process_group("ringtorch")`` and uses the groups
through ``ringtorch.distributed``. Results are raw (local shards, full tensors, messages);
the test compares them with torch on one process.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batch() -> torch.Tensor:
    return torch.randn(6, 8, generator=torch.Generator().manual_seed(1))


def _error(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:  # the message is the result
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def program(rank: int, ws: int, ckpt_dir: str, door_port: int) -> dict[str, Any]:
    import torch.distributed as tdist

    import ringtorch.distributed as dist
    import ringtorch.distributed._functional_collectives as fc
    import ringtorch.distributed.checkpoint as dcp
    from ringtorch.distributed import distributed_c10d as rc10d
    from ringtorch.distributed.checkpoint.state_dict import get_model_state_dict
    from ringtorch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from ringtorch.distributed.fsdp import fully_shard
    from ringtorch.distributed.tensor import Replicate, Shard, distribute_tensor

    warnings.simplefilter("ignore")
    out: dict[str, Any] = {}
    dist.init_process_group()  # env:// from the harness; the facade's default backend
    out["torch_sees"] = (tdist.is_initialized(), tdist.get_backend(), tdist.get_rank(),
                         tdist.get_world_size())

    # DeviceMesh 1-D and 2-D with named dimensions, on the facade's group
    mesh = init_device_mesh("cpu", (ws,), mesh_dim_names=("dp",))
    mesh2 = init_device_mesh("cpu", (1, ws), mesh_dim_names=("pp", "dp"))
    out["mesh2"] = (mesh2["pp"].size(), mesh2["dp"].size(),
                    tdist.get_process_group_ranks(mesh2["dp"].get_group()),
                    tdist.get_process_group_ranks(mesh2["pp"].get_group()))

    # DTensor: distribute, then redistribute Shard(0) -> Replicate and Shard(0) -> Shard(1)
    x = torch.arange(24.0).reshape(4, 6)
    d = distribute_tensor(x, mesh, [Shard(0)])
    out["dtensor"] = (d.to_local(), d.redistribute(mesh, [Replicate()]).to_local(),
                      d.redistribute(mesh, [Shard(1)]).to_local())
    d2 = distribute_tensor(x, mesh2, [Replicate(), Shard(1)])
    out["dtensor2"] = (d2.to_local(), d2.full_tensor())

    # a functional collective with autograd: all-gather forward, reduce-scatter backward
    a = (torch.arange(3.0) * (rank + 1)).requires_grad_()
    gathered = fc.all_gather_tensor_autograd(a, 0, mesh)
    (fc.wait_tensor(gathered) * (torch.arange(3.0 * ws) + rank)).sum().backward()
    out["fc"] = (fc.wait_tensor(gathered).detach(), a.grad)

    # FSDP2: two SGD steps on this rank's half of the batch
    net = model()
    for layer in (net[0], net[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        net(batch().chunk(ws)[rank]).square().sum().backward()
        opt.step()
    out["fsdp2"] = {k: v.full_tensor() for k, v in get_model_state_dict(net).items()}

    # DCP: the sharded state saved, then loaded into a fresh sharded model
    dcp.save({"model": get_model_state_dict(net)}, checkpoint_id=ckpt_dir)
    fresh = model()
    fully_shard(fresh, mesh=mesh)
    state = {"model": get_model_state_dict(fresh)}
    dcp.load(state, checkpoint_id=ckpt_dir)
    out["dcp"] = {k: v.full_tensor() for k, v in state["model"].items()}

    # new_group beside the mesh's subgroups: names in step, every group in both worlds; the
    # facade's group object goes to torch's functions and to a DeviceMesh
    g = dist.new_group([0, 1])
    tg = tdist.new_group([0, 1])
    out["names"] = (tdist.distributed_c10d._get_process_group_name(mesh2["pp"].get_group()),
                    rc10d._get_process_group_name(g),
                    tdist.distributed_c10d._get_process_group_name(tg),
                    rc10d._get_process_group_name(dist.group.WORLD),
                    tdist.distributed_c10d._get_process_group_name(g))
    y = torch.ones(2) * (rank + 1)
    dist.all_reduce(y, group=g)     # [3, 3]
    tdist.all_reduce(y, group=g)    # [6, 6]
    sub = DeviceMesh.from_group(g, "cpu")
    out["sub_mesh"] = (y, tdist.get_rank(g), dist.get_rank(g), dist.get_rank(tg),
                       distribute_tensor(x, sub, [Shard(0)]).full_tensor())

    # the subgroup helpers make their groups with new_group: torch's world has them too
    cur, _ = dist.new_subgroups(1)
    out["subgroups"] = (tdist.get_process_group_ranks(cur),
                        tdist.distributed_c10d._get_process_group_name(cur))

    # both doors on one group object: the mesh's group
    pg = mesh.get_group()
    z = torch.ones(2) * (rank + 1)
    dist.all_reduce(z, group=pg)     # the facade:  [3, 3]
    tdist.all_reduce(z, group=pg)    # torch:       [6, 6]
    out["same_group"] = (tdist.get_rank(pg), dist.get_rank(pg), tdist.get_world_size(pg),
                         dist.get_world_size(pg), z)

    # the door's shrink refuses a facade-made group, and names the facade's
    from ringtorch.c10d import shrink_group as door_shrink

    out["door_shrink"] = _error(lambda: door_shrink([1 - rank]))

    # destroy: both worlds are empty; torch's stack says what to do
    dist.destroy_process_group()
    out["after_destroy"] = (tdist.is_initialized(), dist.is_initialized(),
                            _error(lambda: init_device_mesh("cpu", (ws,))),
                            _error(d.full_tensor))

    # and again: a new world through the facade, seen by torch's stack
    dist.init_process_group()
    again = init_device_mesh("cpu", (ws,), mesh_dim_names=("dp",))
    out["reinit"] = distribute_tensor(x, again, [Shard(0)]).redistribute(
        again, [Replicate()]).to_local()
    dist.destroy_process_group()

    # the other door: torch's groups of backend "ringtorch" used through the facade
    tdist.init_process_group("ringtorch", init_method=f"tcp://127.0.0.1:{door_port}",
                             rank=rank, world_size=ws)
    tg = tdist.new_group([0, 1])
    w = torch.ones(2) * (rank + 1)
    dist.all_reduce(w, group=tg)
    b = torch.full((2,), float(rank))
    dist.broadcast(b, src=1, group=tg)
    out["door"] = (dist.get_rank(), dist.get_world_size(), dist.get_rank(tg),
                   dist.get_process_group_ranks(tg), dist.get_backend(tg), w, b)
    tdist.destroy_process_group()
    return out
