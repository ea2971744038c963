"""torch's FSDP2 and DCP on backend "ringtorch": mixed precision equal to gloo, state dicts and
checkpoints equal to one process, resume at another world size.

Three jobs (tests/integration/_fsdp2_door_ranks.py): at world 2, FSDP2 with bf16 parameters
and fp32 reduction on ringtorch and on a gloo group of the same job; fp32 training, its state
dicts, a DCP save with Adam's state and an ``async_save``. Then the checkpoint is loaded at
world 3 (FSDP2, uneven shards) and at world 1 (a plain module) and training goes on. Expected
values are torch's training of the whole model on the whole batch in this process.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _fsdp2_door_ranks as R


@functools.cache
def _jobs(tmp: str) -> dict[str, list[dict]]:
    ckpt, async_ckpt = str(Path(tmp) / "w2"), str(Path(tmp) / "async")
    return {"w2": run_ranks(R.world2, 2, args=(ckpt, async_ckpt), timeout=120),
            "w3": run_ranks(R.resume, 3, args=(ckpt,), timeout=120),
            "w1": run_ranks(R.resume, 1, args=(ckpt,), timeout=120),
            "async": run_ranks(R.resume, 1, args=(async_ckpt,), timeout=120),
            "async_default": run_ranks(R.resume, 1, args=(async_ckpt + "_default",),
                                       timeout=120)}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    return _jobs(str(tmp_path_factory.mktemp("fsdp2")))


def _reference(steps: int) -> tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One process, the whole batch: losses, parameters and Adam's exp_avg after ``steps``."""
    net = R.model()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    losses = R.train(net, opt, range(steps), 0, 1)
    names = dict(zip(net.parameters(), (n for n, _ in net.named_parameters()), strict=True))
    exp_avg = {names[p]: s["exp_avg"].clone() for p, s in opt.state.items()}
    return losses, {k: v.clone() for k, v in net.state_dict().items()}, exp_avg


def test_mixed_precision_training_on_ringtorch_equals_gloo(jobs: dict[str, list[dict]]) -> None:
    for rank, res in enumerate(jobs["w2"]):
        assert res["backend"] == "ringtorch"
        mine, gloos = res["mp_ringtorch"], res["mp_gloo"]
        # the same bf16 all_gathers and fp32 sums of two values (exact in any order): the
        # two backends must agree bit for bit, no tolerance
        assert mine[0] == gloos[0], f"rank {rank} losses"
        for name, ref in gloos[1].items():
            torch.testing.assert_close(mine[1][name], ref, rtol=0, atol=0, msg=name)
        assert res["mp_ringtorch_out_dtype"] == res["mp_gloo_out_dtype"] == torch.bfloat16
    # and bf16 did compute: fp32 training of the same steps gives other losses (bf16 keeps
    # 8 bits of mantissa: they differ from the third digit on)
    mixed = [sum(r["mp_ringtorch"][0][i] for r in jobs["w2"]) / 2 for i in range(3)]
    fp32 = _reference(3)[0]
    assert all(abs(m - f) > 1e-5 * abs(f) for m, f in zip(mixed, fp32, strict=True))


def test_sharded_and_full_state_dicts_equal_one_process(jobs: dict[str, list[dict]]) -> None:
    losses, state, _ = _reference(2)
    for rank, res in enumerate(jobs["w2"]):
        for name, ref in state.items():
            kind, placements, local = res["sharded"][name]
            assert kind == "DTensor" and placements == ["S(0)"], name
            rows = -(-ref.shape[0] // 2)  # torch's Shard(0): ceil-sized chunks, rank order
            torch.testing.assert_close(local, ref[rank * rows:(rank + 1) * rows], msg=name)
            full = res["full"][name]
            assert type(full) is torch.Tensor and full.shape == ref.shape, name
            torch.testing.assert_close(full, ref, msg=name)
        # the ranks' losses are the means of the halves of the whole batch's
        whole = [sum(r["losses"][i] for r in jobs["w2"]) / 2 for i in range(2)]
        torch.testing.assert_close(whole, losses)


@pytest.mark.parametrize("world", ["w3", "w1"])
def test_a_world_2_checkpoint_resumes_at_another_world_size(
        jobs: dict[str, list[dict]], world: str) -> None:
    _, at_save, exp_avg = _reference(2)
    losses, after, _ = _reference(4)
    ranks = jobs[world]
    for res in ranks:
        for name, ref in at_save.items():
            torch.testing.assert_close(res["loaded"][name], ref, msg=name)
        for name, ref in exp_avg.items():  # Adam's state, resharded with the parameters
            torch.testing.assert_close(res["exp_avg"][name], ref, msg=name)
        for name, ref in after.items():
            torch.testing.assert_close(res["after"][name], ref, msg=name)
    whole = [sum(r["losses"][i] for r in ranks) / len(ranks) for i in range(2)]
    torch.testing.assert_close(whole, losses[2:])


@pytest.mark.parametrize(("job", "steps"), [("async", 2), ("async_default", 3)])
def test_async_save_holds_the_state_of_its_call_while_training_goes_on(
        jobs: dict[str, list[dict]], job: str, steps: int) -> None:
    """torch's async_save needs a group with a CPU backend (it asserts one; the door's is);
    its upload issues collectives from a thread, so while training goes on on the default
    group it gets a group of its own (``async``); ``async_default`` is waited for at once."""
    _, at_save, exp_avg = _reference(steps)
    (res,) = jobs[job]
    for name, ref in at_save.items():
        torch.testing.assert_close(res["loaded"][name], ref, msg=name)
    for name, ref in exp_avg.items():
        torch.testing.assert_close(res["exp_avg"][name], ref, msg=name)
    # a training step ran on the default group while the upload's collectives ran on theirs
    for res in jobs["w2"]:
        assert len(res["after_async"]) == 1
