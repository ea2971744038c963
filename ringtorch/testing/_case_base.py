"""The bookkeeping of the backend conformance suite's rank side: cases, failures, digests.

A case runs through ``CaseBase.run``: an exception or a wrong result becomes a failure naming
the case, the world size and the rank, and the run goes on, so one run reports every failing
case. Inputs come from ``_oracle`` (a pure function of case, rank, dtype and size).
"""

from __future__ import annotations

import hashlib
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

import ringtorch.distributed as dist
from ringtorch.testing import _oracle as o

N = 7  # elements per rank and per part: odd, so no algorithm's chunks come out even
LARGE = 100_003  # past the small-message thresholds: the bandwidth paths run too


@dataclass
class CaseReport:
    """What one rank saw: how many cases ran, the failures, and digests to compare."""

    rank: int
    world_size: int
    cases: int = 0
    failures: list[str] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)


class CaseBase:
    """One rank's view of the suite: who it is, what failed, what to compare across ranks."""

    def __init__(self, marker_dir: str) -> None:
        self.rank = dist.get_rank()
        self.ws = dist.get_world_size()
        self.marker_dir = marker_dir
        self.report = CaseReport(self.rank, self.ws)

    # -- bookkeeping ---------------------------------------------------------------------

    def where(self, case: str) -> str:
        return f"{case} (world {self.ws}, rank {self.rank})"

    def fail(self, case: str, why: str) -> None:
        self.report.failures.append(f"{self.where(case)}: {why}")

    def run(self, case: str, fn: Callable[[], None]) -> None:
        self.report.cases += 1
        try:
            fn()
        except Exception as exc:
            tb = traceback.format_exc(limit=-3)
            self.fail(case, f"raised {type(exc).__name__}: {exc}\n{tb}")

    def check(self, case: str, got: torch.Tensor, expected: np.ndarray, dtype: torch.dtype,
              reduction: str = "SUM") -> None:
        why = o.mismatch(got, expected, dtype, reduction)
        if why is not None:
            self.fail(case, why)

    def digest(self, case: str, t: torch.Tensor) -> None:
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        self.report.digests[case] = hashlib.sha1(raw.tobytes()).hexdigest()

    def inputs(self, case: str, dtype: torch.dtype, numel: int = N) -> list[np.ndarray]:
        """Every rank's input of ``case`` (this rank's is ``[self.rank]``)."""
        return [o.make_input(case, r, dtype, numel) for r in range(self.ws)]

    def mine(self, case: str, dtype: torch.dtype, numel: int = N) -> torch.Tensor:
        return o.to_tensor(o.make_input(case, self.rank, dtype, numel), dtype)

    def root(self, case: str) -> int:
        """A root that varies from case to case, the same on every rank."""
        return zlib.crc32(case.encode()) % self.ws
