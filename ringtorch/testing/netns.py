"""Two "hosts" on one machine, for tests of what happens between hosts: partitions, links down.

``TwoHosts`` makes two network namespaces, each with its own address in a private /24, joined
through a third one, the *switch* (a bridge, a veth pair to each host), and runs processes in
either host (``run``). ``partition()`` cuts the network silently: a zero-length queue on the
switch's two ports drops every frame it would forward, while each host's own sends succeed, as
when a switch in the path fails (dropping at the hosts' own interfaces would not do: the kernel
takes a local drop for congestion and never times the connection out). ``heal()`` lifts the
cut; ``link_down()`` takes the hosts' interfaces down (the sender gets "network unreachable").
The rule it keeps: whatever it made goes when it exits, on success or error: every process it
started (and anything else left in its namespaces) is killed, and the namespaces and their
veth pairs are deleted.

The two namespaces share the machine's hostname, /dev/shm and boot id, so ``env(host)`` gives
each host its own ringtorch host identity (``RINGTORCH_HOST_ID``) and the address its ranks
listen on (``RINGTORCH_SOCKET_ADDR``); ``run`` adds both. Needs root and iproute2
(``available()`` says whether they work here).
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from types import TracebackType

__all__ = ["HOSTS", "TwoHosts", "available", "sweep_stale"]

HOSTS = (0, 1)
_instances = itertools.count()
_NAME_RE = re.compile(r"^(?P<prefix>[a-z]+)-(?P<pid>\d+)-(?P<n>\d+)-[01s]$")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; a failure raises with ip's own words (it names what was wrong)."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def _tc(netns: str, *args: str) -> None:
    done = subprocess.run(["tc", "-n", netns, *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"`tc -n {netns} {' '.join(args)}` failed: {done.stderr.strip()}")


@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """Whether two hosts can be made here, and if not, why: needs root, ``ip`` and ``tc``,
    and a namespace, a veth pair and a queue discipline must really be creatable (a container
    without CAP_NET_ADMIN fails there). Cached: the answer does not change within a process."""
    if os.geteuid() != 0:
        return False, f"network namespaces need root (this process runs as uid {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` (iproute2) is not on PATH"
    try:
        with TwoHosts(prefix="probe") as hosts:
            hosts.partition()
            hosts.heal()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return False, f"cannot create network namespaces here: {exc}"
    return True, "root, ip netns, veth and tc work"


def sweep_stale(prefix: str = "rt") -> list[str]:
    """Delete the namespaces named ``prefix-PID-N-H`` whose creating process is gone (a test
    run that was SIGKILLed could not clean up). Returns the names deleted."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    gone = []
    for line in listed:
        name = line.split(" ")[0]
        match = _NAME_RE.match(name)
        if not match or match["prefix"] != prefix or _pid_alive(int(match["pid"])):
            continue
        _kill_netns_pids(name)
        _ip("netns", "delete", name, check=False)
        gone.append(name)
    return gone


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_netns_pids(netns: str, timeout: float = 10.0) -> None:
    """SIGKILL every process inside ``netns`` until none is left (or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [int(p) for p in _ip("netns", "pids", netns, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in namespace {netns} survived SIGKILL")
        time.sleep(0.01)


class TwoHosts:
    """Hosts 0 and 1: two network namespaces joined through a switch namespace.

    Use as a context manager; see the module docstring. Names include this process's pid and
    an instance counter, and each instance takes its own /24 out of 172.16.0.0/12, so
    concurrent users (tests in parallel, other sessions) never collide.
    """

    def __init__(self, prefix: str = "rt") -> None:
        if not re.fullmatch(r"[a-z]{1,5}", prefix):
            raise ValueError(f"prefix must be 1 to 5 lowercase letters, got {prefix!r}")
        n = next(_instances)
        pid = os.getpid()
        self.netns = tuple(f"{prefix}-{pid}-{n}-{h}" for h in HOSTS)
        self.switch = f"{prefix}-{pid}-{n}-s"
        # interface names are limited to 15 characters: each host's end, the switch's ports
        self.ifname = tuple(f"v{pid:x}x{n:x}{h}"[-15:] for h in HOSTS)
        self._ports = tuple(f"v{pid:x}y{n:x}{h}"[-15:] for h in HOSTS)
        subnet = (pid * 7 + n) % 4096
        base = f"172.{16 + subnet // 256}.{subnet % 256}"
        self.addresses = (f"{base}.1", f"{base}.2")
        self._procs: list[subprocess.Popen[bytes]] = []
        self._created: list[str] = []
        self._closed = False

    # -- life cycle -------------------------------------------------------------------------

    def __enter__(self) -> TwoHosts:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _create(self) -> None:
        for netns in (*self.netns, self.switch):
            _ip("netns", "add", netns)
            self._created.append(netns)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        for h in HOSTS:
            _ip("link", "add", self.ifname[h], "netns", self.netns[h], "type", "veth",
                "peer", "name", self._ports[h], "netns", self.switch)
            _ip("-n", self.switch, "link", "set", self._ports[h], "master", "br0")
            _ip("-n", self.switch, "link", "set", self._ports[h], "up")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for h in HOSTS:
            _ip("-n", self.netns[h], "addr", "add", f"{self.addresses[h]}/24",
                "dev", self.ifname[h])
            _ip("-n", self.netns[h], "link", "set", "lo", "up")
            _ip("-n", self.netns[h], "link", "set", self.ifname[h], "up")

    def close(self) -> None:
        """Kill everything started in either host, then delete the namespaces (the veth pair
        goes with them). Idempotent; called by ``__exit__``."""
        if self._closed:
            return
        self._closed = True
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for netns in self._created:
            _kill_netns_pids(netns)
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for netns in self._created:
            _ip("netns", "delete", netns, check=False)

    # -- running processes ----------------------------------------------------------------

    def env(self, host: int) -> dict[str, str]:
        """The variables that make ringtorch treat ``host`` as a machine of its own: its
        host identity and the address its sockets listen on."""
        self._check_host(host)
        return {"RINGTORCH_HOST_ID": f"netns-host-{host}/{self.netns[host]}",
                "RINGTORCH_SOCKET_ADDR": self.addresses[host]}

    def run(self, host: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
            **popen_kwargs: object) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``host``, in a new session (so ``close`` can kill its process
        group). The environment is this process's, plus ``env(host)``, plus ``env``.
        ``popen_kwargs`` go to ``subprocess.Popen`` (stdout, stderr, cwd, ...)."""
        self._check_open()
        self._check_host(host)
        full_env = {**os.environ, **self.env(host), **(env or {})}
        proc: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
            ["ip", "netns", "exec", self.netns[host], *argv], env=full_env,
            start_new_session=True, **popen_kwargs)
        self._procs.append(proc)
        return proc

    def pids(self, host: int) -> list[int]:
        """The processes now inside ``host``'s namespace (those ``run`` started and theirs)."""
        self._check_host(host)
        return [int(p) for p in _ip("netns", "pids", self.netns[host]).stdout.split()]

    # -- faults -----------------------------------------------------------------------------

    def partition(self) -> None:
        """Drop every packet between the hosts, silently, in both directions: a queue of
        length zero on each port of the switch. Each host's sends succeed; established
        connections see no error, only silence, until TCP gives up on them."""
        self._check_open()
        for port in self._ports:
            _tc(self.switch, "qdisc", "replace", "dev", port, "root", "pfifo", "limit", "0")

    def link_down(self) -> None:
        """Take both veth ends down: the routes go, and sends fail with "network unreachable"
        (errno ENETUNREACH) on either side."""
        self._check_open()
        for h in HOSTS:
            _ip("-n", self.netns[h], "link", "set", self.ifname[h], "down")

    def heal(self) -> None:
        """Undo ``partition`` and ``link_down``: the default queue again, both ends up (and
        their routes back). Connections that outlived the fault carry on."""
        self._check_open()
        for port in self._ports:
            shown = subprocess.run(["tc", "-n", self.switch, "qdisc", "show", "dev", port,
                                    "root"], capture_output=True, text=True, timeout=30).stdout
            if "pfifo" in shown:
                _tc(self.switch, "qdisc", "del", "dev", port, "root")
        for h in HOSTS:
            _ip("-n", self.netns[h], "link", "set", self.ifname[h], "up")
        for h in HOSTS:
            # bringing the link up re-adds the /24 route; wait until it is there
            deadline = time.monotonic() + 5
            while self.addresses[1 - h].rsplit(".", 1)[0] not in _ip(
                    "-n", self.netns[h], "route", "show").stdout:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the route of host {h} did not come back")
                time.sleep(0.01)

    # -- checks -------------------------------------------------------------------------------

    def _check_host(self, host: int) -> None:
        if host not in HOSTS:
            raise ValueError(f"host must be 0 or 1, got {host!r}")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("these two hosts have been closed")
