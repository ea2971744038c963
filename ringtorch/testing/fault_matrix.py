"""The fault matrix: a real workload across two hosts, one fault injected, every rank measured.

``run_cell(cell, lib, settings)`` starts the ranks of ``cell`` (a workload of
``fault_workload.py`` on ``cell.layout`` ranks per host of a fresh ``TwoHosts``, the store on
host 0 with rank 0), waits until every rank has run a few checked steps, injects the fault
and records on every rank what it ended with: the exception, whether it is a ``DistError``,
the ranks and hosts its first line names, the time from the fault to the error and to the
process's exit, the warnings logged. Then it looks for what the job left behind: its
processes (found by a mark in their environment, so descendants count too), its files in
/dev/shm (new names that carry one of its processes' pids) and listening TCP ports in the two
namespaces. The rule it keeps: the same program and the same measurement for ringtorch and
for torch, and nothing of a cell survives it (``TwoHosts`` kills what is left and deletes the
namespaces). Faults: ``partition`` (every packet between the hosts dropped, silently),
``sigkill`` and ``sigstop`` of the last rank (on host 1), ``store_death`` (SIGKILL of rank 0,
whose process hosts the TCPStore server). A frozen rank is resumed (SIGCONT) once the others
have ended, and measured from then.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringtorch.testing.fault_workload import WORKLOADS
from ringtorch.testing.netns import TwoHosts

WORKLOAD = str(Path(__file__).with_name("fault_workload.py"))
FAULTS = ("partition", "sigkill", "sigstop", "store_death")
JOB_MARK = "RINGTORCH_FAULT_MATRIX_JOB"  # not a knob: a mark in the workers' environment
STORE_PORT = 29500  # each cell has namespaces of its own: no port can be taken
_POLL_S = 0.005


@dataclass(frozen=True)
class Cell:
    """A workload, a fault, and how many ranks run on host 0 and on host 1."""

    workload: str
    fault: str
    layout: tuple[int, int]

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {WORKLOADS}, got {self.workload!r}")
        if self.fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {self.fault!r}")
        if min(self.layout) < 1:
            raise ValueError(f"each host needs a rank, got layout {self.layout}")

    @property
    def world(self) -> int:
        return sum(self.layout)

    def host_of(self, rank: int) -> int:
        return 0 if rank < self.layout[0] else 1

    @property
    def victim(self) -> int | None:
        """The rank the fault strikes (None for a partition, which strikes the link)."""
        return {"partition": None, "store_death": 0}.get(self.fault, self.world - 1)

    def culprits(self, rank: int) -> set[int]:
        """The ranks an error on ``rank`` should name: the victim, or for a partition every
        rank on the other host."""
        if self.victim is not None:
            return {self.victim}
        return {r for r in range(self.world) if self.host_of(r) != self.host_of(rank)}

    @property
    def name(self) -> str:
        return f"{self.workload}-{self.fault}-{self.layout[0]}+{self.layout[1]}"


@dataclass(frozen=True)
class Settings:
    """Timeouts given to both libraries alike, the measurement's own limits, and variables
    for the ranks (ringtorch's knobs; torch ignores them)."""

    timeout_s: float = 20.0        # init_process_group's timeout and the RPC timeout
    cap_s: float = 60.0            # a rank not ended this long after the fault hangs
    exit_grace_s: float = 10.0     # a rank still alive this long after its error is left
    start_timeout_s: float = 120.0 # for every rank to be up and running its steps
    env: tuple[tuple[str, str], ...] = ()


@dataclass
class RankOutcome:
    """How one rank ended. Times are seconds after the fault (for a frozen victim, after it
    was resumed); ``error_s`` is None when the rank raised nothing before the cap."""

    rank: int
    host: int
    error_s: float | None = None
    exit_s: float | None = None
    error_type: str = ""
    dist_error: bool = False
    first_line: str = ""
    message: str = ""
    named_ranks: list[int] = field(default_factory=list)
    named_hosts: list[str] = field(default_factory=list)
    warnings: list[tuple[float, str]] = field(default_factory=list)
    killed: bool = False  # the fault's victim under SIGKILL: it cannot report
    stderr_tail: str = ""


@dataclass
class CellResult:
    cell: Cell
    lib: str
    settings: Settings
    outcomes: list[RankOutcome]
    left_processes: list[str]
    left_shm: list[str]
    left_ports: list[str]
    addresses: tuple[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"cell": self.cell.__dict__, "lib": self.lib,
                "settings": {**self.settings.__dict__, "env": dict(self.settings.env)},
                "outcomes": [o.__dict__ for o in self.outcomes],
                "left_processes": self.left_processes, "left_shm": self.left_shm,
                "left_ports": self.left_ports, "addresses": list(self.addresses)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CellResult:
        """The result ``to_json`` wrote (a saved run, rendered again without rerunning)."""
        cell = data["cell"]
        settings = {**data["settings"], "env": tuple(data["settings"]["env"].items())}
        return cls(Cell(cell["workload"], cell["fault"], tuple(cell["layout"])), data["lib"],
                   Settings(**settings), [RankOutcome(**o) for o in data["outcomes"]],
                   data["left_processes"], data["left_shm"], data["left_ports"],
                   tuple(data["addresses"]))


# -- reading messages (pure) --------------------------------------------------------------------

_RANK_RE = re.compile(r"\brank (\d+)|\branks \[([\d, ]+)\]")
_HOST_RE = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?|netns-host-\d")


def named_ranks(line: str) -> list[int]:
    """The ranks a message names ("rank 2", "ranks [1, 3]"), in order, once each."""
    found: list[int] = []
    for single, several in _RANK_RE.findall(line):
        for text in [single] if single else several.split(","):
            if text.strip() and int(text) not in found:
                found.append(int(text))
    return found


def named_hosts(line: str) -> list[str]:
    """The hosts a message names: IPv4 addresses (with a port, if given) and host ids."""
    return list(dict.fromkeys(_HOST_RE.findall(line)))


def _first_line(message: str) -> str:
    return message.strip().split("\n", 1)[0] if message.strip() else ""


# -- leftovers ------------------------------------------------------------------------------------

def _job_pids(job: str) -> list[int]:
    mark = f"{JOB_MARK}={job}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def _describe_pid(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return f"pid {pid} (gone)"
    words = [a.decode(errors="replace") for a in argv if a]
    tail = " ".join(Path(w).name if i < 2 else w for i, w in enumerate(words[:5]))
    return f"pid {pid} [{state}] {tail}"


def _listening_ports(netns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "exec", netns, "cat", "/proc/net/tcp",
                           "/proc/net/tcp6"], capture_output=True, text=True, timeout=30)
    ports = set()
    for line in done.stdout.splitlines()[1:]:
        cols = line.split()
        if len(cols) > 3 and cols[3] == "0A":  # TCP_LISTEN
            ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def shm_files_of(names: set[str], pids: set[int]) -> list[str]:
    """The names among ``names`` that carry one of ``pids`` as a number of their own."""
    return sorted(n for n in names
                  if any(int(num) in pids for num in re.findall(r"(?<!\d)\d+(?!\d)", n)))


# -- one cell -------------------------------------------------------------------------------------

def _inject(hosts: TwoHosts, cell: Cell, procs: dict[int, subprocess.Popen[bytes]]) -> None:
    if cell.fault == "partition":
        hosts.partition()
        return
    victim = cell.victim
    assert victim is not None
    sig = signal.SIGSTOP if cell.fault == "sigstop" else signal.SIGKILL
    os.kill(procs[victim].pid, sig)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _wait_started(cell: Cell, procs: dict[int, subprocess.Popen[bytes]], out: Path,
                  settings: Settings) -> None:
    deadline = time.monotonic() + settings.start_timeout_s
    while not all((out / f"rank{r}.ready").exists() for r in procs):
        for rank, proc in procs.items():
            if proc.poll() is not None:
                err = (out / f"rank{rank}.err").read_text()[-3000:]
                raise RuntimeError(f"{cell.name}: rank {rank} exited with {proc.returncode} "
                                   f"before it ran its steps:\n{err}")
        if time.monotonic() > deadline:
            late = [r for r in procs if not (out / f"rank{r}.ready").exists()]
            raise RuntimeError(f"{cell.name}: ranks {late} did not start their steps within "
                               f"{settings.start_timeout_s} s")
        time.sleep(_POLL_S)


def _watch(procs: dict[int, subprocess.Popen[bytes]], out: Path, since: float,
           settings: Settings, exits: dict[int, float]) -> None:
    """Until each rank of ``procs`` has exited, or is past its grace after its error, or
    the cap has passed; records exit times in ``exits``."""
    while True:
        now = time.monotonic()
        pending = []
        for rank, proc in procs.items():
            if rank in exits:
                continue
            if proc.poll() is not None:
                exits[rank] = now
                continue
            record = _read(out / f"rank{rank}.json")
            if record is None or now < record["t_error"] + settings.exit_grace_s:
                pending.append(rank)
        if not pending or now > since + settings.cap_s:
            return
        time.sleep(_POLL_S)


def _outcome(cell: Cell, rank: int, out: Path, since: float, exit_at: float | None,
             killed: bool) -> RankOutcome:
    outcome = RankOutcome(rank=rank, host=cell.host_of(rank), killed=killed,
                          stderr_tail=(out / f"rank{rank}.err").read_text()[-1500:])
    if exit_at is not None:
        outcome.exit_s = exit_at - since
    record = _read(out / f"rank{rank}.json")
    if record is not None:
        outcome.error_s = record["t_error"] - since
        outcome.error_type = record["type"]
        outcome.dist_error = record["dist_error"]
        outcome.message = record["message"]
        outcome.first_line = _first_line(record["message"])
        outcome.named_ranks = named_ranks(outcome.first_line)
        outcome.named_hosts = named_hosts(outcome.first_line)
        outcome.warnings = [(t - since, _first_line(m)) for t, m in record["warnings"]
                            if t >= since]
    return outcome


def run_cell(cell: Cell, lib: str, settings: Settings, keep_dir: Path | None = None) -> CellResult:
    """Run one cell of the matrix for ``lib`` ("ringtorch" or "torch"); see the module doc.
    ``keep_dir``: where the ranks' records and stderr go (default: a temporary folder)."""
    job = secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="fault-matrix-") as tmp, TwoHosts(prefix="fm") as hosts:
        out = Path(keep_dir or tmp) / f"{lib}-{cell.name}"
        shutil.rmtree(out, ignore_errors=True)  # an earlier run's records would be read as ours
        out.mkdir(parents=True)
        shm_before = set(os.listdir("/dev/shm"))
        procs: dict[int, subprocess.Popen[bytes]] = {}
        for rank in range(cell.world):
            host = cell.host_of(rank)
            env = {**dict(settings.env), JOB_MARK: job, "RINGTORCH_SECRET": job,
                   "GLOO_SOCKET_IFNAME": hosts.ifname[host], "TP_SOCKET_IFNAME": hosts.ifname[host],
                   "PYTHONUNBUFFERED": "1"}
            argv = [sys.executable, WORKLOAD, lib, cell.workload, str(rank), str(cell.world),
                    hosts.addresses[0], str(STORE_PORT), str(out), str(settings.timeout_s)]
            with open(out / f"rank{rank}.err", "wb") as err:
                procs[rank] = hosts.run(host, argv, env=env, stdout=subprocess.DEVNULL,
                                        stderr=err)
        _wait_started(cell, procs, out, settings)
        _inject(hosts, cell, procs)
        fault_at = time.monotonic()
        exits: dict[int, float] = {}
        victim = cell.victim
        watched = {r: p for r, p in procs.items() if r != victim or cell.fault != "sigstop"}
        _watch(watched, out, fault_at, settings, exits)
        since = {r: fault_at for r in procs}
        if cell.fault == "sigstop" and victim is not None:
            since[victim] = time.monotonic()
            os.kill(procs[victim].pid, signal.SIGCONT)
            _watch({victim: procs[victim]}, out, since[victim], settings, exits)
        pids = set(_job_pids(job)) | {p.pid for p in procs.values()}
        left = [_describe_pid(pid) for pid in _job_pids(job)]
        ports = [f"host {h}: {port}" for h in (0, 1) for port in _listening_ports(hosts.netns[h])]
        shm = shm_files_of(set(os.listdir("/dev/shm")) - shm_before, pids)
        outcomes = [_outcome(cell, r, out, since[r], exits.get(r),
                             killed=(r == victim and cell.fault in ("sigkill", "store_death")))
                    for r in range(cell.world)]
        addresses = hosts.addresses
    for name in shm:  # the job's segments must not outlive the measurement
        try:
            os.unlink(f"/dev/shm/{name}")
        except FileNotFoundError:
            pass
    return CellResult(cell, lib, settings, outcomes, left, shm, ports, addresses)
