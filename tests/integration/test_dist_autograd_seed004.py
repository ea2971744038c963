"""Seed 004's program (examples/seed004_parameter_server.py): its distributed gradients
equal those of the same model trained in one process with plain torch (same seeds, same
batch), whichever way the parameter server's concurrent constructions of its modules
interleave, and the example trains (its loss falls)."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.module import register_module_parameter_registration_hook

from examples import seed004_parameter_server as E
from ringtorch.testing import run_ranks
from tests.integration import _dist_autograd_ranks as R


def test_distributed_gradients_equal_single_process_gradients() -> None:
    got = run_ranks(R.seed004_one_step, 2, timeout=60)[1]
    ids, ntoken = E.make_corpus()
    c = E.CONFIG
    emb = E.EmbeddingTable(ntoken, c["ninp"], 0.0, 0)
    torch.manual_seed(1)
    rnn = torch.nn.LSTM(c["ninp"], c["nhid"], c["nlayers"])
    dec = E.Decoder(ntoken, c["nhid"], 0.0, 2)
    input, target = E.batches(ids, c["batch"], c["bptt"])[1]
    output, _ = rnn(emb(input), E.init_hidden(c["nlayers"], c["batch"], c["nhid"]))
    loss = torch.nn.functional.cross_entropy(dec(output).view(-1, ntoken), target)
    loss.backward()
    assert abs(got["loss"] - loss.item()) < 1e-6
    for key, module in (("emb", emb), ("lstm", rnn), ("dec", dec)):
        expected = [p.grad for p in module.parameters()]
        assert len(got[key]) == len(expected)
        for g, e in zip(got[key], expected, strict=True):
            torch.testing.assert_close(g, e)


def test_the_parameter_servers_modules_do_not_draw_from_torchs_global_generator() -> None:
    # The parameter server builds the embedding table and the decoder at the same time, on two
    # threads of its pool: a draw from the global generator by the other construction while
    # one is built (forced here at each parameter's registration) must not change its weights.
    ids, ntoken = E.make_corpus()
    c = E.CONFIG

    def build() -> list[torch.Tensor]:
        modules = [E.EmbeddingTable(ntoken, c["ninp"], 0.0, 0), E.Decoder(ntoken, c["nhid"], 0.0, 2)]
        return [p.detach() for m in modules for p in m.parameters()]

    def the_other_construction_draws(module: torch.nn.Module, name: str, param: Any) -> None:
        torch.rand(1)

    alone = build()
    hook = register_module_parameter_registration_hook(the_other_construction_draws)
    try:
        disturbed = build()
    finally:
        hook.remove()
    assert len(alone) == len(disturbed) == 3
    for a, b in zip(alone, disturbed, strict=True):
        assert torch.equal(a, b)


def test_the_example_trains() -> None:
    first, last, _ = run_ranks(E.run_worker, 2, args=(40, "ringtorch"), timeout=90)[1]
    assert last < first - 0.1

