"""DoorWork: torch's ``Work`` (a ``torch.distributed.Work`` subclass) over an engine Work.

torch's C++ code (functional collectives' ``wait_tensor``, DDP's reducer) reaches ``wait`` and
``get_future`` through torch's Python-Work trampoline; Python code reaches every method. The
engine Work already keeps torch's semantics (``wait`` raises the operation's error, the future
holds torch's result value, a list of the output tensors), so each method only forwards.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class DoorWork(dist.Work):
    """One operation of a ringtorch group, as torch's ``Work``."""

    def __init__(self, work: Any) -> None:
        super().__init__()
        self._work = work

    @property
    def engine_work(self) -> Any:
        """The engine's Work behind this one."""
        return self._work

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until done and raise the operation's error; torch's zero timeout (its
        default, ``kNoTimeout``) waits for the operation, whose own deadline is the group's."""
        if isinstance(timeout, timedelta) and timeout <= timedelta(0):
            timeout = None
        return self._work.wait(timeout)

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> BaseException | None:
        return self._work.exception()

    def result(self) -> list[torch.Tensor]:
        return self._work.result()

    def get_future(self) -> torch.futures.Future:
        return self._work.get_future()

    def source_rank(self) -> int:
        return self._work.source_rank()

    def _source_rank(self) -> int:
        return self._work.source_rank()

    def synchronize(self) -> None:
        """Nothing to do on CPU."""

    def block_current_stream(self) -> None:
        """Nothing to do on CPU."""

    def _get_sequence_number(self) -> int:
        return self._work.seq

    def __repr__(self) -> str:
        return repr(self._work)


def door_work(work: Any) -> Any:
    """torch's Work for an engine Work (None stays None: an operation with no Work)."""
    return None if work is None else DoorWork(work)


__all__ = ["DoorWork", "door_work"]
