"""Helpers for testing distributed programs with real processes (ringtorch's own tests use them).

Nothing under ``ringtorch/`` imports this package.
"""

from ringtorch._wire.sockets import free_port
from ringtorch.testing.harness import RankFailed, RanksTimedOut, rank_env, run_ranks

__all__ = ["RankFailed", "RanksTimedOut", "free_port", "rank_env", "run_ranks"]
