"""One program probing the helpers libraries import from ``distributed_c10d``, ``utils``,
``constants`` and ``elastic.utils.store``, written against whichever package it is given
(``torch`` or ``ringtorch``); tests/compat/test_c10d_helpers.py compares the two."""

from __future__ import annotations

import importlib
import warnings
from datetime import timedelta
from typing import Any

import torch


def _error(call: Any) -> str:
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def probe(rank: int, ws: int, package: str) -> dict[str, Any]:
    dist = importlib.import_module(f"{package}.distributed")
    c10d = importlib.import_module(f"{package}.distributed.distributed_c10d")
    constants = importlib.import_module(f"{package}.distributed.constants")
    utils = importlib.import_module(f"{package}.distributed.utils")
    store_utils = importlib.import_module(f"{package}.distributed.elastic.utils.store")
    out: dict[str, Any] = {"before_init": _error(c10d._get_default_group)}
    dist.init_process_group("gloo")
    default = c10d._get_default_group()
    out["default_is_world"] = default is dist.group.WORLD is c10d.GroupMember.WORLD
    out["default_name"] = c10d._get_process_group_name(default)
    out["default_tag"] = c10d._get_group_tag(default)
    out["timeouts"] = (c10d._get_default_timeout("gloo"), c10d._get_default_timeout("nccl"),
                       constants.default_pg_timeout, constants.default_pg_nccl_timeout)
    sub = dist.new_group([0])
    out["not_in_group"] = (c10d._rank_not_in_group(sub), c10d._rank_not_in_group(None),
                           c10d._rank_not_in_group(default))
    if rank == 0:
        out["sub"] = (c10d._get_process_group_name(sub), c10d._get_group_tag(sub),
                      c10d._resolve_process_group(c10d._get_process_group_name(sub)) is sub)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["global_rank"] = (c10d._get_global_rank(sub, 0), c10d.get_global_rank(sub, 0))
        out["global_rank_warning"] = [str(w.message).replace(f"`{package}.", "`PACKAGE.")
                                      for w in caught]
    out["bad_tensor"] = _error(lambda: c10d._check_single_tensor([1], "tensor"))
    out["bad_list"] = _error(lambda: c10d._check_tensor_list([torch.zeros(1), 2], "tensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["device"] = str(c10d._get_pg_default_device())
    c10d._store_based_barrier(rank, c10d._get_default_store(), "probe", ws,
                              timedelta(seconds=60))
    # Lightning's broadcast of a Python object, on the private helpers
    data, size = c10d._object_to_tensor({"from": rank, "items": [1, 2]}, torch.device("cpu"),
                                        None)
    sizes = torch.zeros(1, dtype=torch.long) + size
    dist.broadcast(sizes, src=1)
    buffer = data if rank == 1 else torch.empty(int(sizes.item()), dtype=torch.uint8)
    dist.broadcast(buffer, src=1)
    out["object"] = c10d._tensor_to_object(buffer, sizes.item(), None)
    # what DDP-style wrappers do when they wrap a module
    torch.manual_seed(rank)
    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    utils._verify_param_shape_across_processes(default, list(module.parameters()))
    utils._sync_module_states(module, default, 250 * 1024 * 1024, 0, {"0.bias"})
    out["module"] = {k: v.clone() for k, v in module.state_dict().items()}
    store = c10d._get_default_store()
    out["synchronized"] = store_utils.synchronize(store, f"r{rank}".encode(), rank, ws, "sync/")
    store_utils.barrier(store, ws, key_prefix="probe-barrier", barrier_timeout=60)
    dist.destroy_process_group()
    return out


def mismatched_model(rank: int, ws: int, package: str, what: str) -> str:
    """Rank 1 wraps a model whose second parameter has another shape, or one more parameter."""
    dist = importlib.import_module(f"{package}.distributed")
    utils = importlib.import_module(f"{package}.distributed.utils")
    c10d = importlib.import_module(f"{package}.distributed.distributed_c10d")
    dist.init_process_group("gloo")
    tensors = [torch.zeros(3), torch.zeros(2 if rank == 0 or what != "shape" else 4)]
    if what == "count" and rank == 1:
        tensors.append(torch.zeros(1))
    message = _error(lambda: utils._verify_param_shape_across_processes(
        c10d._get_default_group(), tensors))
    dist.destroy_process_group()
    return message
