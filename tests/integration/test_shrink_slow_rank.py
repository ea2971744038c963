"""shrink_on_failure when the missing rank is only slow, and when the store died.

World 3, real processes (docs/recovery.md). Rank 2 is stopped with SIGSTOP: the others' all_reduce
times out, they shrink without it (it is alive, so they wait ``RINGTORCH_SHRINK_WAIT_S`` for it,
then leave it out) and all_reduce on; resumed with SIGCONT, rank 2 is refused loudly by the new
group and never rejoins. Rank 0, which serves the job's store, is SIGKILLed: the survivors cannot
agree and say why.
"""

from __future__ import annotations

import json

from ringtorch.testing import run_ranks
from tests.integration import _shrink_ranks as ranks


def test_a_stopped_rank_is_left_out_and_refused_once_resumed() -> None:
    results = run_ranks(ranks.frozen_then_resumed, 3, timeout=90,
                        env={"RINGTORCH_SHRINK_WAIT_S": "2"})
    for rank in (0, 1):
        got = results[rank]
        assert got["error"][1].startswith("all_reduce #1 (float32, 16 bytes, op SUM) on group "
                                          "'0'"), got["error"]
        assert "ranks [2] did not arrive" in got["error"][1]
        assert got["world"] == (rank, 2, (2,))
        assert got["sum"] == 1.0 + 2.0
    first, refused = json.loads(results[2]["resumed"])
    # the resumed rank learns of the abort from a survivor's ABORT frame or, when its
    # all_reduce gets there first, from the survivors' shared-memory segments
    assert first[0] in ("DistBackendError", "ShmPeerError"), first
    assert "the group was aborted" in first[1] or "aborted the group" in first[1], first
    assert refused == [
        "ShrinkRefusedError", "rank 2 was left out of the shrunk group '0': its survivors (ranks "
        "[0, 1] of the group) agreed without it, taking it for dead (it was excluded, or did "
        "not answer within 2 s, e.g. while stopped); it cannot rejoin the job's groups and "
        "should exit"]


def test_survivors_of_the_store_host_cannot_shrink_and_say_why() -> None:
    results = run_ranks(ranks.store_host_dies, 3, timeout=90)
    assert results[0] == {"victim_signal": 9}
    for rank in (1, 2):
        kind, message = results[rank]["shrink"]
        assert kind == "DistStoreError"
        assert message.startswith("shrinking group '0' failed: the store cannot be reached (")
        assert message.endswith(
            "); the survivors agree through the store, so a job whose store died with a rank "
            "cannot shrink (run the store in its own process, python -m ringtorch.store, with "
            "TORCHELASTIC_USE_AGENT_STORE=True; see docs/recovery.md)")

