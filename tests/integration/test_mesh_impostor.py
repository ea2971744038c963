"""The collective mesh checks who connects before it says "accepted": with no job secret at
all, a local process that reads the open store (every rank's address and per-incarnation
token) and connects as a rank already connected is refused loudly, and the job goes on.

World 3. Rank 1 is held back (its store view blocks its wait for rank 2's address) so that
rank 2's listener stays open; rank 0 connects to rank 2 and rank 2 says so (its log, at
DEBUG); a thread of rank 0's process then plays the impostor against rank 2, as rank 0
itself and with a wrong token; only then is rank 1 let go. Every step waits on a store key.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from datetime import timedelta
from typing import Any

import torch

import ringtorch.distributed as dist
from ringtorch._errors import DistError
from ringtorch._wire.handshake import SERVICE_COLLECTIVE, client_handshake, handshake_deadline
from ringtorch.store import PrefixStore, TCPStore
from ringtorch.testing import run_ranks, wait_for

NO_SECRET = {"RINGTORCH_SECRET": "", "RINGTORCH_SECRET_FILE": ""}
RANK2_HAS_RANK0 = "test/rank2_has_rank0"
IMPOSTOR_DONE = "test/impostor_done"
T60 = timedelta(seconds=60)


class HeldBack(PrefixStore):
    """The job's store, seen through a prefix; records the keys waited on, and (rank 1) holds
    the wait for rank 2's mesh address until ``IMPOSTOR_DONE`` is set."""

    def __init__(self, store: TCPStore, hold: bool) -> None:
        super().__init__("job", store)
        self.hold = hold
        self.waited: list[str] = []

    def wait(self, keys: Any, timeout: timedelta | None = None) -> None:
        names = [k.decode() if isinstance(k, bytes) else str(k) for k in keys]
        self.waited.extend(names)
        if self.hold and any(n.endswith("rt_mesh/addr/2") for n in names):
            self.underlying_store.wait([IMPOSTOR_DONE], T60)
        super().wait(keys, timeout)


class _Records(logging.Handler):
    def __init__(self, logger: str, level: int) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.changed = threading.Condition()
        log = logging.getLogger(logger)
        log.setLevel(level)
        log.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        with self.changed:
            self.records.append(record)
            self.changed.notify_all()

    def messages(self, level: str) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelname == level]


def _impostor(store: TCPStore, view: HeldBack, out: dict[str, Any]) -> None:
    """Read rank 2's address and token from the store, wait until rank 0 is connected to
    it, then connect as rank 0 (and once with a wrong token); let rank 1 go."""
    try:
        wait_for(lambda: any(k.endswith("rt_mesh/addr/2") for k in view.waited), 60,
                 "a wait for rank 2's mesh address")
        key = next(k for k in view.waited if k.endswith("rt_mesh/addr/2"))
        group = key[:-len("rt_mesh/addr/2")].rstrip("/").split("/")[-1]  # ".../<group>//rt..."
        key = f"{view.prefix}/{key}"  # the name in the job's store, under the view's prefix
        store.wait([key, RANK2_HAS_RANK0], T60)
        addr = json.loads(store.get(key))
        for label, token in (("as_rank0", addr["token"]), ("wrong_token", "0" * 16)):
            sock = socket.create_connection(tuple(addr["tcp"]), timeout=10)
            info = json.dumps({"group": group, "rank": 0, "kind": "coll", "token": token})
            try:
                client_handshake(sock, SERVICE_COLLECTIVE, handshake_deadline(), "rank 2",
                                 info.encode(), use_env_secret=False)
                out[label] = ("accepted", "")
            except DistError as exc:
                out[label] = (type(exc).__name__, str(exc))
            sock.close()
        out["group"] = group
    finally:
        store.set(IMPOSTOR_DONE, "1")


def impostor_world(rank: int, ws: int) -> dict[str, Any]:
    base = TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), ws, rank == 0,
                    timeout=T60)
    view = HeldBack(base, hold=rank == 1)
    out: dict[str, Any] = {}
    records = _Records("ringtorch._wire.mesh_setup", logging.DEBUG)
    helper = None
    if rank == 0:
        helper = threading.Thread(target=_impostor, args=(base.clone(), view, out))
    elif rank == 2:
        side = base.clone()

        def rank0_connected() -> bool:
            done = [m for m in records.messages("DEBUG") if ": rank 0 connected (" in m]
            return len(done) == 2  # both channels

        def announce() -> None:
            with records.changed:
                records.changed.wait_for(rank0_connected, 60)
            side.set(RANK2_HAS_RANK0, "1")

        helper = threading.Thread(target=announce)
    if helper is not None:
        helper.start()
    dist.init_process_group("gloo", store=view, rank=rank, world_size=ws, timeout=T60)
    if helper is not None:
        helper.join(60)
    t = torch.tensor([float(rank + 1), 10.0 * rank])
    dist.all_reduce(t)
    out["sum"] = t.tolist()
    out["errors"] = records.messages("ERROR")
    dist.destroy_process_group()
    return out


def test_an_impostor_connecting_as_a_connected_rank_is_refused_and_the_job_goes_on() -> None:
    first, _, third = run_ranks(impostor_world, 3, env=NO_SECRET, timeout=120)
    group = first["group"]
    assert first["as_rank0"] == (
        "HandshakeError", f"rank 2 refused the connection: rank 0 (coll channel) is already "
                          f"connected to rank 2 of group '{group}'")
    assert first["wrong_token"] == (
        "HandshakeError", f"rank 2 refused the connection: this is rank 2 of group '{group}' "
                          f"in another incarnation or group")
    assert len(third["errors"]) == 1, third["errors"]
    assert third["errors"][0].startswith(
        f"rank 2 of group '{group}': refused a second connection claiming to be rank 0 (coll "
        f"channel) from 127.0.0.1:")
    assert third["errors"][0].endswith(": rank 0 is already connected; its connection is kept")
    expected = [1.0 + 2.0 + 3.0, 0.0 + 10.0 + 20.0]  # computed here, not by ringtorch
    assert first["sum"] == third["sum"] == expected
