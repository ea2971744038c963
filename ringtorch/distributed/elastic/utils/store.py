"""``torch.distributed.elastic.utils.store``: barriers and all-gathers over a store.

Agents (or any processes sharing a store) use them to meet and to swap small blobs. Keys are
never deleted, so a ``key_prefix`` serves one barrier or one exchange, as in torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from ringtorch._errors import DistStoreError

_NUM_MEMBERS = "/num_members"
_LAST_MEMBER_CHECKIN = "/last_member"
_TRACE = "/TRACE"
_TRACING_GATE = "/TRACING_GATE"
_MAX_TRACE_MISSING_RANKS = 16


@contextmanager
def store_timeout(store: Any, timeout: float) -> Iterator[None]:
    """Run the block with the store's timeout set to ``timeout`` seconds, then restore it."""
    old = store.timeout
    store.set_timeout(timedelta(seconds=timeout))
    try:
        yield
    finally:
        store.set_timeout(old)


def _arrive(store: Any, world_size: int, key_prefix: str) -> str:
    """Count this member in; the last one sets the key everybody waits for (returned)."""
    last_member_key = key_prefix + _LAST_MEMBER_CHECKIN
    if store.add(key_prefix + _NUM_MEMBERS, 1) == world_size:
        store.set(last_member_key, "<val_ignored>")
    return last_member_key


def get_all(store: Any, rank: int, prefix: str, world_size: int) -> list[bytes]:
    """The values of ``{prefix}0`` .. ``{prefix}{world_size-1}``; rank 0 returns only after
    every member has read them (so it may tear the store down afterwards)."""
    values = store.multi_get([f"{prefix}{i}" for i in range(world_size)])
    done_key = _arrive(store, world_size, f"{prefix}/finished")
    if rank == 0:
        store.wait([done_key])
    return list(values)


def synchronize(store: Any, data: bytes, rank: int, world_size: int, key_prefix: str,
                timeout: float = 300) -> list[bytes]:
    """Every member publishes ``data`` and gets every member's, ordered by rank."""
    with store_timeout(store, timeout):
        store.set(f"{key_prefix}{rank}", data)
        return get_all(store, rank, key_prefix, world_size)


def _missing_ranks(store: Any, world_size: int, key_prefix: str, rank: int,
                   decode: Callable[[int], str], trace_timeout: float) -> set[str] | None:
    """After a timed-out barrier: rank 0 names the members that did not check in; the others
    point at rank 0 (None when rank 0 is not there to say)."""
    store.set(f"{key_prefix}{rank}{_TRACE}", "<val_ignored>")
    if rank != 0:
        try:
            store.wait([f"{key_prefix}{_TRACING_GATE}"])
            return {f"[<check rank 0 ({decode(0)}) for missing rank info>]"}
        except DistStoreError:
            return None
    missing: set[str] = set()
    for peer in range(1, world_size):
        if len(missing) >= _MAX_TRACE_MISSING_RANKS:
            break
        wait = timedelta(seconds=trace_timeout) if not missing else timedelta(milliseconds=1)
        try:
            store.wait([f"{key_prefix}{peer}{_TRACE}"], wait)
        except DistStoreError:
            missing.add(decode(peer))
    store.set(f"{key_prefix}{_TRACING_GATE}", "<val_ignored>")
    return missing


def barrier(store: Any, world_size: int, key_prefix: str, barrier_timeout: float = 300,
            rank: int | None = None, rank_tracing_decoder: Callable[[int], str] | None = None,
            trace_timeout: float = 10) -> None:
    """Block until ``world_size`` members have called it with the same ``key_prefix``.

    Raises:
        DistStoreError: the barrier timed out; with ``rank`` given, the message names the
            missing ranks (through ``rank_tracing_decoder`` when given).
    """
    if rank is None and rank_tracing_decoder is not None:
        raise AssertionError("Tracing requires rank information")
    with store_timeout(store, barrier_timeout):
        last_member_key = _arrive(store, world_size, key_prefix)
        try:
            store.wait([last_member_key])
        except DistStoreError:
            if rank is None:
                raise
            missing = _missing_ranks(store, world_size, key_prefix, rank,
                                     rank_tracing_decoder or str, trace_timeout)
            if missing is None:
                raise
            raise DistStoreError(
                f"Timed out waiting on barrier on rank {rank}, for key prefix: {key_prefix} "
                f"(world_size={world_size}, missing_ranks=[{', '.join(sorted(missing))}], "
                f"timeout={barrier_timeout})") from None


__all__ = ["barrier", "get_all", "store_timeout", "synchronize"]
