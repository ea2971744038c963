"""init_method URL parsing, as tables: what each URL and environment gives, or which error."""

from __future__ import annotations

import pytest

from ringtorch.rendezvous import (
    FileParams,
    TcpParams,
    merge_rank_into_url,
    parse_env,
    parse_file,
    parse_tcp,
    query_to_dict,
    rank_from_env,
)

PREFIX = "Error initializing torch.distributed using "


@pytest.mark.parametrize("url, expected", [
    ("tcp://10.0.0.1:29500?rank=0&world_size=4", TcpParams("10.0.0.1", 29500, 0, 4)),
    ("tcp://node-7:1?world_size=2&rank=1", TcpParams("node-7", 1, 1, 2)),
    ("tcp://[::1]:29500?rank=3&world_size=4", TcpParams("::1", 29500, 3, 4)),
    ("tcp://h:0?rank=0&world_size=1&use_libuv=0", TcpParams("h", 0, 0, 1)),
])
def test_tcp_urls(url, expected):
    assert parse_tcp(url) == expected


@pytest.mark.parametrize("url, message", [
    ("tcp://h?rank=0&world_size=1", "tcp:// rendezvous: port number missing"),
    ("tcp://h:1?world_size=1", "tcp:// rendezvous: rank parameter missing"),
    ("tcp://h:1?rank=0", "tcp:// rendezvous: world size parameter missing"),
    ("tcp://h:1?rank=x&world_size=1", "tcp:// rendezvous: rank parameter 'x' is not an integer"),
    ("tcp://:1?rank=0&world_size=1", "tcp:// rendezvous: host name missing"),
    ("tcp://h:99999?rank=0&world_size=1", "tcp:// rendezvous: port number invalid (Port out of "
                                          "range 0-65535)"),
])
def test_tcp_url_errors(url, message):
    with pytest.raises(ValueError) as info:
        parse_tcp(url)
    assert str(info.value) == PREFIX + message


@pytest.mark.parametrize("url, expected", [
    ("file:///tmp/store?rank=1&world_size=2", FileParams("/tmp/store", 1, 2)),
    ("file:///a/b%20c?rank=0&world_size=1", FileParams("/a/b%20c", 0, 1)),
])
def test_file_urls(url, expected):
    assert parse_file(url) == expected


@pytest.mark.parametrize("url, message", [
    ("file://?rank=0&world_size=1", "file:// rendezvous: path missing"),
    ("file:///tmp/s?world_size=1", "file:// rendezvous: rank parameter missing"),
    ("file:///tmp/s?rank=0", "file:// rendezvous: world size parameter missing"),
])
def test_file_url_errors(url, message):
    with pytest.raises(ValueError) as info:
        parse_file(url)
    assert str(info.value) == PREFIX + message


MASTER = {"MASTER_ADDR": "m", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("url, environ, expected", [
    ("env://", {**MASTER, "RANK": "2", "WORLD_SIZE": "4"}, TcpParams("m", 29500, 2, 4)),
    ("env://?rank=1&world_size=3", {**MASTER, "RANK": "2", "WORLD_SIZE": "4"},
     TcpParams("m", 29500, 1, 3)),
    ("env://", {**MASTER, "SLURM_PROCID": "5", "SLURM_NTASKS": "8"}, TcpParams("m", 29500, 5, 8)),
    ("env://", {**MASTER, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
     TcpParams("m", 29500, 1, 2)),
    ("env://", {**MASTER, "PMI_RANK": "0", "PMI_SIZE": "6"}, TcpParams("m", 29500, 0, 6)),
    ("env://", {**MASTER, "RANK": "3", "WORLD_SIZE": "4", "SLURM_PROCID": "0",
                "SLURM_NTASKS": "1"}, TcpParams("m", 29500, 3, 4)),
    ("env://", {**MASTER, "SLURM_PROCID": "2", "SLURM_NTASKS": "4", "PMI_RANK": "0",
                "PMI_SIZE": "1"}, TcpParams("m", 29500, 2, 4)),
    ("env://", {**MASTER, "RANK": "1", "SLURM_NTASKS": "4"}, TcpParams("m", 29500, 1, 4)),
])
def test_env_urls_and_the_order_variables_are_read_in(url, environ, expected):
    assert parse_env(url, environ) == expected


@pytest.mark.parametrize("environ, message", [
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "1"},
     "environment variable MASTER_ADDR expected, but not set (the address of rank 0's host; "
     "MASTER_PORT is needed too)"),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "m"},
     "environment variable MASTER_PORT expected, but not set (a free port on MASTER_ADDR's "
     "host)"),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "m", "MASTER_PORT": "x"},
     "environment variable MASTER_PORT='x' is not an integer"),
    ({**MASTER, "WORLD_SIZE": "1"},
     "environment variable RANK expected, but not set (looked for RANK or SLURM_PROCID or "
     "OMPI_COMM_WORLD_RANK or PMI_RANK; or pass rank= to init_process_group)"),
    ({**MASTER, "RANK": "0"},
     "environment variable WORLD_SIZE expected, but not set (looked for WORLD_SIZE or "
     "SLURM_NTASKS or OMPI_COMM_WORLD_SIZE or PMI_SIZE; or pass world_size= to "
     "init_process_group)"),
    ({**MASTER, "RANK": "zero", "WORLD_SIZE": "1"},
     "environment variable RANK='zero' is not an integer"),
])
def test_env_errors_name_the_missing_variable(environ, message):
    with pytest.raises(ValueError) as info:
        parse_env("env://", environ)
    assert str(info.value) == PREFIX + "env:// rendezvous: " + message


@pytest.mark.parametrize("environ, which, expected", [
    ({"LOCAL_RANK": "1", "SLURM_LOCALID": "2"}, 2, (1, "LOCAL_RANK")),
    ({"SLURM_LOCALID": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "3"}, 2, (2, "SLURM_LOCALID")),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "3"}, 2, (3, "OMPI_COMM_WORLD_LOCAL_RANK")),
    ({}, 2, None),
    ({"RANK": ""}, 0, None),
])
def test_rank_from_env(environ, which, expected):
    assert rank_from_env(environ, which) == expected


@pytest.mark.parametrize("url, rank, world_size, environ, expected", [
    ("env://", -1, -1, {}, "env://"),
    ("tcp://h:1", 0, 2, {}, "tcp://h:1?rank=0&world_size=2"),
    ("tcp://h:1?use_libuv=0", 1, 2, {}, "tcp://h:1?use_libuv=0&rank=1&world_size=2"),
    ("tcp://h:1", 3, -1, {}, "tcp://h:1?rank=3"),
    ("tcp://h:1", -1, 5, {}, "tcp://h:1?world_size=5"),
    ("env://", -1, None, {"RANK": "1", "WORLD_SIZE": "2"}, "env://?rank=1&world_size=2"),
    ("tcp://h:1", -1, None, {"RANK": "1"}, "tcp://h:1?world_size=-1"),
    ("file:///tmp/s", 0, 2, {}, "file:///tmp/s?rank=0&world_size=2"),
    ("mine://", 0, 1, {}, "mine://?rank=0&world_size=1"),
])
def test_arguments_are_merged_into_the_query_as_torch_does(url, rank, world_size, environ,
                                                           expected):
    assert merge_rank_into_url(url, rank, world_size, environ) == expected


@pytest.mark.parametrize("query, expected", [
    ("", {}),
    ("rank=0&world_size=2", {"rank": "0", "world_size": "2"}),
    ("a=1&&b=", {"a": "1", "b": ""}),
])
def test_query_to_dict(query, expected):
    assert query_to_dict(query) == expected


def test_a_query_part_without_equals_is_named():
    with pytest.raises(ValueError, match=r"^init_method query part 'rank' is not of the form "
                                         r"name=value$"):
        query_to_dict("rank&world_size=1")
