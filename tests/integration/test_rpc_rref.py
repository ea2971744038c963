"""RRefs with real workers: the API, and the guarantees of docs/design/rref-protocol.md
checked on the owner with finalizers (a value is freed when, and only when, no reference to
it is left anywhere) and with the RRef context's ``statistics()``. Each scenario (the code
every rank runs) sits above the tests that read its results."""

from __future__ import annotations

import functools
import gc
import os
import signal
import threading
from typing import Any

import torch

import ringtorch.distributed.rpc as rpc
from ringtorch.testing import run_ranks
from tests.integration._rpc_common import (
    Tracked,
    add,
    drop,
    error_of,
    fetch,
    forward_rref,
    freed,
    keep,
    kept_to_here,
    local_data,
    make_rrefs,
    raise_value_error,
    remote_method,
    rref_statistics,
    set_event,
    side_store,
    start,
    wait_event,
    wait_freed,
    wait_until,
)


def rref_api(rank: int, ws: int) -> dict[str, Any]:
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        rref = rpc.remote("worker1", Tracked, args=("api", torch.arange(3.0)))
        out["owner"] = (rref.owner().name, rref.owner_name(), rref.is_owner())
        out["to_here"] = rref.to_here().data
        out["confirmed"] = rref.confirmed_by_owner()
        out["local_on_user"] = error_of(rref.local_value)
        out["proxy_sync"] = rref.rpc_sync().plus(1)
        out["proxy_async"] = rref.rpc_async().plus(2).wait()
        out["proxy_remote"] = rref.remote().plus(3).to_here()
        out["proxy_async_method"] = rref.rpc_sync().plus_later(4)
        out["on_owner"] = rpc.rpc_sync("worker1", local_data, args=(rref,))
        out["seed_style"] = remote_method(Tracked.plus, rref, 5)
        out["type"] = rref._get_type().__name__
        mine = rpc.RRef({"k": 1})
        out["local"] = (mine.is_owner(), mine.owner_name(), mine.to_here() is mine.local_value(),
                        mine.confirmed_by_owner())
        out["local_fetched"] = rpc.rpc_sync("worker1", fetch, args=(mine,))
        here = rpc.remote("worker0", add, args=(1, 2))
        out["remote_self"] = (here.is_owner(), here.to_here())
        bad = rpc.remote("worker1", raise_value_error, args=("no value",))
        out["creation_error"] = error_of(bad.to_here)
        out["creation_error_fork"] = error_of(rpc.rpc_sync, "worker1", fetch, args=(bad,))
        out["repr"] = repr(rref)
    rpc.shutdown()
    return out


@functools.cache
def api() -> dict:
    return run_ranks(rref_api, 2, timeout=60)[0]


def test_owner_and_user_sides_of_a_remote_rref() -> None:
    out = api()
    assert out["owner"] == ("worker1", "worker1", False)
    assert torch.equal(out["to_here"], torch.arange(3.0))
    assert out["confirmed"] is True
    assert out["type"] == "Tracked"
    assert out["repr"] == ("UserRRef(RRefId = GloballyUniqueId(created_on=0, local_id=0), "
                           "ForkId = GloballyUniqueId(created_on=0, local_id=1))")


def test_local_value_on_a_user_says_where_to_call_it() -> None:
    assert api()["local_on_user"] == (
        "RuntimeError", "For UserRRef(RRefId = GloballyUniqueId(created_on=0, local_id=0), "
                        "ForkId = GloballyUniqueId(created_on=0, local_id=1)), can't call "
                        "localValue() on user WorkerInfo(id=0, name=worker0). Call it on owner "
                        "WorkerInfo(id=1, name=worker1)")


def test_proxies_run_methods_on_the_owner() -> None:
    out = api()
    base = torch.arange(3.0)
    assert torch.equal(out["proxy_sync"], base + 1)
    assert torch.equal(out["proxy_async"], base + 2)
    assert torch.equal(out["proxy_remote"], base + 3)
    assert torch.equal(out["proxy_async_method"], base + 4)  # an @async_execution method


def test_an_rref_sent_to_its_owner_is_the_owners_value() -> None:
    out = api()
    assert torch.equal(out["on_owner"], torch.arange(3.0))
    assert torch.equal(out["seed_style"], torch.arange(3.0) + 5)  # seed 004's _remote_method


def test_local_rrefs_and_remote_to_self_are_owned_here() -> None:
    out = api()
    assert out["local"] == (True, "worker0", True, True)
    assert out["local_fetched"] == {"k": 1}
    assert out["remote_self"] == (True, 3)


def test_g6_a_failed_remote_raises_its_error_at_to_here_and_when_forked() -> None:
    out = api()
    for key in ("creation_error", "creation_error_fork"):
        name, message = out[key]
        assert name == "ValueError"
        assert message.startswith("On WorkerInfo(id=1, name=worker1):\nValueError('no value')")


def _delete_sent() -> bool:
    """Wait until this worker's housekeeping has sent one delete to an owner: the user
    reference can only be deleted once the child's fork is confirmed (G3), then it waits for
    the next batch."""
    return wait_until(lambda: rref_statistics().deletes_sent >= 1)


def rref_lifetime(rank: int, ws: int) -> dict[str, Any]:
    """G1/G3: the owner (worker1) keeps a value while a user anywhere holds a reference."""
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        rref = rpc.remote("worker1", Tracked, args=("life", torch.ones(2)))
        rref.to_here()
        rpc.rpc_sync("worker2", keep, args=("r", rref))  # a fork to worker2 (G3)
        del rref
        gc.collect()
        out["delete_sent"] = _delete_sent()
        # the delete went on our connection to the owner, before this call: it was loaded
        owner = rpc.rpc_sync("worker1", rref_statistics)
        out["owner_after_delete"] = (owner.owned_values, owner.user_forks, owner.deletes_received)
        out["alive_while_forked"] = not rpc.rpc_sync("worker1", freed, args=("life",))
        out["fork_usable"] = rpc.rpc_sync("worker2", kept_to_here, args=("r",)).data.tolist()
        rpc.rpc_sync("worker2", drop, args=("r",))
        out["freed_after_last"] = rpc.rpc_sync("worker1", wait_freed, args=("life", 15.0))
        # G2: RRefs the owner creates and returns (seed 004's _parameter_rrefs)
        params = rpc.rpc_sync("worker1", make_rrefs, args=("p", 2))
        out["returned_confirmed"] = [r.confirmed_by_owner() for r in params]
        out["returned_values"] = [r.to_here().data.tolist() for r in params]
        out["returned_on_owner"] = rpc.rpc_sync("worker1", local_data, args=(params[1],)
                                                ).tolist()
        del params
        gc.collect()
        out["returned_freed"] = [rpc.rpc_sync("worker1", wait_freed, args=(f"p{i}", 15.0))
                                 for i in range(2)]
        # G4: a reference passed back to its owner survives its deletion in flight
        rref = rpc.remote("worker1", Tracked, args=("back", torch.full((2,), 7.0)))
        fut = rpc.rpc_async("worker1", _local_data_once_deleted, args=(rref,))
        del rref
        gc.collect()
        rpc.rpc_sync("worker1", set_event, args=("caller deleted",))
        out["back_value"] = fut.wait().tolist()
        out["back_freed"] = rpc.rpc_sync("worker1", wait_freed, args=("back", 15.0))
        # a fork passed from worker2 on to worker3-like third party: worker2 -> worker0
        rref = rpc.remote("worker1", Tracked, args=("chain", torch.ones(1)))
        out["chain"] = rpc.rpc_sync("worker2", forward_rref, args=("worker0", rref)).data.item()
        del rref
        gc.collect()
        out["chain_freed"] = rpc.rpc_sync("worker1", wait_freed, args=("chain", 15.0))
        out["owner_table"] = rpc.rpc_sync("worker1", rref_statistics).owned_values
        side_store().set("rref checks done", "1")
    else:  # a graceful shutdown deletes this worker's user RRefs (worker2's kept fork) first
        side_store().wait(["rref checks done"])
    rpc.shutdown()
    return out


def _local_data_once_deleted(rref: rpc.RRef[Any]) -> Any:
    """(on the owner) Read the value once the caller has deleted its own reference."""
    wait_event("caller deleted")
    gc.collect()
    return rref.local_value().data


@functools.cache
def lifetime() -> dict:
    return run_ranks(rref_lifetime, 3, timeout=90)[0]


def test_g1_owner_frees_the_value_when_the_last_user_reference_is_gone() -> None:
    out = lifetime()
    assert out["freed_after_last"] is True
    assert out["owner_table"] == 0


def test_g2_rrefs_returned_by_their_owner_are_confirmed_and_freed_after_use() -> None:
    out = lifetime()
    assert out["returned_confirmed"] == [True, True]
    assert out["returned_values"] == [[0.0, 0.0], [1.0, 1.0]]
    assert out["returned_on_owner"] == [1.0, 1.0]
    assert out["returned_freed"] == [True, True]


def test_g3_a_fork_to_another_worker_keeps_the_value_alive_after_the_parent_let_go() -> None:
    out = lifetime()
    assert out["delete_sent"] is True
    assert out["owner_after_delete"] == (1, 1, 1)  # worker0's fork is gone, worker2's is not
    assert out["alive_while_forked"] is True
    assert out["fork_usable"] == [1.0, 1.0]
    assert out["chain"] == 1.0 and out["chain_freed"] is True


def test_g4_a_reference_sent_back_to_its_owner_survives_its_deletion_in_flight() -> None:
    out = lifetime()
    assert out["back_value"] == [7.0, 7.0]
    assert out["back_freed"] is True


def kill_me() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def dead_user(rank: int, ws: int) -> dict[str, Any]:
    """G5: worker2 (a forked child) holds the only reference to a value on worker1, then
    dies; the owner frees the value."""
    if rank == 2:
        pid = os.fork()
        if pid == 0:
            try:
                start(rank, ws)
                threading.Event().wait(30)  # until worker0 has it killed
            finally:
                os._exit(1)
        os.waitpid(pid, 0)
        return {}
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        rref = rpc.remote("worker1", Tracked, args=("orphan", 1))
        rpc.rpc_sync("worker2", keep, args=("r", rref))
        del rref
        gc.collect()
        out["delete_sent"] = _delete_sent()  # our delete reached the owner before the check
        out["alive"] = not rpc.rpc_sync("worker1", freed, args=("orphan",))
        out["kill"] = error_of(rpc.rpc_sync, "worker2", kill_me)[0]
        out["freed"] = rpc.rpc_sync("worker1", wait_freed, args=("orphan", 15.0))
        rpc.rpc_sync("worker1", set_event, args=("checks done",))
    else:
        wait_event("checks done")
    out["shutdown"] = error_of(rpc.shutdown)[0]
    return out


def test_g5_a_dead_user_releases_its_references() -> None:
    out = run_ranks(dead_user, 3, timeout=60)[0]
    assert out == {"delete_sent": True, "alive": True, "kill": "RpcPeerDiedError",
                   "freed": True, "shutdown": "RpcPeerDiedError"}


# ---- seed 004: the RNN model split between a parameter server and a trainer (CPU) --------
# The seed's code with `.cuda()` dropped (no GPU here) and nothing else changed.

class EmbeddingTable(torch.nn.Module):
    def __init__(self, ntoken: int, ninp: int, dropout: float) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(dropout)
        self.encoder = torch.nn.Embedding(ntoken, ninp)
        self.encoder.weight.data.uniform_(-0.1, 0.1)

    def forward(self, input: Any) -> Any:
        return self.drop(self.encoder(input))


class Decoder(torch.nn.Module):
    def __init__(self, ntoken: int, nhid: int, dropout: float) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(dropout)
        self.decoder = torch.nn.Linear(nhid, ntoken)
        self.decoder.bias.data.zero_()
        self.decoder.weight.data.uniform_(-0.1, 0.1)

    def forward(self, output: Any) -> Any:
        return self.decoder(self.drop(output))


def _parameter_rrefs(module: torch.nn.Module) -> list[rpc.RRef[Any]]:
    param_rrefs = []
    for param in module.parameters():
        param_rrefs.append(rpc.RRef(param))
    return param_rrefs


class RNNModel(torch.nn.Module):
    def __init__(self, ps: str, ntoken: int, ninp: int, nhid: int, nlayers: int,
                 dropout: float = 0.5) -> None:
        super().__init__()
        self.emb_table_rref = rpc.remote(ps, EmbeddingTable, args=(ntoken, ninp, dropout))
        self.rnn = torch.nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder_rref = rpc.remote(ps, Decoder, args=(ntoken, nhid, dropout))

    def forward(self, input: Any, hidden: Any) -> Any:
        emb = remote_method(EmbeddingTable.forward, self.emb_table_rref, input)
        output, hidden = self.rnn(emb, hidden)
        decoded = remote_method(Decoder.forward, self.decoder_rref, output)
        return decoded, hidden

    def parameter_rrefs(self) -> list[rpc.RRef[Any]]:
        remote_params = []
        remote_params.extend(remote_method(_parameter_rrefs, self.emb_table_rref))
        remote_params.extend(_parameter_rrefs(self.rnn))
        remote_params.extend(remote_method(_parameter_rrefs, self.decoder_rref))
        return remote_params


def seed004(rank: int, ws: int) -> dict[str, Any]:
    """The trainer runs the seed's model forward; the test checks it against a local copy."""
    name = "ps" if rank == 0 else "trainer"
    rpc.init_rpc(name, rank=rank, world_size=ws)
    out: dict[str, Any] = {}
    if rank == 1:
        torch.manual_seed(0)
        model = RNNModel("ps", ntoken=10, ninp=4, nhid=5, nlayers=1, dropout=0.0)
        tokens = torch.randint(10, (3, 2))
        hidden = (torch.zeros(1, 2, 5), torch.zeros(1, 2, 5))
        decoded, _ = model(tokens, hidden)
        params = model.parameter_rrefs()
        out.update(tokens=tokens, decoded=decoded.detach(),
                   owners=[p.owner_name() for p in params],
                   params=[p.to_here().detach() for p in params])
    rpc.shutdown()
    return out


def test_seed_004_model_runs_with_only_the_imports_changed() -> None:
    out = run_ranks(seed004, 2, timeout=60)[1]
    # embedding weight on ps, the LSTM's four tensors here, the decoder's two on ps
    assert out["owners"] == ["ps"] + ["trainer"] * 4 + ["ps", "ps"]
    emb_weight, w_ih, w_hh, b_ih, b_hh, dec_weight, dec_bias = out["params"]
    lstm = torch.nn.LSTM(4, 5, 1)
    with torch.no_grad():
        for name, value in zip(("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"),
                               (w_ih, w_hh, b_ih, b_hh), strict=True):
            getattr(lstm, name).copy_(value)
        hidden = (torch.zeros(1, 2, 5), torch.zeros(1, 2, 5))
        output, _ = lstm(torch.nn.functional.embedding(out["tokens"], emb_weight), hidden)
        expected = output @ dec_weight.t() + dec_bias
    torch.testing.assert_close(out["decoded"], expected)
