"""rendezvous() with real processes: every scheme, the environment fallbacks, and the errors."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ringtorch import rendezvous as rdzv
from ringtorch.rendezvous import (
    UnknownRendezvousSchemeError,
    register_rendezvous_handler,
    rendezvous,
)
from ringtorch.store import HashStore, TCPStore
from ringtorch.testing import run_ranks
from tests.integration import _store_ranks as ranks

WORLD = 3


def _expected(world_size: int, again: str) -> list[tuple[int, int, list[bytes]]]:
    seen = [str(r).encode() for r in range(world_size)] + [again.encode()]
    return [(r, world_size, seen) for r in range(world_size)]


def test_env_scheme_meets_through_master_addr_and_port():
    assert run_ranks(ranks.rendezvous_and_exchange, WORLD, args=("env://",)) == _expected(
        WORLD, "Unable to perform re-rendezvous using env:// method")


def test_env_scheme_takes_rank_and_size_from_slurm_when_rank_is_unset():
    results = run_ranks(ranks.rendezvous_and_exchange, WORLD, args=(
        "env://", ("RANK", "WORLD_SIZE"),
        {"SLURM_PROCID": "{rank}", "SLURM_NTASKS": "{world_size}", "SLURM_LOCALID": "{rank}"}))
    assert results == _expected(WORLD, "Unable to perform re-rendezvous using env:// method")


def test_env_scheme_takes_rank_and_size_from_open_mpi_when_rank_is_unset():
    results = run_ranks(ranks.rendezvous_and_exchange, 2, args=(
        "env://", ("RANK", "WORLD_SIZE"),
        {"OMPI_COMM_WORLD_RANK": "{rank}", "OMPI_COMM_WORLD_SIZE": "{world_size}"}))
    assert results == _expected(2, "Unable to perform re-rendezvous using env:// method")


def test_env_scheme_prefers_rank_over_slurm():
    # SLURM says every process is rank 0 of 1; RANK/WORLD_SIZE (set by the harness) win
    results = run_ranks(ranks.rendezvous_and_exchange, 2, args=(
        "env://", (), {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}))
    assert results == _expected(2, "Unable to perform re-rendezvous using env:// method")


def test_tcp_scheme_with_rank_and_world_size_in_the_query():
    url = "tcp://127.0.0.1:{port}?rank={rank}&world_size={world_size}"
    results = run_ranks(ranks.tcp_with_query, WORLD, args=(url,))
    assert results == _expected(WORLD, "Unable to perform re-rendezvous using tcp:// method")


def test_tcp_scheme_with_rank_and_world_size_as_arguments():
    results = run_ranks(ranks.tcp_with_arguments, 2)
    assert results == _expected(2, "Unable to perform re-rendezvous using tcp:// method")


def test_file_scheme_shares_one_file(tmp_path):
    results = run_ranks(ranks.file_scheme, WORLD, args=(str(tmp_path / "rdzv"),))
    assert results == _expected(WORLD, "Unable to perform rerendezvous using file:// method")


def test_agent_store_mode_makes_every_rank_a_client(monkeypatch):
    host = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    results = run_ranks(ranks.rendezvous_and_exchange, 2, args=("env://",),
                        env={"MASTER_PORT": str(host.port),
                             "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert results == _expected(2, "Unable to perform re-rendezvous using env:// method")
    assert host.get("rank/1") == b"1"
    host.close()


def test_env_scheme_without_master_addr_names_it(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match=r"^Error initializing torch.distributed using env:// "
                                         r"rendezvous: environment variable MASTER_ADDR "
                                         r"expected, but not set"):
        next(rendezvous("env://"))


def test_env_scheme_without_any_rank_variable_names_what_it_looked_for(monkeypatch):
    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match=(
            r"^Error initializing torch.distributed using env:// rendezvous: environment "
            r"variable RANK expected, but not set \(looked for RANK or SLURM_PROCID or "
            r"OMPI_COMM_WORLD_RANK or PMI_RANK; or pass rank= to init_process_group\)$")):
        next(rendezvous("env://"))


def test_unknown_scheme_names_the_supported_ones():
    with pytest.raises(UnknownRendezvousSchemeError, match=(
            r"^No rendezvous handler for etcd:// \(init_method 'etcd://host:1\?rank=0&"
            r"world_size=1'\); supported: env://, file://, tcp://")) as info:
        rendezvous("etcd://host:1", 0, 1)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)


def test_registering_a_taken_scheme_raises():
    with pytest.raises(RuntimeError, match=r"^Rendezvous handler for tcp:// already "
                                           r"registered$"):
        register_rendezvous_handler("tcp", lambda url, **kw: iter(()))


def test_a_registered_handler_gets_the_merged_url_and_kwargs(monkeypatch):
    monkeypatch.setattr(rdzv, "_handlers", dict(rdzv._handlers))
    calls = []
    store = HashStore()

    def handler(url, **kwargs):
        calls.append((url, kwargs))
        yield store, 1, 2

    register_rendezvous_handler("mine", handler)
    assert next(rendezvous("mine://somewhere", 1, 2, timeout=5)) == (store, 1, 2)
    assert calls == [("mine://somewhere?rank=1&world_size=2", {"timeout": 5})]


def test_rank_in_both_the_url_and_the_arguments_is_refused():
    with pytest.raises(AssertionError, match=r"^The url: tcp://h:1\?rank=0 has node-specific "
                                             r"arguments\(rank, world_size\) already\.$"):
        rendezvous("tcp://h:1?rank=0", 0, 1)


@pytest.mark.parametrize("args, message", [
    ((123,), r"^`url` must be a string\. <class 'int'>: 123$"),
    (("env://", "0"), r"^`rank` must be an integer\. 0$"),
    (("env://", 0, 1.5), r"^`world_size` must be an integer\. 1\.5$"),
])
def test_argument_types_are_checked_as_torch_does(args, message):
    with pytest.raises(RuntimeError, match=message):
        rendezvous(*args)


def test_tcp_port_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"^Error initializing torch.distributed using tcp:// "
                                         r"rendezvous: port number invalid"):
        next(rendezvous("tcp://127.0.0.1:70000?rank=0&world_size=1"))
