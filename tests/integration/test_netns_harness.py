"""The two-host harness (ringtorch.testing.netns) does what the fault tests rely on.

A TCP connection crosses from host 0 to host 1; ``partition()`` silences it (bytes sent go
nowhere, no error) and ``heal()`` brings it back with the bytes retransmitted; under a
partition an idle connection with keepalive times out as it would across a real network;
``link_down()`` makes sends fail with "network unreachable"; and on exit, even through an
exception, no namespace and no process it started is left, including one that left its
session.
"""

from __future__ import annotations

import errno
import os
import select
import subprocess
import sys

import pytest

from ringtorch.testing.netns import TwoHosts, sweep_stale

pytestmark = pytest.mark.netns

_ECHO_SERVER = """
import socket, sys
srv = socket.socket()
srv.bind((sys.argv[1], 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
for line in conn.makefile("rb"):
    conn.sendall(line.upper())
"""

# reads commands from stdin: "send WORD" or "recv SECONDS"; prints what happened
_CLIENT = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
print("connected", flush=True)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    if cmd == "send":
        s.sendall(arg.encode() + b"\\n")
        print("sent", flush=True)
    else:
        s.settimeout(float(arg))
        try:
            print("got", s.recv(100).decode().strip(), flush=True)
        except TimeoutError:
            print("timeout", flush=True)
"""

# an idle connection with keepalive every second and a 1 s user timeout; "wait" blocks in recv
_IDLE = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.settimeout(None)
s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 1000)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
print("connected", flush=True)
sys.stdin.readline()
try:
    s.recv(100)
except OSError as exc:
    print(exc.errno, flush=True)
"""

_CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=5)
except OSError as exc:
    print(exc.errno, flush=True)
"""


class _Client:
    """The client process on host 0, driven line by line."""

    def __init__(self, hosts: TwoHosts) -> None:
        self.server = hosts.run(1, [sys.executable, "-c", _ECHO_SERVER, hosts.addresses[1]],
                                stdout=subprocess.PIPE)
        port = self.server.stdout.readline().decode().strip()  # type: ignore[union-attr]
        self.proc = hosts.run(0, [sys.executable, "-c", _CLIENT, hosts.addresses[1], port],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.reply() == "connected"

    def ask(self, command: str) -> str:
        self.proc.stdin.write(command.encode() + b"\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self.reply()

    def reply(self) -> str:
        return self.proc.stdout.readline().decode().strip()  # type: ignore[union-attr]


def _netns_list() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_a_tcp_connection_crosses_from_host_0_to_host_1():
    with TwoHosts() as hosts:
        client = _Client(hosts)
        assert client.ask("send hello") == "sent"
        assert client.ask("recv 10") == "got HELLO"


def test_partition_silences_a_connection_and_heal_restores_it():
    with TwoHosts() as hosts:
        client = _Client(hosts)
        assert client.ask("send before") == "sent"
        assert client.ask("recv 10") == "got BEFORE"
        hosts.partition()
        assert client.ask("send during") == "sent"  # no error: the drop is silent
        assert client.ask("recv 1.5") == "timeout"
        hosts.heal()
        # TCP retransmits what the cut dropped
        assert client.ask("recv 20") == "got DURING"
        assert client.ask("send after") == "sent"
        assert client.ask("recv 10") == "got AFTER"


def test_under_a_partition_an_idle_connection_times_out_through_keepalive():
    # the probes leave host 0 and are lost on the way, as on a real network: were they
    # dropped on host 0 itself, Linux would count local congestion and never time out
    with TwoHosts() as hosts:
        server = hosts.run(1, [sys.executable, "-c", _ECHO_SERVER, hosts.addresses[1]],
                           stdout=subprocess.PIPE)
        port = server.stdout.readline().decode().strip()  # type: ignore[union-attr]
        idle = hosts.run(0, [sys.executable, "-c", _IDLE, hosts.addresses[1], port],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert idle.stdout.readline() == b"connected\n"  # type: ignore[union-attr]
        hosts.partition()
        idle.stdin.write(b"wait\n")  # type: ignore[union-attr]
        idle.stdin.flush()  # type: ignore[union-attr]
        ready, _, _ = select.select([idle.stdout], [], [], 20)
        assert ready, "an idle connection outlived a partition"
        assert idle.stdout.readline().strip() == str(errno.ETIMEDOUT).encode()  # type: ignore[union-attr]


def test_link_down_makes_connecting_fail_with_network_unreachable():
    with TwoHosts() as hosts:
        hosts.link_down()
        proc = hosts.run(0, [sys.executable, "-c", _CONNECT, hosts.addresses[1]],
                         stdout=subprocess.PIPE)
        out, _ = proc.communicate(timeout=30)
        assert out.decode().strip() == str(errno.ENETUNREACH)
        hosts.heal()
        proc = hosts.run(0, [sys.executable, "-c", _CONNECT, hosts.addresses[1]],
                         stdout=subprocess.PIPE)
        out, _ = proc.communicate(timeout=30)
        assert out.decode().strip() == str(errno.ECONNREFUSED)  # reached host 1: nobody on 9


def test_each_host_has_its_own_identity_and_address():
    with TwoHosts() as hosts:
        envs = [hosts.env(h) for h in (0, 1)]
        assert envs[0]["RINGTORCH_HOST_ID"] != envs[1]["RINGTORCH_HOST_ID"]
        assert [e["RINGTORCH_SOCKET_ADDR"] for e in envs] == list(hosts.addresses)
        with pytest.raises(ValueError, match=r"^host must be 0 or 1, got 2$"):
            hosts.run(2, ["true"])


def test_two_instances_at_once_use_different_names_and_subnets():
    with TwoHosts() as first, TwoHosts() as second:
        assert set(first.netns).isdisjoint(second.netns)
        assert first.addresses[0].rsplit(".", 1)[0] != second.addresses[0].rsplit(".", 1)[0]


_LINGERER = """
import os, signal, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"],
                         start_new_session=True)
print(os.getpid(), child.pid, flush=True)
signal.pause()
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_nothing_is_left_after_exit_even_on_an_error():
    with pytest.raises(KeyError, match="boom"), TwoHosts() as hosts:
        names, switch = hosts.netns, hosts.switch
        proc = hosts.run(1, [sys.executable, "-c", _LINGERER], stdout=subprocess.PIPE)
        pids = [int(p) for p in proc.stdout.readline().split()]  # type: ignore[union-attr]
        assert all(_alive(p) for p in pids)
        assert sorted(hosts.pids(1)) == sorted(pids)
        raise KeyError("boom")
    assert not any(_alive(p) for p in pids), "a process started in a host survived"
    listed = _netns_list()
    assert not any(name in listed for name in (*names, switch)), listed
    assert os.path.exists(f"/run/netns/{names[0]}") is False


def test_a_closed_pair_refuses_to_cut_links():
    hosts = TwoHosts()
    with hosts:
        pass
    with pytest.raises(RuntimeError, match=r"^these two hosts have been closed$"):
        hosts.partition()


_KILLED_OWNER = """
from ringtorch.testing.netns import TwoHosts
hosts = TwoHosts(prefix="swept").__enter__()
print(" ".join((*hosts.netns, hosts.switch)), flush=True)
import signal
signal.pause()
"""


def test_namespaces_of_a_killed_owner_are_swept_by_the_next_run():
    owner = subprocess.Popen([sys.executable, "-c", _KILLED_OWNER], stdout=subprocess.PIPE)
    names = owner.stdout.readline().decode().split()  # type: ignore[union-attr]
    assert len(names) == 3 and all(name in _netns_list() for name in names)
    owner.kill()  # SIGKILL: no chance to clean up
    owner.wait()
    assert sorted(sweep_stale("swept")) == sorted(names)
    assert not any(name in _netns_list() for name in names)
