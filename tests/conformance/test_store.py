"""The Store contract, checked against every store: TCPStore, FileStore, HashStore, and
PrefixStore over HashStore and over TCPStore.

Each test states one behaviour of torch.distributed's Store API (semantics checked against
torch 2.13's own stores, quirks included: compare_set on an absent key, queues seen by
check/wait but not by get). Expected values are written out, never computed by ringtorch.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest

from ringtorch._errors import DistStoreError, QueueEmptyError
from ringtorch.store import FileStore, HashStore, PrefixStore, Store, TCPStore

SHORT = timedelta(milliseconds=100)


@dataclass
class Subject:
    store: Store
    where: str      # regex for the store named in timeout messages
    prefix: str     # how the store names our keys in messages ("" or "pre/")


def _tcp(tmp_path) -> Subject:
    store = TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30))
    return Subject(store, rf"TCPStore 127\.0\.0\.1:{store.port}", "")


def _file(tmp_path) -> Subject:
    path = str(tmp_path / "store")
    return Subject(FileStore(path, 1), f"FileStore {re.escape(path)}", "")


def _hash(tmp_path) -> Subject:
    return Subject(HashStore(), "HashStore", "")


def _prefix_hash(tmp_path) -> Subject:
    return Subject(PrefixStore("pre", HashStore()), "HashStore", "pre/")


def _prefix_tcp(tmp_path) -> Subject:
    inner = _tcp(tmp_path)
    return Subject(PrefixStore("pre", inner.store), inner.where, "pre/")


FACTORIES: dict[str, Callable[..., Subject]] = {
    "tcp": _tcp, "file": _file, "hash": _hash, "prefix-hash": _prefix_hash,
    "prefix-tcp": _prefix_tcp,
}


@pytest.fixture(params=sorted(FACTORIES))
def subject(request, tmp_path) -> Iterator[Subject]:
    made = FACTORIES[request.param](tmp_path)
    yield made
    made.store.close()
    if isinstance(made.store, PrefixStore):
        made.store.underlying_store.close()


def _later(record: list[str], what: str, fn: Callable[[], object]) -> threading.Thread:
    """Run ``fn`` on another thread a little later, noting ``what`` in ``record`` first.

    The delay only makes the blocking call under test block before ``fn`` runs (so that its
    waking path is what runs); the tests assert the order in ``record``, which holds whatever
    the timing: a blocking call that returned before ``fn`` started is caught.
    """
    def body() -> None:
        time.sleep(0.1)
        record.append(what)
        fn()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def test_set_then_get_returns_the_bytes(subject):
    subject.store.set("k", b"\x00\xffbinary")
    assert subject.store.get("k") == b"\x00\xffbinary"


def test_str_values_are_stored_as_utf8(subject):
    subject.store.set("k", "héllo")
    assert subject.store.get("k") == "héllo".encode()


def test_set_replaces_the_value(subject):
    subject.store.set("k", "one")
    subject.store.set("k", "two")
    assert subject.store.get("k") == b"two"


def test_empty_key_and_empty_value_are_allowed(subject):
    subject.store.set("", b"")
    assert subject.store.get("") == b""


def test_get_blocks_until_another_thread_sets_the_key(subject):
    setter_store, record = subject.store.clone(), []
    thread = _later(record, "set", lambda: setter_store.set("late", "here"))
    assert subject.store.get("late") == b"here"
    record.append("got")
    thread.join()
    assert record == ["set", "got"]


def test_get_of_a_missing_key_times_out_naming_key_and_timeout(subject):
    subject.store.set_timeout(SHORT)
    started = time.monotonic()
    with pytest.raises(DistStoreError, match=(
            rf"^get of key '{subject.prefix}nokey' timed out after 0:00:00.100000 "
            rf"\(store timeout, 100ms\) on {subject.where}$")):
        subject.store.get("nokey")
    assert time.monotonic() - started < 5.0


def test_store_stays_usable_after_a_timeout(subject):
    subject.store.set_timeout(SHORT)
    with pytest.raises(DistStoreError):
        subject.store.get("nokey")
    subject.store.set("nokey", "now")
    assert subject.store.get("nokey") == b"now"


def test_wait_returns_once_every_key_exists(subject):
    subject.store.set("a", "1")
    setter_store, record = subject.store.clone(), []
    thread = _later(record, "set b", lambda: setter_store.set("b", "2"))
    assert subject.store.wait(["a", "b"]) is None
    record.append("wait returned")
    assert subject.store.check(["a", "b"])  # b exists the moment wait returns
    thread.join()
    assert record == ["set b", "wait returned"]


def test_wait_with_its_own_timeout_names_every_key(subject):
    subject.store.set("a", "1")
    with pytest.raises(DistStoreError, match=(
            rf"^wait for keys \['{subject.prefix}a', '{subject.prefix}b'\] timed out after "
            rf"0:00:00.100000 \(wait timeout, 100ms\) on {subject.where}$")):
        subject.store.wait(["a", "b"], SHORT)


def test_wait_without_timeout_uses_the_store_timeout(subject):
    subject.store.set_timeout(SHORT)
    with pytest.raises(DistStoreError, match=r"timed out after 0:00:00.100000 \(store timeout"):
        subject.store.wait(["never"])


def test_wait_takes_a_list_not_a_string(subject):
    with pytest.raises(TypeError, match=r"^wait takes a list of keys, not str \('abc'\)$"):
        subject.store.wait("abc")


def test_check_is_true_only_when_every_key_exists(subject):
    subject.store.set("a", "1")
    assert subject.store.check(["a"]) is True
    assert subject.store.check(["a", "b"]) is False
    assert subject.store.check([]) is True


def test_add_starts_missing_keys_at_zero_and_returns_the_new_value(subject):
    assert subject.store.add("n", 5) == 5
    assert subject.store.add("n", -7) == -2
    assert subject.store.add("n", 0) == -2
    assert subject.store.get("n") == b"-2"


def test_add_on_a_non_integer_value_raises_value_error(subject):
    subject.store.set("s", "abc")
    with pytest.raises(ValueError, match=rf"^add: key '{subject.prefix}s' holds b'abc', "
                                         rf"not an integer$"):
        subject.store.add("s", 1)
    assert subject.store.get("s") == b"abc"


def test_add_of_a_non_int_amount_is_a_type_error(subject):
    with pytest.raises(TypeError, match=r"^add amount must be an int, not float$"):
        subject.store.add("n", 1.5)


@pytest.mark.parametrize("initial, expected, desired, returned, after", [
    (None, "", "new", b"new", b"new"),        # absent + empty expected: inserts
    (None, "x", "new", b"x", None),           # absent + other expected: returns expected only
    (b"cur", "cur", "new", b"new", b"new"),   # match: swaps
    (b"cur", "zz", "new", b"cur", b"cur"),    # mismatch: returns the current value
    (b"", "", "new", b"new", b"new"),         # present and empty equals empty expected
])
def test_compare_set_follows_torch(subject, initial, expected, desired, returned, after):
    if initial is not None:
        subject.store.set("k", initial)
    assert subject.store.compare_set("k", expected, desired) == returned
    if after is None:
        assert subject.store.check(["k"]) is False
    else:
        assert subject.store.get("k") == after


def test_delete_key_reports_whether_the_key_existed(subject):
    subject.store.set("k", "v")
    assert subject.store.delete_key("k") is True
    assert subject.store.delete_key("k") is False
    assert subject.store.check(["k"]) is False


def test_num_keys_counts_each_new_key_once(subject):
    before = subject.store.num_keys()
    subject.store.set("a", "1")
    subject.store.set("a", "2")
    subject.store.add("b", 1)
    assert subject.store.num_keys() == before + 2
    subject.store.delete_key("a")
    assert subject.store.num_keys() == before + 1


def test_list_keys_lists_user_keys_only(subject):
    subject.store.set("a", "1")
    subject.store.add("b", 1)
    assert sorted(subject.store.list_keys()) == ["a", "b"]


def test_multi_set_then_multi_get_keeps_order(subject):
    subject.store.multi_set(["x", "y", "z"], ["1", b"2", "3"])
    assert subject.store.multi_get(["z", "x", "y"]) == [b"3", b"1", b"2"]


def test_multi_get_waits_for_missing_keys(subject):
    subject.store.set("x", "1")
    setter_store, record = subject.store.clone(), []
    thread = _later(record, "set y", lambda: setter_store.set("y", "2"))
    assert subject.store.multi_get(["x", "y"]) == [b"1", b"2"]
    record.append("got")
    thread.join()
    assert record == ["set y", "got"]


def test_multi_get_times_out_naming_the_keys(subject):
    subject.store.set_timeout(SHORT)
    with pytest.raises(DistStoreError, match=rf"^multi_get of keys \['{subject.prefix}m'\] "
                                             rf"timed out after 0:00:00.100000"):
        subject.store.multi_get(["m"])


def test_multi_set_needs_as_many_values_as_keys(subject):
    with pytest.raises(ValueError, match=r"^multi_set got 2 keys and 1 values; they must be "
                                         r"as many$"):
        subject.store.multi_set(["a", "b"], ["1"])


def test_append_creates_then_extends(subject):
    subject.store.append("log", "a")
    subject.store.append("log", b"bc")
    assert subject.store.get("log") == b"abc"


def test_queue_is_first_in_first_out(subject):
    for item in ("1", "2", "3"):
        subject.store.queue_push("q", item)
    assert subject.store.queue_len("q") == 3
    assert [subject.store.queue_pop("q") for _ in range(3)] == [b"1", b"2", b"3"]
    assert subject.store.queue_len("q") == 0


def test_queue_pop_without_blocking_on_empty_raises_queue_empty(subject):
    with pytest.raises(QueueEmptyError, match=rf"^queue '{subject.prefix}q' is empty on "
                                              rf"{subject.where}$"):
        subject.store.queue_pop("q", block=False)


def test_queue_pop_blocks_until_a_push(subject):
    pusher, record = subject.store.clone(), []
    thread = _later(record, "push", lambda: pusher.queue_push("q", "item"))
    assert subject.store.queue_pop("q") == b"item"
    record.append("popped")
    thread.join()
    assert record == ["push", "popped"]


def test_queue_pop_times_out_naming_the_queue(subject):
    subject.store.set_timeout(SHORT)
    with pytest.raises(DistStoreError, match=rf"^queue_pop of queue '{subject.prefix}q' timed "
                                             rf"out after 0:00:00.100000"):
        subject.store.queue_pop("q")


def test_a_non_empty_queue_counts_as_an_existing_key_for_check(subject):
    subject.store.queue_push("q", "x")
    assert subject.store.check(["q"]) is True
    subject.store.wait(["q"], SHORT)


def test_timeout_property_and_set_timeout(subject):
    subject.store.set_timeout(timedelta(seconds=7))
    assert subject.store.timeout == timedelta(seconds=7)


def test_set_timeout_wants_a_timedelta(subject):
    with pytest.raises(TypeError, match=r"^timeout must be a datetime.timedelta, not float$"):
        subject.store.set_timeout(1.0)


def test_keys_must_be_strings(subject):
    with pytest.raises(TypeError, match=r"^store keys must be str, not int \(3\)$"):
        subject.store.set(3, "v")


def test_values_must_be_str_or_bytes(subject):
    with pytest.raises(TypeError, match=r"^store values must be str or bytes, not int$"):
        subject.store.set("k", 3)


def test_concurrent_adds_from_threads_are_exact(subject):
    clones = [subject.store.clone() for _ in range(4)]

    def hammer(store: Store) -> None:
        for _ in range(200):
            store.add("total", 1)

    threads = [threading.Thread(target=hammer, args=(c,)) for c in clones]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert subject.store.get("total") == b"800"


def test_operations_on_a_closed_store_raise(subject):
    subject.store.close()
    with pytest.raises(DistStoreError, match=r" is closed$"):
        subject.store.get("k")


class DictStore(Store):
    """A user's store, written as torch users write them: public methods only."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, bytes] = {}

    def set(self, key, value):
        self.data[key] = value.encode() if isinstance(value, str) else bytes(value)

    def get(self, key):
        return self.data[key]


def test_a_python_subclass_overriding_public_methods_works_under_a_prefix_store():
    user = DictStore()
    view = PrefixStore("pg", user)
    view.set("k", "v")
    assert user.data == {"pg/k": b"v"} and view.get("k") == b"v"


def test_what_a_python_subclass_leaves_out_says_so():
    with pytest.raises(NotImplementedError, match=r"^DictStore does not implement add\(\)$"):
        DictStore().add("k", 1)


@pytest.mark.parametrize("kind", ["tcp", "file", "hash"])
def test_prefix_stores_over_one_store_do_not_see_each_other(kind, tmp_path):
    base = FACTORIES[kind](tmp_path).store
    left, right = PrefixStore("left", base), PrefixStore("right", base)
    left.set("k", "L")
    right.set("k", "R")
    left.add("n", 1)
    assert (left.get("k"), right.get("k")) == (b"L", b"R")
    assert right.check(["n"]) is False
    assert sorted(left.list_keys()) == ["k", "n"] and right.list_keys() == ["k"]
    assert right.delete_key("n") is False and left.get("n") == b"1"
    nested = PrefixStore("group0/", PrefixStore("default_pg", base))
    nested.set("rank0", "addr")
    assert base.get("default_pg/group0//rank0") == b"addr"
    base.close()
