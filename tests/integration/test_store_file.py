"""FileStore between real processes: one file, real locks, removed by its last user."""

from __future__ import annotations

import os
import struct
from datetime import timedelta

import pytest

from ringtorch._errors import DistStoreError
from ringtorch.store import FileStore
from ringtorch.testing import run_ranks
from tests.integration import _store_ranks as ranks


def test_four_processes_adding_through_one_file_get_the_exact_total(tmp_path):
    path = str(tmp_path / "store")
    assert run_ranks(ranks.add_many, 4, args=(100, "file", path)) == [400] * 4


def test_the_file_is_removed_when_the_last_of_world_size_users_closes(tmp_path):
    path = str(tmp_path / "store")
    run_ranks(ranks.add_many, 3, args=(10, "file", path))
    assert not os.path.exists(path)


def test_compare_set_race_through_a_file_has_exactly_one_winner(tmp_path):
    path = str(tmp_path / "store")
    results = run_ranks(ranks.race_compare_set, 3, args=("file", path))
    assert len(set(results)) == 1 and results[0] in {b"rank0", b"rank1", b"rank2"}


def test_get_and_wait_block_until_another_process_writes(tmp_path):
    path = str(tmp_path / "store")
    assert run_ranks(ranks.get_before_set, 3, args=("file", path)) == [
        b"", b"from rank 0", b"from rank 0"]


def test_the_file_stays_while_fewer_than_world_size_users_finished(tmp_path):
    path = str(tmp_path / "store")
    first = FileStore(path, 2)
    first.set("k", "v")
    first.close()
    assert os.path.exists(path)
    second = FileStore(path, 2)
    assert second.get("k") == b"v"
    second.close()
    assert not os.path.exists(path)


def test_a_record_cut_short_by_a_crashed_writer_is_dropped(tmp_path):
    path = str(tmp_path / "store")
    store = FileStore(path, -1, timeout=timedelta(milliseconds=200))
    store.set("good", "1")
    with open(path, "ab") as f:  # what a writer killed in the middle of a write leaves
        f.write(struct.pack("<BII", 1, 3, 100) + b"badpartial")
    other = FileStore(path, -1, timeout=timedelta(milliseconds=200))
    assert other.get("good") == b"1"
    other.set("after", "2")
    assert store.get("after") == b"2"
    with pytest.raises(DistStoreError, match=r"^get of key 'bad' timed out"):
        store.get("bad")
    store.close()
    other.close()


def test_a_file_that_cannot_be_opened_is_named(tmp_path):
    path = str(tmp_path / "missing-dir" / "store")
    with pytest.raises(ValueError, match=rf"^FileStore cannot open '{path}': No such file"):
        FileStore(path, 1)
