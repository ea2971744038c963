"""``WorkerInfo``: a worker's name and id, as torch's; and how messages name a worker."""

from __future__ import annotations

from typing import Any


class WorkerInfo:
    """A worker's name and id (its rank), as torch's ``WorkerInfo``."""

    __slots__ = ("id", "name")

    def __init__(self, name: str, id: int) -> None:
        self.name = name
        self.id = id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkerInfo) and (self.name, self.id) == (other.name, other.id)

    def __hash__(self) -> int:
        return hash((self.name, self.id))

    def __repr__(self) -> str:
        return f"WorkerInfo(id={self.id}, name={self.name})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (WorkerInfo, (self.name, self.id))


def describe(worker: WorkerInfo) -> str:
    return f"worker '{worker.name}' (rank {worker.id})"
