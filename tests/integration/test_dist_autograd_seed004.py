"""Seed 004's program (examples/seed004_parameter_server.py): its distributed gradients
equal those of the same model trained in one process with plain torch (same seeds, same
batch), and the example trains (its loss falls)."""

from __future__ import annotations

import torch

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


def test_the_example_trains() -> None:
    first, last, _ = run_ranks(E.run_worker, 2, args=(40, "ringtorch"), timeout=90)[1]
    assert last < first - 0.1

