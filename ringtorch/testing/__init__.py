"""Helpers for testing distributed programs with real processes (ringtorch's own tests use them).

``run_ranks`` runs a function on N processes and collects their results; ``check_backend``
is the conformance suite a collective backend must pass (every collective x dtype x
reduction against NumPy). Nothing under ``ringtorch/`` imports this package.
"""

from ringtorch._wire.sockets import free_port
from ringtorch.testing._backend_cases import CaseReport, run_backend_cases
from ringtorch.testing.backend_check import BackendConformanceError, assert_conforms, check_backend
from ringtorch.testing.harness import RankFailed, RanksTimedOut, rank_env, run_ranks
from ringtorch.testing.waiting import frozen, wait_for, wait_for_thread_in

__all__ = ["BackendConformanceError", "CaseReport", "RankFailed", "RanksTimedOut",
           "assert_conforms", "check_backend", "free_port", "frozen", "rank_env",
           "run_backend_cases",
           "run_ranks", "wait_for", "wait_for_thread_in"]
