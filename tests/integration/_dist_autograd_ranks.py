"""Rank-side code of the distributed autograd and DistributedOptimizer tests.

Each scenario starts RPC (``worker{rank}``), runs its part and returns what it saw; the test
modules compare with gradients they compute with plain torch in one process.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

import ringtorch.distributed.autograd as dist_autograd
import ringtorch.distributed.rpc as rpc
from ringtorch.distributed.optim import DistributedOptimizer
from tests.integration._rpc_common import error_of, start, wait_until

# ---- functions called over RPC ----------------------------------------------------------


def square(t: torch.Tensor) -> torch.Tensor:
    return t * t


def sin2(t: torch.Tensor) -> torch.Tensor:
    return torch.sin(2 * t)


def nested(t: torch.Tensor) -> torch.Tensor:
    """Worker 1 calls worker 2 with a tensor that requires grad."""
    return rpc.rpc_sync("worker2", sin2, args=(t * 3,)) + t


class Linear(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


def call(rref: Any, x: torch.Tensor) -> torch.Tensor:
    return rref.local_value()(x)


def module_grads(rref: Any, context_id: int) -> list[Any]:
    grads = dist_autograd.get_gradients(context_id)
    return [grads.get(p) for p in rref.local_value().parameters()] + [
        [p.grad for p in rref.local_value().parameters()]]


def module_context_grads(rref: Any, context_id: int) -> list[Any]:
    grads = dist_autograd.get_gradients(context_id)
    return [grads[p] for p in rref.local_value().parameters()]


def context_record(context_id: int) -> tuple[int, int]:
    ctx = dist_autograd.engine.container().retrieve(context_id)
    return len(ctx.sends), len(ctx.recvs)


def has_context(context_id: int) -> bool:
    return context_id in dist_autograd.engine.container().contexts


def param_rrefs(rref: Any) -> list[Any]:
    return [rpc.RRef(p) for p in rref.local_value().parameters()]


def params_of(rref: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in rref.local_value().parameters()]


# ---- scenarios ----------------------------------------------------------------------------


def _forward_backward(out: dict[str, Any]) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, requires_grad=True)
    with dist_autograd.context() as cid:
        a = rpc.rpc_sync("worker1", nested, args=(x,))
        b = rpc.rpc_sync("worker1", square, args=(x,))
        loss = (a * b).sum()
        dist_autograd.backward(cid, [loss])
        out["x"], out["grads_x"] = x.detach(), dist_autograd.get_gradients(cid)[x]
        out["x_grad_attr"] = x.grad
        out["ctx_id"] = cid
    out["released_here"] = cid not in dist_autograd.engine.container().contexts
    wait_until(lambda: not any(rpc.rpc_sync(f"worker{r}", has_context, args=(cid,))
                               for r in (1, 2)), 5.0)
    out["released_remote"] = [rpc.rpc_sync(f"worker{r}", has_context, args=(cid,))
                              for r in (1, 2)]


def _module_reused(out: dict[str, Any]) -> None:
    rref = rpc.remote("worker1", Linear, args=(5,))
    torch.manual_seed(1)
    x = torch.randn(2, 3)
    with dist_autograd.context() as cid:
        h = rpc.rpc_sync("worker1", call, args=(rref, x))
        y = rpc.rpc_sync("worker1", call, args=(rref, h * 2))
        dist_autograd.backward(cid, [y.sum()])
        out["module_grads"] = rpc.rpc_sync("worker1", module_grads, args=(rref, cid))
        out["x_input"] = x


def _records_and_errors(out: dict[str, Any]) -> None:
    plain = torch.ones(3)
    with dist_autograd.context() as cid:
        rpc.rpc_sync("worker1", square, args=(plain,))
        out["record_plain"] = rpc.rpc_sync("worker1", context_record, args=(cid,))
    w = torch.ones(3, requires_grad=True)
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", square, args=(w,))
        out["record_grad"] = rpc.rpc_sync("worker1", context_record, args=(cid,))
        out["not_scalar"] = error_of(dist_autograd.backward, cid, [y])
        out["no_grad_root"] = error_of(dist_autograd.backward, cid, [plain.sum()])
        loss = y.sum()
        dist_autograd.backward(cid, [loss], retain_graph=True)
        dist_autograd.backward(cid, [loss])
        out["twice"] = dist_autograd.get_gradients(cid)[w]
        out["third"] = error_of(dist_autograd.backward, cid, [loss])
    out["unknown"] = error_of(dist_autograd.backward, 12345, [loss])
    out["unknown_get"] = error_of(dist_autograd.get_gradients, 12345)


def autograd_scenario(rank: int, world_size: int) -> dict[str, Any]:
    start(rank, world_size)
    out: dict[str, Any] = {}
    if rank == 0:
        _forward_backward(out)
        _module_reused(out)
        _records_and_errors(out)
    rpc.shutdown()
    return out


_lock = threading.Lock()
_module: list[Any] = []
_arrived: dict[str, int] = {}
_arrival = threading.Condition(_lock)
_big: list[Any] = []


def shared_module() -> Any:
    """(on worker2) The parameter server's module, created once, shared by the trainers."""
    with _lock:
        if not _module:
            _module.append(rpc.RRef(Linear(7)))
        return _module[0]


def barrier(name: str, parties: int = 2) -> None:
    """(on worker2) Wait until ``parties`` trainers arrived at ``name``.

    Raises:
        RuntimeError: they did not all arrive within 15 s (less than the RPC timeout, so the
            trainers see this): the scenario's order of events cannot be kept.
    """
    with _arrival:
        _arrived[name] = _arrived.get(name, 0) + 1
        _arrival.notify_all()
        if not _arrival.wait_for(lambda: _arrived[name] >= parties, timeout=15):
            raise RuntimeError(f"barrier {name!r}: {_arrived[name]} of {parties} trainers "
                               f"arrived within 15 s")


def optim_scenario(rank: int, world_size: int) -> dict[str, Any]:
    """Trainers 0 and 1 compute gradients in their contexts, then step at the same time
    (each also returns its context's gradients of the server's parameters)."""
    start(rank, world_size)
    out: dict[str, Any] = {}
    if rank < 2:
        ps_rref = rpc.rpc_sync("worker2", shared_module)
        local = torch.nn.Parameter(torch.ones(3))
        params = rpc.rpc_sync("worker2", param_rrefs, args=(ps_rref,)) + [rpc.RRef(local)]
        opt = DistributedOptimizer(torch.optim.SGD, params, lr=0.5)
        x = torch.full((1, 3), float(rank + 1))
        with dist_autograd.context() as cid:
            y = rpc.rpc_sync("worker2", call, args=(ps_rref, x * local))
            dist_autograd.backward(cid, [y.sum()])
            out["ps_grads"] = rpc.rpc_sync("worker2", module_context_grads,
                                          args=(ps_rref, cid))
            rpc.rpc_sync("worker2", barrier, args=("computed",))
            opt.step(cid)
        rpc.rpc_sync("worker2", barrier, args=("stepped",))
        out["local"] = local.detach().clone()
        out["ps_after"] = rpc.rpc_sync("worker2", params_of, args=(ps_rref,))
        out["unknown"] = error_of(opt.step, 999)
    rpc.shutdown()
    return out


BIG = 8_000_000   # elements: one SGD update of it takes milliseconds, so two can overlap
BIG_STEPS = 30


def big_parameter() -> Any:
    """(on worker2) One large parameter of zeros, created once, shared by the trainers."""
    with _lock:
        if not _big:
            _big.append(rpc.RRef(torch.nn.Parameter(torch.zeros(BIG))))
        return _big[0]


def sum_of(rref: Any) -> torch.Tensor:
    return rref.local_value().sum()


def short_of(rref: Any, expected: float) -> int:
    """(on worker2) How many elements of the parameter are not ``expected``."""
    return int((rref.local_value().detach() != expected).sum())


def many_steps_scenario(rank: int, world_size: int) -> dict[str, Any]:
    """Trainers 0 and 1 each step one large parameter on worker2 BIG_STEPS times with
    torch.optim.SGD, arriving at each step together; the gradient is all ones."""
    start(rank, world_size)
    out: dict[str, Any] = {}
    if rank < 2:
        big = rpc.rpc_sync("worker2", big_parameter)
        opt = DistributedOptimizer(torch.optim.SGD, [big], lr=0.5)
        for step in range(BIG_STEPS):
            with dist_autograd.context() as cid:
                dist_autograd.backward(cid, [rpc.rpc_sync("worker2", sum_of, args=(big,))])
                rpc.rpc_sync("worker2", barrier, args=(f"step {step}",))
                opt.step(cid)
        rpc.rpc_sync("worker2", barrier, args=("done",))
        out["short"] = rpc.rpc_sync("worker2", short_of, args=(big, -0.5 * 2 * BIG_STEPS))
    rpc.shutdown()
    return out


# ---- seed 004's program -------------------------------------------------------------------


def seed004_one_step(rank: int, world_size: int) -> dict[str, Any]:
    """One step of seed 004's model: the loss and every parameter's distributed gradient."""
    from examples import seed004_parameter_server as E

    E.use_backend("ringtorch")
    rpc.init_rpc("ps" if rank == 0 else "trainer", rank=rank, world_size=world_size)
    out: dict[str, Any] = {}
    if rank == 1:
        ids, ntoken = E.make_corpus()
        c = E.CONFIG
        model = E.RNNModel("ps", ntoken, c["ninp"], c["nhid"], c["nlayers"])
        input, target = E.batches(ids, c["batch"], c["bptt"])[1]
        with dist_autograd.context() as cid:
            output, _ = model(input, E.init_hidden(c["nlayers"], c["batch"], c["nhid"]))
            loss = torch.nn.functional.cross_entropy(output.view(-1, ntoken), target)
            dist_autograd.backward(cid, [loss])
            grads = dist_autograd.get_gradients(cid)
            out["loss"] = loss.item()
            out["lstm"] = [grads[p] for p in model.rnn.parameters()]
            out["emb"] = rpc.rpc_sync("ps", module_context_grads,
                                      args=(model.emb_table_rref, cid))
            out["dec"] = rpc.rpc_sync("ps", module_context_grads, args=(model.decoder_rref, cid))
    rpc.shutdown()
    return out


# ---- RRef.backward ------------------------------------------------------------------------


def sum_of_squares(t: torch.Tensor) -> torch.Tensor:
    return (t * t).sum()


def rref_backward_scenario(rank: int, world_size: int) -> dict[str, Any]:
    """Worker 0: a distributed RRef.backward through worker 1, local ones on its own RRefs,
    and the errors; worker 1 owns the remote value."""
    start(rank, world_size)
    out: dict[str, Any] = {}
    if rank == 0:
        t = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        with dist_autograd.context() as cid:
            remote_loss = rpc.remote("worker1", sum_of_squares, args=(t,))
            remote_loss.backward(cid)
            out["distributed"] = dist_autograd.get_gradients(cid)[t].clone()
            out["grad_untouched"] = t.grad is None
        x = torch.tensor([3.0, -1.0], requires_grad=True)
        rpc.RRef((x * x * x).sum()).backward()
        out["local"] = x.grad.clone()
        out["not_owner"] = error_of(remote_loss.backward)
        out["not_a_tensor"] = error_of(rpc.RRef([1.0]).backward)
        out["unknown_context"] = error_of(remote_loss.backward, 12345)
    rpc.shutdown()
    return out
