"""Every environment knob ringtorch reads, typed and defaulted, in one place.

Only this module reads ``os.environ`` for ringtorch's own settings (torch's variables such as
``MASTER_ADDR`` are read where torch reads them: the rendezvous handlers and the launcher).
A knob is read each time it is used, so a test can change it with :func:`override` and a
launcher can set it for its children. ``docs/env-vars.md`` lists every knob; a test checks
that the list and this module agree.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_overrides: dict[str, Any] = {}


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false, yes/no, on/off), got {text!r}")


@dataclass(frozen=True)
class Knob(Generic[T]):
    """One environment variable: its name, default, parser and what it is for."""

    name: str
    default: T
    parse: Callable[[str], T]
    doc: str

    def get(self) -> T:
        """The overridden value, else the parsed environment value, else the default.

        Raises:
            ValueError: the variable is set to something the parser rejects; the message
                names the variable.
        """
        if self.name in _overrides:
            return _overrides[self.name]
        text = os.environ.get(self.name)
        if text is None:
            return self.default
        try:
            return self.parse(text)
        except ValueError as exc:
            raise ValueError(f"environment variable {self.name}={text!r} is invalid: {exc}") from exc


KNOBS: dict[str, Knob[Any]] = {}


def _knob(name: str, default: T, parse: Callable[[str], T], doc: str) -> Knob[T]:
    knob = Knob(name, default, parse, doc)
    KNOBS[name] = knob
    return knob


SECRET = _knob(
    "RINGTORCH_SECRET", "", str,
    "the job secret; every store, collective and RPC connection proves it with HMAC-SHA256 "
    "before any other byte is read. The single-node launcher sets a fresh random one per job; "
    "a process without it uses the per-user secret file (RINGTORCH_SECRET_FILE)",
)
SECRET_FILE = _knob(
    "RINGTORCH_SECRET_FILE", "~/.config/ringtorch/secret", str,
    "the per-user secret file: the job secret of every process that has no RINGTORCH_SECRET "
    "(launchers of a multi-node job, ranks started by hand, store servers); created with mode "
    "0600 on first use and refused if other users can read it. Nodes sharing a home directory "
    "share it; copy it to nodes that do not. Empty: no file (no secret unless RINGTORCH_SECRET)",
)
ALLOW_NO_SECRET = _knob(
    "RINGTORCH_ALLOW_NO_SECRET", False, _parse_bool,
    "1 lets a multi-node ringrun job start without any job secret (neither RINGTORCH_SECRET nor "
    "a usable secret file; unauthenticated, with a loud warning); by default the launcher "
    "refuses, since its nodes cannot agree on a secret over a channel the secret does not "
    "protect yet",
)
HANDSHAKE_TIMEOUT = _knob(
    "RINGTORCH_HANDSHAKE_TIMEOUT", 10.0, float,
    "seconds a peer has to complete the connection handshake before it is dropped",
)
CONNECT_TIMEOUT = _knob(
    "RINGTORCH_CONNECT_TIMEOUT", 300.0, float,
    "default seconds a client keeps retrying to reach a server that is not listening yet",
)
TCP_USER_TIMEOUT_MS = _knob(
    "RINGTORCH_TCP_USER_TIMEOUT_MS", 10_000, int,
    "TCP_USER_TIMEOUT and keepalive horizon of every TCP socket (mesh, RPC, store): "
    "unacknowledged data, or keepalive probes unanswered, for this long break the connection, "
    "so a network partition fails every rank with a DistNetworkError within about this time "
    "(keepalive probes every third of it)",
)
DEBUG = _knob(
    "RINGTORCH_DEBUG", "OFF", lambda s: s.strip().upper(),
    "OFF, INFO or DETAIL; DETAIL checks a fingerprint of every collective across ranks "
    "(like TORCH_DISTRIBUTED_DEBUG=DETAIL)",
)
HOST_ID = _knob(
    "RINGTORCH_HOST_ID", "", str,
    "overrides the host identity (hostname + boot id) used to decide which ranks share a host",
)
SHM = _knob(
    "RINGTORCH_SHM", True, _parse_bool,
    "0 turns the shared-memory fast path off: ranks on one host use sockets like any other",
)
SHM_MAX_BYTES = _knob(
    "RINGTORCH_SHM_MAX_BYTES", 64 * 1024 * 1024, int,
    "the largest shared-memory segment one rank of a same-host group grows to (bytes; segments "
    "start at 132 KiB and grow on demand); the group uses the smallest value any rank sets. "
    "Larger collectives still work, in more rounds",
)
SHM_CHUNK_BYTES = _knob(
    "RINGTORCH_SHM_CHUNK_BYTES", 1024 * 1024, int,
    "bytes a large shared-memory collective moves per round (about the L2 cache works best; a "
    "staged all_reduce among ranks that share CPUs moves 4 times this, in fewer rounds); the "
    "group uses rank 0's value",
)
SHM_ONESHOT_BYTES = _knob(
    "RINGTORCH_SHM_ONESHOT_BYTES", 2 * 1024 * 1024, int,
    "a shared-memory all_reduce takes one round in which every rank reduces every buffer "
    "while what each rank reads from its peers ((ranks - 1) x message bytes) is at most this; "
    "larger ones are reduced slice by slice; the group uses rank 0's value",
)

MPI_CHECK = _knob(
    "RINGTORCH_MPI_CHECK", True, _parse_bool,
    "the MPI backend compares each collective's (sequence number, op, dtype, bytes, root) across "
    "ranks before running it, so mismatched collectives raise instead of hanging or computing "
    "garbage; 0 skips that (one small MPI_Allgather per collective)",
)

TRANSPORT = _knob(
    "RINGTORCH_TRANSPORT", "auto", lambda s: s.strip().lower(),
    "socket transport between the ranks of a group: auto (Unix sockets between ranks of one "
    "host, TCP otherwise), tcp (TCP everywhere, e.g. to measure it) or unix",
)
ALGORITHMS = _knob(
    "RINGTORCH_ALGORITHMS", "", str,
    "force collective algorithms, e.g. 'all_reduce=ring,broadcast=chain' (for tests and "
    "benchmarks; the default picks by message and group size)",
)
STALL_WARNING_S = _knob(
    "RINGTORCH_STALL_WARNING_S", 60.0, float,
    "a collective waiting this long logs a warning naming the ranks that have not arrived and "
    "where they are (sockets and shared memory alike), then again at twice the wait each time "
    "until the timeout",
)
SOCKET_ADDR = _knob(
    "RINGTORCH_SOCKET_ADDR", "", str,
    "the address this host's ranks listen on for collective connections when the group spans "
    "hosts (default: the address the host name resolves to)",
)

FLIGHT_RECORDER = _knob(
    "RINGTORCH_FLIGHT_RECORDER", 2000, int,
    "how many of its last operations (collectives, point-to-point, RPC calls) each process's "
    "flight recorder keeps, with their call sites, timestamps and outcome; 0 turns it off",
)
OBSERVE_DIR = _knob(
    "RINGTORCH_OBSERVE_DIR", "", str,
    "set by ringrun for its workers: the folder where each rank writes what the launcher "
    "merges (flight records, stacks, trace events, statistics); empty: the rank keeps them",
)
HANG_REPORT = _knob(
    "RINGTORCH_HANG_REPORT", True, _parse_bool,
    "each rank answers hang-report requests (a collective timing out or mismatching, ringrun "
    "on SIGUSR1/SIGINT/SIGTERM, python -m ringtorch.distributed.debug) with its flight record "
    "and stacks; 0 turns that off (no responder thread, no SIGUSR1 handler)",
)
HANG_REPORT_WAIT_S = _knob(
    "RINGTORCH_HANG_REPORT_WAIT_S", 3.0, float,
    "how long whoever makes a hang report waits for the ranks' answers before reporting the "
    "silent ones as such (and asking those on its host for their stacks by SIGUSR1, up to 1 s "
    "more); a collective still waiting this long plus 1 s before its timeout (at most half the "
    "timeout) begins its report then, so that the timeout raises on time with the report made",
)
TRACE = _knob(
    "RINGTORCH_TRACE", "", str,
    "a folder: every rank writes its timeline (Chrome trace events of its collectives, "
    "point-to-point operations, RPC requests and DDP buckets) and the ranks' files are merged "
    "into FOLDER/trace.json (docs/timeline.md); ringrun --trace sets it. Empty: no timeline",
)
TRACE_MAX_EVENTS = _knob(
    "RINGTORCH_TRACE_MAX_EVENTS", 200_000, int,
    "most operations and spans one rank's timeline keeps in memory (about 700 bytes each); "
    "later ones are counted and dropped (the trace file says how many and from when), so the "
    "beginning is kept",
)
TRACE_MERGE_WAIT_S = _knob(
    "RINGTORCH_TRACE_MERGE_WAIT_S", 10.0, float,
    "without a launcher, how long rank 0 waits at the end for the other ranks' trace files "
    "before merging what is there (the missing ranks are named)",
)
SPIN_US = _knob(
    "RINGTORCH_SPIN_US", 50, int,
    "microseconds a collective receive polls its socket before blocking (a blocking wake-up "
    "costs 25-60 us on virtual machines); 0 blocks at once. Ignored when ranks outnumber cores",
)

STORE_MAX_VALUE_BYTES = _knob(
    "RINGTORCH_STORE_MAX_VALUE_BYTES", 64 * 1024 * 1024, int,
    "largest value (bytes) a TCPStore accepts in one set; a larger one is refused with a "
    "ValueError naming the key, and the server drops a request announcing more",
)
STORE_MAX_BUFFERED_BYTES = _knob(
    "RINGTORCH_STORE_MAX_BUFFERED_BYTES", 256 * 1024 * 1024, int,
    "most bytes of partial request frames a TCPStore server holds, all connections together; "
    "past it, the connection whose partial request made progress least recently is closed "
    "(logged), so slow or hostile clients cannot grow the server without bound",
)

STORE_MAX_CONNECTIONS = _knob(
    "RINGTORCH_STORE_MAX_CONNECTIONS", 32768, int,
    "most connections a TCPStore server holds, authenticated or in their handshake (each rank "
    "holds two); at the cap the oldest unauthenticated one is dropped for a newcomer, and only "
    "when every one is authenticated is the newcomer refused. The process's descriptor limit "
    "(ulimit -n) must allow as many",
)
STORE_LINGER_S = _knob(
    "RINGTORCH_STORE_LINGER_S", 30.0, float,
    "seconds a TCPStore master's server keeps serving the clients still connected when its "
    "store is closed or its process exits; it stops as soon as they have all disconnected, so "
    "a job whose ranks are done pays nothing. 30 s outlasts a late rank's last store round "
    "trips on a loaded machine and bounds the wait for a client that never leaves; 0 stops "
    "at once (torch's behaviour)",
)

RPC_SPIN_US = _knob(
    "RINGTORCH_RPC_SPIN_US", -1, int,
    "at most this many microseconds an RPC reader polls its socket before it sleeps (a "
    "sleeping thread costs a 30-60 us wake-up on a VM; the spin shrinks while it does not "
    "pay); -1 (default) means 50 when every worker of this host can have a core, else 0",
)


def _parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return parse


SHRINK_WAIT_S = _knob(
    "RINGTORCH_SHRINK_WAIT_S", 10.0, float,
    "shrink_group and shrink_on_failure: how long the survivors wait for a member that neither "
    "takes part nor is known dead (a member on this host whose process exited is known dead at "
    "once); a member still silent then (stopped, or on another host) is left out of the new "
    "group and refused if it comes back; it also bounds the making of a grown group "
    "(admit_joiners): a participant silent that long leaves the members on their group and the "
    "joiners refused",
)
JOIN = _knob(
    "RINGTORCH_JOIN", False, _parse_bool,
    "1 (set by ringrun --on-worker-failure continue when it restarts a failed worker alone): "
    "init_process_group joins the running job as a replacement for its RANK, admitted by the "
    "job's ranks at their next dist.admit_joiners() call, instead of meeting a new job",
)
DEVICE_RUNTIME = _knob(
    "RINGTORCH_DEVICE_RUNTIME", "auto", _parse_choice("auto", "cuda", "sim"),
    "which device runtime ringtorch's GPU code runs on: auto (CUDA where torch sees a GPU, "
    "else the simulated one), cuda, or sim (streams run by threads over CPU memory; for "
    "tests)",
)
DEVICE_IPC = _knob(
    "RINGTORCH_DEVICE_IPC", True, _parse_bool,
    "0 turns the IPC path off: an all_reduce of device tensors among ranks of one host is "
    "staged through pinned host memory like one across hosts (set it alike on every rank; "
    "the benchmark compares the two paths with it)",
)
DEVICE_UNCONFIRMED = _knob(
    "RINGTORCH_DEVICE_UNCONFIRMED", False, _parse_bool,
    "for tests and the GPU check only: open the device features that no recorded GPU run has "
    "confirmed yet (collectives on CUDA tensors); off, such tensors are rejected as before",
)
NCCL_FAKE = _knob(
    "RINGTORCH_NCCL_FAKE", "", str,
    "for tests only: backend \"nccl\" runs on a fake NCCL (ringtorch's CPU collectives on the "
    "simulated device runtime) instead of the library; \"1\", or comma-separated faults: "
    "hang_init (the communicator's init never completes), version=X.Y.Z (the version it "
    "reports)",
)
NCCL_LIBRARY = _knob(
    "RINGTORCH_NCCL_LIBRARY", "", str,
    "path of the NCCL library (libnccl.so.2) to bind; empty: the one torch has loaded, else "
    "the nvidia-nccl wheel's, else libnccl.so.2 on the loader's path",
)


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Set knobs for the duration of a ``with`` block, by name without the prefix.

    ``with override(SECRET="abc"):`` makes ``SECRET.get()`` return ``"abc"`` inside the block.
    Only this process sees the change; set ``os.environ`` for child processes.
    """
    saved: dict[str, Any] = {}
    missing = object()
    for short_name, value in values.items():
        name = "RINGTORCH_" + short_name
        if name not in KNOBS:
            raise KeyError(f"no knob named {name}; known: {sorted(KNOBS)}")
        saved[name] = _overrides.get(name, missing)
        _overrides[name] = value
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                _overrides.pop(name, None)
            else:
                _overrides[name] = value
