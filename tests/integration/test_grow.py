"""Replacement workers join a running job (dist.admit_joiners, RINGTORCH_JOIN=1): real
processes, the job's store served by this test process (docs/recovery.md, "Grow back").

Two ranks of four are SIGKILLed; the survivors shrink, then admit two replacements at one
step boundary, over sockets (RINGTORCH_SHM=0; examples/grow_back.py runs on shared memory in
test_grow_back_example.py), while a second replacement for one rank and one for a live rank
are refused. And the joiner's errors: nobody admits it (the timeout names what it waited
for), a wrong job secret, a rank that never ran.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringtorch import _config
from ringtorch.distributed import TCPStore
from ringtorch.testing import wait_for

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "integration" / "_grow_job.py"
SECRET = "grow-test-secret"

# Slow stage: 37 s for the file on the 2 shared cores at a load of 5, 63-82 s at 21-30 (13
# processes that each start torch, one of them waiting out its 2 s join timeout); the grow back
# stays in the default suite through test_grow_back_example.py (real ringrun, shared memory).
pytestmark = pytest.mark.slow


@pytest.fixture
def store() -> Iterator[TCPStore]:
    with _config.override(SECRET=SECRET):
        server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        yield server


def _start(store: TCPStore, slot: int, args: list[str], **env: str) -> subprocess.Popen[str]:
    full = dict(os.environ, RANK=str(slot), WORLD_SIZE="4", MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(store.port), TORCHELASTIC_USE_AGENT_STORE="True",
                RINGTORCH_SECRET=SECRET, PYTHONPATH=str(ROOT))
    full.update(env)
    return subprocess.Popen([sys.executable, str(JOB), *args], env=full, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _record(proc: subprocess.Popen[str]) -> dict | None:
    out, err = proc.communicate(timeout=120)
    lines = out.strip().splitlines()
    assert lines or proc.returncode == -9, err
    return json.loads(lines[-1]) if lines else None


def _arrivals(store: TCPStore) -> int:
    return store.add("default_pg/rt_grow/arrivals", 0)


def test_two_replacements_join_at_one_boundary_and_duplicates_are_refused(
        store: TCPStore) -> None:
    steps = 8
    members = [_start(store, r, ["member", str(steps), "3", "2,3"], RINGTORCH_SHM="0")
               for r in range(4)]
    try:
        wait_for(lambda: store.check(["shrunk/0", "shrunk/1"]), 120, "the survivors' shrink")
        joiners = {(slot, n): _start(store, slot, ["joiner", str(steps), "60"],
                                     RINGTORCH_JOIN="1", RINGTORCH_SHM="0")
                   for slot, n in ((2, 0), (3, 0), (3, 1), (1, 0))}
        # every knock is in before the survivors' next boundary: one admission for all
        wait_for(lambda: _arrivals(store) >= 4, 120, "four knocks")
        store.set("go", "1")
        got = {key: _record(proc) for key, proc in joiners.items()}
        results = [_record(proc) for proc in members]
    finally:
        for proc in members + list(locals().get("joiners", {}).values()):
            proc.kill()
    assert results[2] is None and results[3] is None  # SIGKILLed
    total = float(sum(slot + 1 for slot in range(4)))  # every rank gives slot + 1
    for slot in (0, 1):
        rec = results[slot]
        assert rec["shrunk"] == [slot, 2, [2, 3]], rec
        assert rec["grown"] == [slot, 4, 2, [2, 3], False], rec
        assert (rec["rank"], rec["world"], rec["ranks"]) == (slot, 4, [0, 1, 2, 3]), rec
        assert rec["sums"] == [[s, 4, total] for s in range(steps)], rec
    dup = [got[(3, 0)], got[(3, 1)]]
    admitted = [rec for rec in dup if "joined" in rec] + [got[(2, 0)]]
    refused = [rec for rec in dup if "error" in rec]
    assert len(refused) == 1, dup
    assert refused[0]["error"] == [
        "JoinError", "rank 3 was refused by the running job: another replacement for rank 3 "
                     "was admitted first"]
    assert got[(1, 0)]["error"] == [
        "JoinError", "rank 1 was refused by the running job: rank 1 is a member of the "
                     "running job already"]
    for rec in admitted:
        slot = rec["slot"]
        assert rec["joined"] == [slot, 4, 2, [2, 3]], rec
        assert (rec["rank"], rec["world"], rec["ranks"]) == (slot, 4, [0, 1, 2, 3]), rec
        assert rec["sums"] == [[s, 4, total] for s in range(3, steps)], rec


def test_a_joiner_nobody_admits_a_wrong_secret_and_an_unknown_rank_are_refused(
        store: TCPStore) -> None:
    members = [_start(store, r, ["idle"], WORLD_SIZE="2") for r in range(2)]
    try:
        wait_for(lambda: store.check(["ready/0", "ready/1"]), 120, "the job's init")
        late = _start(store, 1, ["joiner", "1", "2"], WORLD_SIZE="2", RINGTORCH_JOIN="1")
        stranger = _start(store, 1, ["joiner", "1", "2"], WORLD_SIZE="2", RINGTORCH_JOIN="1",
                          RINGTORCH_SECRET="not-the-job-secret")
        unknown = _start(store, 5, ["joiner", "1", "2"], WORLD_SIZE="8", RINGTORCH_JOIN="1")
        late_rec, stranger_rec, unknown_rec = (_record(p) for p in (late, stranger, unknown))
        store.set("done", "1")
        assert [_record(p) for p in members] == [{"slot": 0}, {"slot": 1}]
    finally:
        for proc in members:
            proc.kill()
    kind, text = late_rec["error"]
    assert kind == "JoinError"
    assert re.fullmatch(
        r"rank 1 could not join the running job within 0:00:02: no rank of the job admitted it "
        r"\(it waited for its answer, key 'rt_grow/answer/1-\d+-[0-9a-f]{8}' in the job's "
        r"store; the job's ranks admit replacements when they call dist.admit_joiners\(\), "
        r"once per step\)", text), text
    kind, text = stranger_rec["error"]
    assert kind == "HandshakeError"
    assert re.fullmatch(r"127\.0\.0\.1:\d+ failed to prove the job secret: RINGTORCH_SECRET "
                        r"differs between this process and the server", text), text
    assert unknown_rec["error"] == [
        "JoinError", "rank 5 cannot join a running job: no process ran as rank 5 on this store "
                     "(RINGTORCH_JOIN=1 starts a replacement for a rank of a running job)"]


def test_a_joiner_that_arrives_after_the_job_ended_is_told_at_once(store: TCPStore) -> None:
    """Rank 0 marks the job ended when it destroys the default group: a replacement that
    knocks later is refused at once instead of waiting its whole timeout (60 s here)."""
    members = [_start(store, r, ["idle"], WORLD_SIZE="2") for r in range(2)]
    try:
        wait_for(lambda: store.check(["ready/0", "ready/1"]), 120, "the job's init")
        store.set("done", "1")
        assert [_record(p) for p in members] == [{"slot": 0}, {"slot": 1}]  # destroyed
    finally:
        for proc in members:
            proc.kill()
    late = _record(_start(store, 1, ["joiner", "1", "60"], WORLD_SIZE="2", RINGTORCH_JOIN="1"))
    assert late["error"] == [
        "JoinError", "rank 1 cannot join: the running job has ended (its ranks destroyed their "
                     "default group) before it admitted this worker"]
