"""TorchStore: torch's own store seen through ringtorch's Store API, as the engine's
rendezvous uses it under backend "ringtorch" (over torch's HashStore and TCPStore).

Expected values are written out; timeouts and errors are worded by ringtorch's Store base."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from ringtorch._errors import DistStoreError, QueueEmptyError
from ringtorch.c10d.torch_store import TorchStore
from ringtorch.store import PrefixStore


@pytest.fixture(params=["hash", "tcp"])
def store(request: pytest.FixtureRequest) -> Iterator[TorchStore]:
    if request.param == "hash":
        inner = dist.HashStore()
    else:
        inner = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30))
    inner.set_timeout(timedelta(milliseconds=300))
    yield TorchStore(inner)


def test_values_keys_and_counters_pass_through(store: TorchStore) -> None:
    store.set("a", "x")
    store.set(b"b", b"\x00\xff")
    assert store.get("a") == b"x" and store.get("b") == b"\x00\xff"
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5
    assert store.check(["a", "b"]) and not store.check(["a", "missing"])
    assert store.compare_set("a", "x", "y") == b"y" and store.get("a") == b"y"
    store.multi_set(["m1", "m2"], ["1", "2"])
    assert store.multi_get(["m1", "m2"]) == [b"1", b"2"]
    store.append("m1", "0")
    assert store.get("m1") == b"10"
    assert store.delete_key("m2") and not store.check(["m2"])
    store.queue_push("q", "first")
    store.queue_push("q", "second")
    assert store.queue_len("q") == 2 and store.queue_pop("q") == b"first"


def test_a_missing_key_times_out_in_ringtorchs_words(store: TorchStore) -> None:
    kind = type(store.torch_store).__name__
    with pytest.raises(DistStoreError, match=rf"^get of key 'nope' timed out after "
                                             rf"0:00:00.300000 \(store timeout, 300ms\) on "
                                             rf"torch {kind}$"):
        store.get("nope")
    with pytest.raises(DistStoreError, match=r"^wait for keys \['nope'\] timed out after "
                                             r"0:00:00.100000 \(wait timeout, 100ms\)"):
        store.wait(["nope"], timedelta(milliseconds=100))
    with pytest.raises(QueueEmptyError, match=rf"^queue 'empty' is empty on torch {kind}$"):
        store.queue_pop("empty", block=False)


def test_a_blocked_get_wakes_when_another_handle_sets_the_key(store: TorchStore) -> None:
    store.set_timeout(timedelta(seconds=10))
    # the delay only lets get block first; the result holds whatever the timing
    other = store.torch_store.clone()  # another process's handle, as in a rendezvous
    setter = threading.Timer(0.1, other.set, ("late", b"v"))
    setter.start()
    assert store.get("late") == b"v"
    setter.join()


def test_ringtorch_prefixes_nest_over_torchs_store(store: TorchStore) -> None:
    PrefixStore("ringtorch/1", store).set("k", "v")
    assert store.torch_store.get("ringtorch/1/k") == b"v"
