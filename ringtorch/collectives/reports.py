"""Every message that names a collective: mismatches, timeouts, hangs, failures.

The rule this module keeps: a collective is named from its CollectiveCall (call.py), in one
set of words, whichever transport noticed the problem; transports and waits raise with these
texts and nothing else composes them. ``Words`` is what a group's backend uses (it knows how to
name a rank: "rank 1 (global rank 3)"); ``ShmWords`` is the same vocabulary handed to a
shared-memory domain (``_wire/shm_domain.py`` knows descriptors, never torch nor words).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from ringtorch.collectives.call import CollectiveCall, describe, from_descriptor, from_frame


class Words:
    """The messages of one group's backend.

    Args:
        group: the group's name.
        global_ranks: the global rank of each group rank.
    """

    def __init__(self, group: str, global_ranks: Sequence[int]) -> None:
        self.group = group
        self._global = tuple(global_ranks)
        self.hosts: Sequence[str] = ()  # each rank's address, "" on this host (PeerMesh.hosts)

    def who(self, rank: int) -> str:
        """'rank 1', or 'rank 1 (global rank 3)' in a subgroup."""
        glob = self._global[rank] if rank < len(self._global) else rank
        return f"rank {rank}" if glob == rank else f"rank {rank} (global rank {glob})"

    def what(self, call: CollectiveCall) -> str:
        """'all_reduce #3 on group "0"' (the subject of every message below)."""
        return f"{call.op} #{call.seq} on group '{self.group}'"

    def mismatched_frame(self, call: CollectiveCall, me: int, peer: int, expected: bytes,
                         got: bytes) -> str:
        """A frame from ``peer`` that is not the one ``call`` expects (raw socket headers)."""
        want, want_payload = from_frame(expected, self.group)
        have, have_payload = from_frame(got, self.group)
        sizes = "" if want_payload == have_payload else (
            f"; this frame should carry {want_payload} bytes, the peer's carries {have_payload}")
        return (f"{self.what(call)}: mismatched collectives: {self.who(me)} runs "
                f"{describe(want)} but {self.who(peer)} sent {describe(have)}{sizes}")

    def timed_out(self, call: CollectiveCall, elapsed_s: float, report: str) -> str:
        """A socket wait ran past the deadline; ``report`` says who did not arrive."""
        return f"{self.what(call)} {_timed_out(elapsed_s)}: {report}"

    def stalled(self, call: CollectiveCall, waited_s: float, report: str) -> str:
        """The stall warning, logged while a collective waits long."""
        return f"{self.what(call)} has waited {_seconds(waited_s)}: {report}"

    def failed(self, what: str, why: str) -> str:
        """An operation (``what``: a collective's ``what(call)``, or a send or receive) that
        failed for ``why``."""
        return f"{what} failed: {why}"

    def aborted(self, what: str, cause: str) -> str:
        """An operation that failed because the group is aborted."""
        return f"{what} failed: the group was aborted: {cause}"

    def closed(self, what: str) -> str:
        return f"{what}: the process group was closed"

    def interrupted(self, call: CollectiveCall, me: int, exc: BaseException) -> str:
        return (f"{self.what(call)} was interrupted on {self.who(me)} by "
                f"{type(exc).__name__}: {exc}")

    def on_host(self, rank: int) -> str:
        """' on host 10.0.0.2' for a rank on another host, '' for one on this host."""
        host = self.hosts[rank] if rank < len(self.hosts) else ""
        return f" on host {host}" if host else ""

    def peer_left(self, peer: int, me: int) -> str:
        """A reader thread saw ``peer``'s connection end without a goodbye: it is known dead."""
        return (f"{self.who(peer)}{self.on_host(peer)} closed its connection to {self.who(me)} "
                f"of group '{self.group}' without leaving the group: the process exited or was "
                f"killed")

    def peer_unreachable(self, peer: int, me: int, reason: str) -> str:
        """The network broke ``peer``'s connection (``reason``: UNREACHABLE_ERRNOS's words):
        the peer may be alive, every rank on its host is cut off from this one."""
        host = self.hosts[peer] if peer < len(self.hosts) else ""
        cut = [r for r, h in enumerate(self.hosts) if h and h == host]
        ranks = f"; ranks {cut} on that host are cut off" if len(cut) > 1 else ""
        return (f"{self.who(peer)}{self.on_host(peer)} is unreachable from {self.who(me)} of "
                f"group '{self.group}': {reason}; the network to that host failed or the host "
                f"is down (the process may still be running){ranks}")

    def peer_lost(self, peer: int, me: int, said_bye: bool, exc: BaseException,
                  unreachable: str = "") -> str:
        """The cause when this rank's own wait found ``peer``'s connection gone
        (``unreachable``: the network broke it, in words; "" when the peer closed it)."""
        if unreachable:
            return self.peer_unreachable(peer, me, unreachable)
        if said_bye:
            return f"{self.who(peer)} closed its process group during this collective"
        return (f"{self.who(peer)}{self.on_host(peer)} closed its connection: the process exited "
                f"or was killed ({exc})")

    def missing(self, seq: int, statuses: dict[int, dict[str, Any]], peers: list[int],
                waiting_on: list[int]) -> str:
        """Which ranks have not arrived at collective ``seq``, and where each of them is."""
        return missing_report(seq, statuses, peers, waiting_on, self.who)


def missing_report(seq: int, statuses: dict[int, dict[str, Any]], peers: list[int],
                   waiting_on: list[int], who: Callable[[int], str]) -> str:
    """Which ranks have not arrived at collective ``seq``, and where each of them is
    (``statuses``: the status records peers answered, call.status_record)."""
    missing, where = [], []
    for peer in peers:
        status = statuses.get(peer)
        if status is None:
            missing.append(peer)
            where.append(f"{who(peer)} did not answer")
        elif status["op"] is None or status["seq"] < seq:
            missing.append(peer)
            at = "no collective yet" if status["op"] is None else \
                f"{status['op']} #{status['seq']} ({status['state']})"
            where.append(f"{who(peer)} is at {at}")
    if not missing:
        waiting = ", ".join(who(p) for p in waiting_on)
        return f"every rank arrived; this rank was waiting for data from {waiting}"
    return f"ranks {missing} did not arrive ({'; '.join(where)})"


def disagreement(call: CollectiveCall, calls: list[CollectiveCall]) -> str:
    """The MPI backend's agreement check failed: ``calls`` are every rank's records
    (call.from_agreement); only the fields that were compared are named."""
    lines = []
    for rank, theirs in enumerate(calls):
        parts = []
        if theirs.redop is not None:
            parts.append(theirs.redop.name)
        code = theirs.detail & 0xFF
        if code != 0xFF:
            parts.append(str(theirs.dtype) if theirs.dtype is not None else "another dtype")
        if theirs.nbytes >= 0:
            parts.append(f"{theirs.nbytes} bytes")
        if theirs.root >= 0:
            parts.append(f"root {theirs.root}")
        lines.append(f"rank {rank} called {theirs.op} #{theirs.seq} ({', '.join(parts)})")
    return (f"{call.op} #{call.seq} on group '{call.group}': the ranks called different "
            f"collectives or disagree on their arguments: " + "; ".join(lines))


def fingerprint_mismatch(rank: int, mine: dict[str, Any], other: int,
                         theirs: dict[str, Any]) -> str:
    """The DETAIL check's mismatch, in torch's ProcessGroupWrapper words (fingerprints:
    ``{"seq", "op", "shapes", "dtypes"}``)."""
    differ = [f"{label}: {mine[key]} vs {theirs[key]}"
              for key, label in (("seq", "sequence number"), ("op", "op type"),
                                 ("shapes", "tensor shapes"), ("dtypes", "tensor dtypes"))
              if mine[key] != theirs[key]]
    return (f"Detected mismatch between collectives on ranks. Rank {rank} is running "
            f"collective: {_fingerprint(mine)}, but Rank {other} is running collective: "
            f"{_fingerprint(theirs)}. Collectives differ in the following aspects: "
            + "; ".join(differ))


def fingerprint_missing(call: CollectiveCall, missing: list[int], waited_s: float,
                        exc: BaseException) -> str:
    """The DETAIL check gave up waiting for the ranks ``missing`` at ``call``."""
    return (f"{call.op} #{call.seq} on group '{call.group}': ranks {missing} did not reach "
            f"this collective within {timedelta(seconds=round(waited_s))} (collective "
            f"fingerprint check, RINGTORCH_DEBUG=DETAIL): {exc}")


def _fingerprint(entry: dict[str, Any]) -> str:
    shapes = ", ".join(str(list(s)) for s in entry["shapes"])
    dtypes = ", ".join(entry["dtypes"])
    return (f"CollectiveFingerPrint(SequenceNumber={entry['seq']}, OpType={entry['op']}, "
            f"TensorShape=[{shapes}], TensorDtypes=[{dtypes}])")


def _timed_out(waited_s: float) -> str:
    """'timed out after 0:00:30 (Timed out waiting 30000ms: the collective's timeout)': our
    words, then the phrase torch's gloo uses, which users' and tools' checks look for."""
    return (f"timed out after {timedelta(seconds=round(waited_s))} (Timed out waiting "
            f"{round(waited_s * 1000)}ms: the collective's timeout)")


def _seconds(waited_s: float) -> str:
    return f"{waited_s:.0f} s" if waited_s >= 10 else f"{waited_s:.1f} s"


class ShmWords:
    """The messages of a shared-memory domain (the ``ShmReports`` of _wire/shm_domain.py):
    descriptors are decoded into calls and named like the socket path names them. Ranks are
    named as the caller gives them (group ranks)."""

    def __init__(self, group: str) -> None:
        self.group = group

    def _call(self, desc: Any) -> CollectiveCall:
        if isinstance(desc, CollectiveCall):
            return desc
        return from_descriptor(desc.seq, desc.kind, desc.detail, desc.nbytes, self.group)

    def what(self, desc: Any, me: int) -> str:
        return f"{describe(self._call(desc))} on group '{self.group}' (rank {me})"

    def mismatch(self, mine: Any, me: int, peer: int, theirs: Any) -> str:
        return (f"collective mismatch on group '{self.group}': rank {me} called "
                f"{describe(self._call(mine))} but rank {peer} called "
                f"{describe(self._call(theirs))}")

    def where(self, peer: int, theirs: Any) -> str:
        at = "no collective yet" if theirs.seq < 0 else describe(self._call(theirs))
        return f"rank {peer} is at {at}"

    def timed_out(self, desc: Any, me: int, waited_s: float, late: list[int],
                  where: list[str]) -> str:
        return (f"{self.what(desc, me)} {_timed_out(waited_s)}: "
                f"ranks {late} did not arrive ({'; '.join(where)})")

    def stalled(self, desc: Any, me: int, waited_s: float, late: list[int],
                where: list[str]) -> str:
        return (f"{self.what(desc, me)} has waited {_seconds(waited_s)}: ranks {late} have not "
                f"arrived ({'; '.join(where)})")

    def peer_aborted(self, desc: Any, me: int, peer: int, reason: str) -> str:
        return f"{self.what(desc, me)} failed: rank {peer} aborted the group: {reason}"

    def peer_died(self, desc: Any, me: int, peer: int, pid: int) -> str:
        return (f"{self.what(desc, me)} failed: rank {peer} (pid {pid}) died or left the group "
                f"(its process no longer holds its shared-memory segment)")

    def failed(self, desc: Any, me: int, cause: str) -> str:
        return f"{self.what(desc, me)} failed: {cause}"


__all__ = ["ShmWords", "Words", "disagreement", "fingerprint_mismatch", "fingerprint_missing",
           "missing_report"]
