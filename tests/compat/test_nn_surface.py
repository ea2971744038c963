"""ringtorch.distributed.nn has torch.distributed.nn's surface: the functional collectives'
signatures, RemoteModule's methods and signatures, and ``_remote_device``'s parsing (every
accepted form, every refused one, with torch's result or error)."""

from __future__ import annotations

import inspect
import types

import pytest
import torch
import torch.distributed.nn as tnn
from torch.distributed import _remote_device as torch_remote_device

import ringtorch.distributed.nn as rnn
from ringtorch.distributed.remote_device import _remote_device

FUNCTIONS = ["all_gather", "all_reduce", "all_to_all", "all_to_all_single", "broadcast",
             "gather", "reduce", "reduce_scatter", "scatter"]


def _params(fn: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_every_public_name_of_torch_distributed_nn_is_there() -> None:
    theirs = {n for n in dir(tnn) if not n.startswith("_")
              and not isinstance(getattr(tnn, n), types.ModuleType)}
    assert theirs - set(dir(rnn)) == set()
    assert sorted(rnn.__all__) == sorted(["RemoteModule", *FUNCTIONS])


@pytest.mark.parametrize("name", FUNCTIONS)
def test_functional_signatures_are_torchs(name: str) -> None:
    assert _params(getattr(rnn.functional, name)) == _params(getattr(tnn.functional, name))
    assert getattr(rnn.functional, name).__doc__


def test_remote_module_has_torchs_methods_and_signatures() -> None:
    def methods(cls: type) -> set[str]:  # torch's private helpers (one underscore) aside
        return {n for n, v in inspect.getmembers(cls)
                if callable(v) and not (n.startswith("_") and not n.startswith("__"))}

    assert methods(tnn.RemoteModule) - methods(rnn.RemoteModule) == set()
    for name in ("__init__", "remote_parameters", "get_module_rref", "train", "eval",
                 "init_from_module_rref", "parameters"):
        want = [(n, k, d) for n, k, d in _params(getattr(tnn.RemoteModule, name))]
        assert _params(getattr(rnn.RemoteModule, name)) == want, name


def _parse(cls: type, spec: object) -> tuple:
    try:
        d = cls(spec)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return repr(d), d.worker_name(), d.rank(), d.device()


@pytest.mark.parametrize("spec", [
    "worker/cpu", "rank:0/cpu", "worker", "rank:1", "cpu", "cuda:0", "ps/cuda:1", "a/b/c",
    "/cpu", "rank:x/cpu", "a:b:c/cpu", "w:1/cpu", "w/notadevice", "", torch.device("cpu"), 3])
def test_remote_device_parses_as_torch(spec: object) -> None:
    assert _parse(_remote_device, spec) == _parse(torch_remote_device, spec)


def test_remote_devices_compare_and_hash_by_value() -> None:
    assert _remote_device("ps/cpu") == _remote_device("ps")
    assert len({_remote_device("rank:0/cpu"), _remote_device("rank:0")}) == 1
    assert _remote_device("ps/cpu") != _remote_device("rank:0/cpu")
    with pytest.raises(ValueError, match=r"^Could not parse remote_device: a/b/c\. The valid "
                                         r"format is '<workername>/<device>' or "
                                         r"'rank:<rank>/<device>' or '<device>'$"):
        _remote_device("a/b/c")
