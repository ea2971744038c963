"""RRefs with real workers: the API, and the guarantees of docs/design/rref-protocol.md
checked on the owner with finalizers (a value is freed when, and only when, no reference to
it is left anywhere)."""

from __future__ import annotations

import functools

import torch

from ringtorch.testing import run_ranks
from tests.integration import _rpc_ranks as R


@functools.cache
def api() -> dict:
    return run_ranks(R.rref_api, 2, timeout=60)[0]


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


@functools.cache
def lifetime() -> dict:
    return run_ranks(R.rref_lifetime, 3, timeout=90)[0]


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
    assert out["alive_while_forked"] is True
    assert out["fork_usable"] == [1.0, 1.0]
    assert out["chain"] == 1.0 and out["chain_freed"] is True


def test_g4_a_reference_sent_back_to_its_owner_survives_its_deletion_in_flight() -> None:
    out = lifetime()
    assert out["back_value"] == [7.0, 7.0]
    assert out["back_freed"] is True


def test_g5_a_dead_user_releases_its_references() -> None:
    out = run_ranks(R.dead_user, 3, timeout=60)[0]
    assert out == {"alive": True, "kill": "RpcPeerDiedError", "freed": True,
                   "shutdown": "RpcPeerDiedError"}


def test_seed_004_model_runs_with_only_the_imports_changed() -> None:
    out = run_ranks(R.seed004, 2, timeout=60)[1]
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
