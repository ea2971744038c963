"""Setting up a group's shared memory through its store: who creates, who maps, who decides.

Every rank creates its own segment, publishes it with its host identity, its cap and its
settings under ``rt_shm/seg/<rank>``, maps every peer's, says so under ``rt_shm/mapped/<rank>``
and then unlinks its segment's name: from that moment no file is left to leak (shm.py). The
group uses shared memory only if every record allows it, so every rank decides alike; any
failure before the end closes and unlinks this rank's segment before it raises.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from ringtorch._errors import DistBackendError
from ringtorch._wire.shm import PAGE, Segment, shm_supported, sweep_stale_segments
from ringtorch._wire.shm_domain import (
    DATA_OFFSET,
    INITIAL_HALF,
    MAGIC,
    VERSION,
    W_HALF,
    W_MAGIC,
    W_PID,
    W_VERSION,
    ShmDomain,
    ShmReports,
)


def open_domain(store: Any, rank: int, size: int, group: str, host: str, enabled: bool,
                max_bytes: int, deadline: float, reports: ShmReports,
                settings: dict[str, int] | None = None, prefix: str = "rt_shm",
                names: Sequence[int] | None = None) -> tuple[ShmDomain | None, str]:
    """Set up shared memory for the group through its store, or decide not to.

    Every rank publishes its host, its segment, its cap and its ``settings``; the group
    uses shared memory only if every rank is on one host, has it enabled and created its
    segment (so all ranks decide alike). Each rank unlinks its segment's name once every
    rank mapped it. The cap in force is the smallest; the settings are rank 0's (plans
    computed from them must agree everywhere), in ``domain.settings``. ``reports`` words
    the domain's failures; ``names`` is how messages name each member (default: its rank).

    Returns:
        (domain, "") or (None, the reason shared memory is not used).

    Raises:
        DistBackendError: a rank did not publish its records before ``deadline``.
    """
    own, why = _create_own(rank, enabled)
    record = {"host": host, "pid": os.getpid(), "name": own.name if own else None,
              "why": why, "max_bytes": max_bytes, "settings": settings or {},
              "cpus": sorted(os.sched_getaffinity(0))}
    segments: list[Segment] | None = None
    try:
        store.set(f"{prefix}/seg/{rank}", json.dumps(record))
        records = [json.loads(v) for v in read_keys(
            store, [f"{prefix}/seg/{r}" for r in range(size)], deadline)]
        why = _group_reason(records)
        segments = None if why else _attach_all(records, rank, own)
        store.set(f"{prefix}/mapped/{rank}",
                  "ok" if segments or why else f"rank {rank} could not map the segments")
        verdicts = [v.decode() for v in read_keys(
            store, [f"{prefix}/mapped/{r}" for r in range(size)], deadline)]
        why = why or next((v for v in verdicts if v != "ok"), "")
    except BaseException:
        for seg in segments or ([own] if own else []):
            seg.close()
        raise
    finally:
        if own is not None:
            own.unlink()  # every rank has mapped it (or given up): nothing can leak now
    if why or not segments:
        for seg in segments or ([own] if own else []):
            seg.close()
        return None, why
    ceiling = (min(r["max_bytes"] for r in records) - DATA_OFFSET) // 2 // PAGE * PAGE
    domain = ShmDomain(rank, size, segments, ceiling, reports, group, names)
    domain.settings = dict(records[0]["settings"])
    if pinned_apart(records):
        domain.spin_long()
    domain.spread_out = spread_out(records)
    return domain, ""


def spread_out(records: list[dict[str, Any]]) -> bool:
    """Whether the ranks together may run on at least as many CPUs as there are ranks (so
    each can have one; world 3 on 2 cores cannot)."""
    cpus: set[int] = set()
    for rec in records:
        cpus.update(rec.get("cpus") or [])
    return len(cpus) >= len(records)


def pinned_apart(records: list[dict[str, Any]]) -> bool:
    """Whether every rank may run on one CPU only, each on a different one (as mpirun and
    the benchmarks bind ranks): then no rank ever waits for a peer that needs its CPU."""
    cpus = [rec.get("cpus") or [] for rec in records]
    return all(len(c) == 1 for c in cpus) and len({c[0] for c in cpus}) == len(cpus)


def _create_own(rank: int, enabled: bool) -> tuple[Segment | None, str]:
    """This rank's segment, header written, or None and why not."""
    why = "" if enabled else "disabled (RINGTORCH_SHM=0)"
    why = why or shm_supported()
    if why:
        return None, why
    try:
        sweep_stale_segments()
        own = Segment.create(DATA_OFFSET + 2 * INITIAL_HALF)
    except OSError as exc:
        return None, f"rank {rank} could not create a shared-memory segment: {exc}"
    _init_header(own)
    return own, ""


def _init_header(seg: Segment) -> None:
    w = seg.buf.cast("Q")
    w[W_MAGIC], w[W_VERSION], w[W_PID], w[W_HALF] = MAGIC, VERSION, os.getpid(), INITIAL_HALF
    w.release()


def _group_reason(records: list[dict[str, Any]]) -> str:
    """Why this group cannot use shared memory, decided alike on every rank ("" if it can)."""
    for r, rec in enumerate(records):
        if rec["why"]:
            return f"rank {r}: {rec['why']}"
    hosts = sorted({rec["host"] for rec in records})
    if len(hosts) > 1:
        return f"the group spans {len(hosts)} hosts"
    return ""


def _attach_all(records: list[dict[str, Any]], rank: int, own: Segment | None) -> list[Segment] | None:
    segments: list[Segment] = []
    try:
        for r, rec in enumerate(records):
            seg = own if r == rank else Segment.attach(rec["name"])
            w = seg.buf.cast("Q")  # type: ignore[union-attr]
            ok = w[W_MAGIC] == MAGIC and w[W_VERSION] == VERSION
            w.release()
            if not ok:
                raise OSError(f"segment {rec['name']} of rank {r} has a foreign header")
            segments.append(seg)  # type: ignore[arg-type]
    except (OSError, ValueError):
        for seg in segments:
            if seg is not own:
                seg.close()
        return None
    return segments


def read_keys(store: Any, keys: list[str], deadline: float,
              what: str = "setting up shared memory") -> list[bytes]:
    """The values of ``keys`` once all exist, read in one round trip.

    Raises:
        DistBackendError: some key did not appear before ``deadline`` ("<what> failed: ...",
            naming the missing keys).
    """
    remaining = max(0.001, deadline - time.monotonic())
    try:
        store.wait(keys, timedelta(seconds=remaining))
    except Exception as exc:  # every store names its timeout error differently
        missing = []
        with contextlib.suppress(Exception):
            missing = [k for k in keys if not store.check([k])]
        raise DistBackendError(
            f"{what} failed: store keys {missing or keys} did not appear within "
            f"{remaining:.1f} s ({exc})") from exc
    # one round trip for all values: the ranks that already have theirs may leave setup at
    # once, and the one hosting the store server may even exit (seed 003's programs do)
    try:
        return list(store.multi_get(keys))
    except NotImplementedError:  # a user's store that only implements get
        return [store.get(k) for k in keys]


__all__ = ["open_domain"]
