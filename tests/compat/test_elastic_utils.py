"""``elastic.utils`` helpers that launch scripts import behave as torch's."""

from __future__ import annotations

import logging

import pytest
import torch.distributed.elastic.utils as torch_utils
import torch.distributed.elastic.utils.distributed as torch_distributed
import torch.distributed.elastic.utils.logging as torch_logging

import ringtorch.distributed.elastic.utils as ring_utils
import ringtorch.distributed.elastic.utils.distributed as ring_distributed
import ringtorch.distributed.elastic.utils.logging as ring_logging


def test_get_logger_names_the_calling_module_and_reads_loglevel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGLEVEL", "DEBUG")
    ours, theirs = ring_logging.get_logger(), torch_logging.get_logger()
    assert ours is theirs and ours.name == __name__
    assert ours.level == logging.DEBUG
    assert ring_logging.get_logger("named").name == "named"


def test_macros_and_environment_lookup_as_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--rank=${local_rank}", 3, "${other}"]
    assert ring_utils.macros.substitute(args, "1") == torch_utils.macros.substitute(args, "1")
    monkeypatch.delenv("RINGTORCH_TEST_ABSENT", raising=False)
    for utils in (ring_utils, torch_utils):
        with pytest.raises(ValueError, match=r"^Environment variable RINGTORCH_TEST_ABSENT "
                                             r"expected, but not set$"):
            utils.get_env_variable_or_raise("RINGTORCH_TEST_ABSENT")


def test_free_port_socket_holds_a_listening_loopback_port() -> None:
    with ring_utils.get_socket_with_port() as sock:
        host, port = sock.getsockname()[:2]
        assert host in ("127.0.0.1", "::1") and port > 0
    assert ring_distributed.get_free_port() > 0


def test_create_c10d_store_serves_a_one_member_store() -> None:
    store = ring_distributed.create_c10d_store(True, "127.0.0.1", world_size=1, timeout=30)
    store.set("k", b"v")
    assert store.get("k") == b"v"


def test_create_c10d_store_needs_a_port_for_several_members_as_torch() -> None:
    message = (r"^server_port must be specified when world_size > 1, got server_port=-1, "
               r"world_size=2$")
    for module in (ring_distributed, torch_distributed):
        with pytest.raises(ValueError, match=message):
            module.create_c10d_store(True, "127.0.0.1", world_size=2)
