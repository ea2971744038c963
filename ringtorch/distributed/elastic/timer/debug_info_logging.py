"""``log_debug_info_for_expired_timers``: one log line naming a run's expired timers.

``FileTimerServer`` calls it on every watchdog pass; it logs nothing when no timer expired.
"""

from __future__ import annotations

from ringtorch.distributed.elastic.utils.logging import get_logger


def log_debug_info_for_expired_timers(run_id: str, expired_timers: dict[int, list[str]]) -> None:
    """Log ``expired_timers`` (worker pid -> the expired requests, as JSON) for ``run_id``."""
    if expired_timers:
        get_logger(__name__).info("Timers expired for run:[%s] [%s].", run_id, expired_timers)


__all__ = ["log_debug_info_for_expired_timers"]
