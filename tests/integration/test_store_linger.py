"""A TCPStore master that leaves does not pull the store from under the clients still using it.

The master process hosts the server. When it exits (or closes its store) while other
processes' clients are connected, the server serves them until they disconnect, at most
RINGTORCH_STORE_LINGER_S; when none is connected, it exits at once. Each test runs the master
as a real process and the client in the test process, and synchronises through the store and a
file the master writes as its very last statement, never through sleeps.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from ringtorch.store import TCPStore
from ringtorch.testing import wait_for

ROOT = Path(__file__).resolve().parents[2]
T30 = timedelta(seconds=30)

# argv: how to leave ("exit", "close" or "raise"), the file to create on the way out.
MASTER = r"""
import sys
from datetime import timedelta
from ringtorch.store import TCPStore
how, leaving = sys.argv[1], sys.argv[2]
store = TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=30), wait_for_workers=False)
print(store.port, flush=True)
store.wait(["client joined"])
store.set("from master", "hello")
if how == "close":
    store.close()  # what destroy_process_group does
open(leaving, "w").close()
if how == "raise":
    raise RuntimeError("the master's program failed")
"""


def start_master(tmp_path: Path, how: str, linger_s: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", MASTER, how, str(tmp_path / "leaving")],
                            cwd=ROOT, env={**os.environ, "RINGTORCH_STORE_LINGER_S": linger_s},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


@pytest.mark.parametrize("how", ["exit", "close"])
def test_a_master_that_leaves_serves_a_client_still_working_until_it_disconnects(
        tmp_path: Path, how: str) -> None:
    proc, port = start_master(tmp_path, how, "120")
    client = TCPStore("127.0.0.1", port, None, False, T30)
    client.set("client joined", "yes")
    # The client keeps working (as a rank in its last round trips does) while the master's
    # program ends; then, a moment later, it still finds the server.
    def working_until_leaving() -> bool:
        client.check(["nothing"])
        return (tmp_path / "leaving").exists()

    wait_for(working_until_leaving, 30, "the master's program to end")
    for _ in range(50):  # half a second (without lingering, its server would be gone by now)
        client.check(["nothing"])
        time.sleep(0.01)
    assert client.get("from master") == b"hello"
    client.set("late", "still served")
    assert client.get("late") == b"still served"
    assert client.add("count", 2) == 2
    assert proc.poll() is None  # it waits for us
    client.close()
    _, err = proc.communicate(timeout=60)  # far below the 120 s bound: it left when we did
    assert proc.returncode == 0, err
    assert "still connected" not in err


def test_a_master_whose_clients_are_gone_exits_at_once(tmp_path: Path) -> None:
    proc, port = start_master(tmp_path, "exit", "120")
    client = TCPStore("127.0.0.1", port, None, False, T30)
    client.set("client joined", "yes")
    assert client.get("from master") == b"hello"
    client.close()
    started = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert time.monotonic() - started < 60  # not the 120 s it would wait for a client


def test_a_client_that_never_disconnects_delays_the_exit_by_the_bound_only(
        tmp_path: Path) -> None:
    proc, port = start_master(tmp_path, "exit", "1")
    client = TCPStore("127.0.0.1", port, None, False, T30)
    client.set("client joined", "yes")
    wait_for((tmp_path / "leaving").exists, 30, "the master's program to end")
    _, err = proc.communicate(timeout=60)  # we stay connected throughout
    assert proc.returncode == 0, err
    # Said by the exit hook, or by the server that the store's finalizer retired at exit.
    assert re.search(r"TCPStore server on 127\.0\.0\.1:\d+: (exiting|stopping) with 1 "
                     r"client\(s\) still connected after (waiting 1 s for them|lingering for "
                     r"them) \(RINGTORCH_STORE_LINGER_S\)", err), err
    client.close()


def test_a_master_whose_clients_are_idle_exits_without_waiting_for_the_bound(
        tmp_path: Path) -> None:
    """A peer still connected but silent (training on, or stuck) does not hold the exit: only a
    client with a blocking request parked or one that spoke in the last IDLE_CLIENT_S does."""
    proc, port = start_master(tmp_path, "exit", "120")
    client = TCPStore("127.0.0.1", port, None, False, T30)
    client.set("client joined", "yes")
    _, err = proc.communicate(timeout=60)  # we stay connected and silent; the bound is 120 s
    assert proc.returncode == 0, err
    assert "still connected" not in err
    client.close()


def test_a_master_that_fails_exits_at_once_even_with_a_client_connected(tmp_path: Path) -> None:
    """A failing rank 0 must not hide its failure for the linger's duration: the launcher and
    its peers learn it from its exit."""
    proc, port = start_master(tmp_path, "raise", "120")
    client = TCPStore("127.0.0.1", port, None, False, T30)
    client.set("client joined", "yes")
    _, err = proc.communicate(timeout=60)  # we stay connected throughout; the bound is 120 s
    assert proc.returncode == 1
    assert "RuntimeError: the master's program failed" in err
    assert "still connected after waiting" not in err
    client.close()


def test_a_spawned_master_that_fails_exits_at_once_even_with_a_client_connected(
        tmp_path: Path) -> None:
    script = tmp_path / "spawned.py"  # a file: spawn's children import __main__ from it
    script.write_text(SPAWNED)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "port")], cwd=ROOT,
                            env={**os.environ, "RINGTORCH_STORE_LINGER_S": "120"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for((tmp_path / "port.done").exists, 30, "the spawned master's port")
    client = TCPStore("127.0.0.1", int((tmp_path / "port").read_text()), None, False, T30)
    client.set("client joined", "yes")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err  # spawn raised ProcessRaisedException, which we catch
    assert "ProcessRaisedException" in err and "the spawned master failed" in err
    assert "still connected after waiting" not in err
    client.close()


# argv: the file to write the port to (and <file>.done once written).
SPAWNED = r"""
import sys
from datetime import timedelta
import ringtorch.multiprocessing as mp
from ringtorch.store import TCPStore

def master(i, path):
    store = TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=30), wait_for_workers=False)
    open(path, "w").write(str(store.port))
    open(path + ".done", "w").close()
    store.wait(["client joined"])
    raise RuntimeError("the spawned master failed")

if __name__ == "__main__":
    try:
        mp.spawn(master, args=(sys.argv[1],), nprocs=1)
    except Exception as exc:
        print(type(exc).__name__, exc, file=sys.stderr)
"""


def test_a_closed_master_releases_its_port_at_once_while_it_serves_its_clients() -> None:
    master = TCPStore("127.0.0.1", 0, None, True, T30)
    port = master.port
    client = TCPStore("127.0.0.1", port, None, False, T30)
    master.close()
    again = TCPStore("127.0.0.1", port, None, True, T30)  # the port is free again
    client.set("k", "old server")  # the old server still serves the client it had
    assert client.get("k") == b"old server"
    assert again.check(["k"]) is False
    client.close()
    again.close()
