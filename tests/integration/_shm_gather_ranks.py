"""Rank side of test_shm_gather_in_place.py: every form of all_gather and reduce_scatter through
ringtorch.distributed on shared memory, with the shared-memory algorithms wrapped so that each
rank records the addresses they were handed (the caller's own memory, or a copy of it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import ringtorch.distributed as dist
from ringtorch.collectives.algorithms.shm import copy as shm_copy
from ringtorch.collectives.algorithms.shm import reduce as shm_reduce
from ringtorch.distributed import groups

N = 1000  # elements per rank's part


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def part_values(rank: int, part: int) -> torch.Tensor:
    """Rank ``rank``'s input for part ``part`` (the driver computes the same with NumPy)."""
    return torch.arange(N, dtype=torch.float32) * (rank + 1) + 1000 * part


def every_form(rank: int, world_size: int) -> dict[str, Any]:
    seen: list[tuple[str, list[int]]] = []
    gather_parts, scatter_parts = shm_copy.all_gather_parts, shm_reduce.reduce_scatter_parts

    def spy_gather(space: Any, outs: Any, inp: Any, *args: Any) -> None:
        seen.append(("gather", [_address(o) for o in outs] + [_address(inp)]))
        gather_parts(space, outs, inp, *args)

    def spy_scatter(space: Any, out: Any, ins: Any, *args: Any) -> None:
        seen.append(("scatter", [_address(i) for i in ins] + [_address(out)]))
        scatter_parts(space, out, ins, *args)

    shm_copy.all_gather_parts = spy_gather
    shm_reduce.reduce_scatter_parts = spy_scatter
    dist.init_process_group("gloo")
    assert groups._get_default_group()._backend.uses_shm
    p = world_size
    mine = part_values(rank, 0)
    results: dict[str, Any] = {}
    handed: dict[str, list[int]] = {}

    def record(name: str, expected: list[int], result: Any) -> None:
        results[name] = result
        handed[name] = expected

    # all_gather_into_tensor: each rank's part lands in the caller's output
    out = torch.empty(p * N)
    dist.all_gather_into_tensor(out, mine)
    record("all_gather_into_tensor", [out.data_ptr() + 4 * N * j for j in range(p)]
           + [mine.data_ptr()], out.numpy().copy())
    # the list form with separate tensors: straight into each of them
    parts = [torch.empty(N) for _ in range(p)]
    dist.all_gather(parts, mine)
    record("all_gather", [t.data_ptr() for t in parts] + [mine.data_ptr()],
           [t.numpy().copy() for t in parts])
    # reduce_scatter_tensor: read from the caller's input, not from a clone
    big = torch.cat([part_values(rank, j) for j in range(p)])
    got = torch.empty(N)
    dist.reduce_scatter_tensor(got, big)
    record("reduce_scatter_tensor", [big.data_ptr() + 4 * N * j for j in range(p)]
           + [got.data_ptr()], got.numpy().copy())
    # the list form with separate tensors: read from each of them
    ins = [part_values(rank, j) for j in range(p)]
    got2 = torch.empty(N)
    dist.reduce_scatter(got2, ins)
    record("reduce_scatter", [t.data_ptr() for t in ins] + [got2.data_ptr()], got2.numpy().copy())
    # the coalesced forms: each tensor pair as its one-tensor form
    pg = groups._get_default_group()
    outs = [torch.empty(p * N), torch.empty(p * N)]
    twice = mine * 2
    pg.allgather_into_tensor_coalesced(outs, [mine, twice]).wait()
    for k, src in enumerate((mine, twice)):
        record(f"allgather_into_tensor_coalesced/{k}", [outs[k].data_ptr() + 4 * N * j
                                                       for j in range(p)] + [src.data_ptr()],
               outs[k].numpy().copy())
    outs2 = [torch.empty(N)]
    pg.reduce_scatter_tensor_coalesced(outs2, [big]).wait()
    record("reduce_scatter_tensor_coalesced/0", [big.data_ptr() + 4 * N * j for j in range(p)]
           + [outs2[0].data_ptr()], outs2[0].numpy().copy())
    dist.destroy_process_group()
    kinds = ["gather", "gather", "scatter", "scatter", "gather", "gather", "scatter"]
    return {"results": results, "handed": handed, "seen": seen, "kinds": kinds}
