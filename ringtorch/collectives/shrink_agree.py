"""How the survivors of a group agree, through the store, on who is gone, and make the new group.

The store is the one arbiter: every decision is a ``compare_set`` on an empty key, so the first
rank to decide writes it and every other rank, early or late, reads that same decision. One
attempt has three steps:

1. *Census.* Each survivor posts the ranks it excludes (``<attempt>/in/<rank>``). A rank waits
   until every member is either posted, excluded by some post, or known dead (its process is
   gone: ``liveness.probe``); a member that is none of these by the end of the wait
   (``RINGTORCH_SHRINK_WAIT_S``; a rank frozen by SIGSTOP, or on another host and silent) is
   left out. The first rank to finish writes the survivors: the posted ranks nobody excluded.
2. *Build.* The survivors named make the new group (bounded by the same wait) and post
   whether they could (``<attempt>/built/<rank>``).
3. *Verdict.* When every survivor has posted, the first to see it writes the verdict: "go" if
   every one built the group. A survivor that died or stayed silent, or a build that failed
   (a member died while the group was made), makes it a retry: every rank drops the group it
   built and starts the next attempt without the dead or silent ones.

The rule kept: a rank keeps the new group only if the arbiter's decision and verdict both name
it. A rank left out (it was slow, or was excluded) that reaches the agreement later reads a
decision without it and raises ``ShrinkRefusedError``; it never rejoins silently.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ringtorch._errors import DistError, DistStoreError

log = logging.getLogger(__name__)
T = TypeVar("T")

_POLL_S = 0.002  # a store round trip on one host is ~0.1 ms: polling costs little, wakes fast


class ShrinkRefusedError(DistError):
    """This rank was left out of a shrunk group by its survivors and may not rejoin it."""


@dataclass(frozen=True)
class Agreement(Generic[T]):
    """The outcome of the agreement: what the build made, the surviving group ranks (sorted)
    and the attempt that settled it (0 unless a survivor died during the shrink)."""

    built: T
    survivors: tuple[int, ...]
    attempt: int


def census_outcome(size: int, excluded: set[int], posted: dict[int, list[int]],
                   dead: set[int], wait_over: bool) -> list[int] | None:
    """The survivors once the census can be closed, else None (keep waiting).

    Args:
        size: the group's size; members are 0 .. size - 1.
        excluded: the ranks this rank excludes.
        posted: each posted rank's exclusions.
        dead: members whose process is known to be gone.
        wait_over: whether the census wait has run out (silent members are then left out).
    """
    out = set(excluded).union(*posted.values())
    waiting = [r for r in range(size) if r not in out and r not in posted and r not in dead]
    if waiting and not wait_over:
        return None
    return sorted(r for r in posted if r not in out)


def agree(store: Any, rank: int, size: int, excluded: set[int],
          probe: Callable[[int], bool | None], wait_s: float, group_name: str,
          build: Callable[[list[int], int], T], drop: Callable[[T], None]) -> Agreement[T]:
    """Run the agreement as group rank ``rank`` of ``size`` (see the module docstring).

    ``build(survivors, attempt)`` makes the new group (raising if it cannot); ``drop`` undoes
    a build that the verdict turned down.

    Raises:
        ShrinkRefusedError: the survivors decided without this rank.
    """
    return _agree(store, rank, size, set(excluded), probe, wait_s, group_name, build, drop)


def store_lost(store: Any, group_name: str, exc: BaseException) -> DistStoreError | None:
    """The error to raise when ``exc`` stopped a shrink because the store is gone (None: it
    is not)."""
    try:
        store.check(["rt_shrink_probe"])
    except Exception:
        return DistStoreError(
            f"shrinking group '{group_name}' failed: the store cannot be reached ({exc}); the "
            f"survivors agree through the store, so a job whose store died with a rank cannot "
            f"shrink (run the store in its own process, python -m ringtorch.store, with "
            f"TORCHELASTIC_USE_AGENT_STORE=True; see docs/recovery.md)")
    return None


def _agree(store: Any, rank: int, size: int, excluded: set[int],
           probe: Callable[[int], bool | None], wait_s: float, group_name: str,
           build: Callable[[list[int], int], T], drop: Callable[[T], None]) -> Agreement[T]:
    attempt = 0
    while True:
        prefix = f"{attempt}/"
        store.set(f"{prefix}in/{rank}", json.dumps(sorted(excluded)))
        survivors = _census(store, prefix, size, excluded, probe, wait_s)
        if rank not in survivors:
            raise ShrinkRefusedError(_refusal(rank, group_name, survivors, wait_s))
        made: Any = None
        try:
            # a survivor already gone would only be found at the end of the build's wait
            if not any(probe(r) is False for r in survivors if r != rank):
                made = build(survivors, attempt)
        except Exception:  # a member died or vanished while the group was made: retried below
            log.warning("making the shrunk group of %s failed (attempt %d)", survivors, attempt,
                        exc_info=True)
        store.set(f"{prefix}built/{rank}", "ok" if made is not None else "failed")
        missing, failed = verdict(store, prefix, survivors, probe, wait_s)
        if not missing and not failed:
            return Agreement(made, tuple(survivors), attempt)
        if made is not None:
            drop(made)
        if rank in missing:
            raise ShrinkRefusedError(_refusal(rank, group_name,
                                              [r for r in survivors if r not in missing], wait_s))
        excluded |= set(missing) | (set(range(size)) - set(survivors))
        attempt += 1


def _census(store: Any, prefix: str, size: int, excluded: set[int],
            probe: Callable[[int], bool | None], wait_s: float) -> list[int]:
    decision_key = f"{prefix}decision"
    end = time.monotonic() + wait_s
    dead: set[int] = set()
    while not store.check([decision_key]):
        posted = {r: json.loads(store.get(f"{prefix}in/{r}")) for r in range(size)
                  if store.check([f"{prefix}in/{r}"])}
        dead |= {r for r in range(size) if r not in posted and r not in dead
                 and probe(r) is False}
        outcome = census_outcome(size, excluded, posted, dead, time.monotonic() >= end)
        if outcome is not None:
            store.compare_set(decision_key, "", json.dumps(outcome))
            break
        time.sleep(_POLL_S)
    return list(json.loads(store.get(decision_key)))


def verdict(store: Any, prefix: str, survivors: list[int],
            probe: Callable[[int], bool | None], wait_s: float) -> tuple[list[int], bool]:
    """Wait (at most ``wait_s``) for the verdict on one attempt to build a group among
    ``survivors`` under ``prefix``, writing it first when this rank sees every build posted or
    the rest dead: (the survivors that died or stayed silent, whether some build failed).
    Grow-back's build check (distributed/_grow_join.py) uses the same round."""
    verdict_key = f"{prefix}verdict"
    end = time.monotonic() + wait_s
    while not store.check([verdict_key]):
        posted = {r: store.get(f"{prefix}built/{r}") for r in survivors
                  if store.check([f"{prefix}built/{r}"])}
        missing = [r for r in survivors if r not in posted]
        # close once every survivor posted or is known dead (a slow one is waited for)
        if time.monotonic() >= end or all(probe(r) is False for r in missing):
            failed = any(v != b"ok" for v in posted.values())
            store.compare_set(verdict_key, "", json.dumps([missing, failed]))
            break
        time.sleep(_POLL_S)
    missing, failed = json.loads(store.get(verdict_key))
    return list(missing), bool(failed)


def _refusal(rank: int, group_name: str, survivors: list[int], wait_s: float) -> str:
    return (f"rank {rank} was left out of the shrunk group '{group_name}': its survivors (ranks "
            f"{survivors} of the group) agreed without it, taking it for dead (it was excluded, "
            f"or did not answer within {wait_s:g} s, e.g. while stopped); it cannot rejoin the "
            f"job's groups and should exit")


__all__ = ["Agreement", "ShrinkRefusedError", "agree", "census_outcome", "store_lost", "verdict"]
