"""Rank-side code of tests/integration/test_p2p.py: point-to-point patterns and their errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import ringtorch.distributed as dist


def _error(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


def patterns(rank: int, ws: int) -> dict[str, Any]:
    """Every point-to-point pattern of the test, in one world."""
    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    right, left = (rank + 1) % ws, (rank - 1) % ws
    # Ring with blocking calls: even ranks send first, odd ranks receive first.
    got = torch.zeros(3)
    if ws > 1 and rank % 2 == 0:
        dist.send(torch.full((3,), float(rank)), dst=right)
        out["ring_src"] = dist.recv(got, src=left)
    elif ws > 1:
        out["ring_src"] = dist.recv(got, src=left)
        dist.send(torch.full((3,), float(rank)), dst=right)
    out["ring"] = got.tolist()
    # Both ranks of a pair send 8 MB first, then receive: sends never wait for the receiver.
    big = torch.full((2 * 1024 * 1024,), float(rank))
    into = torch.zeros_like(big)
    partner = rank ^ 1
    if partner < ws:
        dist.send(big, dst=partner)
        dist.recv(into, src=partner)
        out["big"] = (into.min().item(), into.max().item())
    # Any source: rank 0 takes one message from every other rank, in arrival order.
    if rank == 0:
        senders = []
        for _ in range(ws - 1):
            t = torch.zeros(1)
            src = dist.recv(t, tag=2)
            senders.append((src, t.item()))
        out["any_source"] = sorted(senders)
    else:
        dist.send(torch.full((1,), float(rank * 11)), dst=0, tag=2)
    # Tags: rank 1 sends tag 5 then tag 7; rank 0 receives tag 7 first.
    if ws > 1 and rank == 1:
        w5 = dist.isend(torch.full((2,), 5.0), dst=0, tag=5)
        w7 = dist.isend(torch.full((2,), 7.0), dst=0, tag=7)
        w5.wait()
        w7.wait()
    if ws > 1 and rank == 0:
        a, b = torch.zeros(2), torch.zeros(2)
        r7 = dist.irecv(a, src=1, tag=7)
        r5 = dist.irecv(b, src=1, tag=5)
        r7.wait()
        r5.wait()
        out["tags"] = (a.tolist(), b.tolist())
    # Order: five messages with one tag arrive in the order they were sent.
    if ws > 1 and rank == 1:
        for w in [dist.isend(torch.full((1,), float(i)), dst=0, tag=3) for i in range(5)]:
            w.wait()
    if ws > 1 and rank == 0:
        ts = [torch.zeros(1) for _ in range(5)]
        works = [dist.irecv(t, src=1, tag=3) for t in ts]
        out["order_futures"] = [w.get_future().wait()[0].item() for w in works]
        out["order"] = [t.item() for t in ts]
    # batch_isend_irecv around the ring, receives listed first on every rank.
    recv_into = torch.zeros(2, dtype=torch.int64)
    ops = [dist.P2POp(dist.irecv, recv_into, left),
           dist.P2POp(dist.isend, torch.tensor([rank, rank * rank]), right)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["batch"] = recv_into.tolist()
    out["p2pop_repr"] = repr(ops[1])
    # A rank may isend to itself; irecv from itself takes the message.
    mine = torch.zeros(3)
    w_in = dist.irecv(mine, src=rank, tag=9)
    dist.isend(torch.arange(3.0) + rank, dst=rank, tag=9).wait()
    w_in.wait()
    out["self"] = mine.tolist()
    # Complex tensors and NumPy arrays.
    if ws > 1:
        if rank == 0:
            dist.send(torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64), dst=1)
            dist.send(np.arange(4, dtype=np.int16), dst=1)
        elif rank == 1:
            c = torch.zeros(2, dtype=torch.complex64)
            dist.recv(c, src=0)
            arr = np.zeros(4, dtype=np.int16)
            dist.recv(arr, src=0)
            out["complex"] = c.tolist()
            out["numpy"] = arr.tolist()
        w = dist.irecv(torch.zeros(1), tag=4) if rank == 0 else None
        if rank == ws - 1:
            dist.send(torch.ones(1), dst=0, tag=4)
        if w is not None:
            w.wait()
            out["work_source_rank"] = (w._source_rank(), w.source_rank())
    out["errors"] = _errors(rank, ws)
    dist.barrier()
    dist.destroy_process_group()
    return out


def _errors(rank: int, ws: int) -> dict[str, Any]:
    return {
        "send_self": _error(dist.send, torch.zeros(1), dst=rank),
        "send_out_of_range": _error(dist.send, torch.zeros(1), dst=ws),
        "isend_out_of_range": _error(dist.isend, torch.zeros(1), dst=-1),
        "recv_strided": _error(dist.recv, torch.zeros(4, 4).t(), src=(rank + 1) % ws),
        "send_strided": _error(dist.send, torch.zeros(4, 4).t(), dst=(rank + 1) % ws),
        "negative_tag": _error(dist.isend, torch.zeros(1), dst=rank, tag=-3),
        "not_a_tensor": _error(dist.send, [1.0], dst=(rank + 1) % ws),
        "bad_op": _error(dist.P2POp, dist.send, torch.zeros(1), 0),
        "bad_list": _error(dist.batch_isend_irecv, [1, 2]),
        "both_peers": _error(dist.P2POp, dist.isend, torch.zeros(1), 0, group_peer=0),
    }
