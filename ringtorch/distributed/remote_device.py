"""``_remote_device``: a device on a named or numbered RPC worker, as torch's.

The forms torch accepts, and only those: ``"<worker>/<device>"``, ``"rank:<rank>/<device>"``,
``"<worker>"`` or ``"rank:<rank>"`` (meaning that worker's CPU), a bare ``"<device>"`` (a local
device), or a ``torch.device``. The error messages are torch's.
"""

from __future__ import annotations

import torch

__all__: list[str] = []


def _parse_error(remote_device: object) -> ValueError:
    return ValueError(f"Could not parse remote_device: {remote_device}. The valid format is "
                      f"'<workername>/<device>' or 'rank:<rank>/<device>' or '<device>'")


def _is_device(text: str) -> bool:
    try:
        torch.device(text)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


class _remote_device:  # torch's name, lower case
    """A device on a remote worker: ``worker_name()`` or ``rank()`` says which worker (at most
    one of them is set), ``device()`` which device there.

    Raises:
        ValueError: a string of none of the accepted forms (torch's message).
        TypeError: neither a string nor a ``torch.device``.
    """

    def __init__(self, remote_device: str | torch.device) -> None:
        self._worker_name: str | None = None
        self._rank: int | None = None
        if isinstance(remote_device, torch.device):
            self._device = remote_device
            return
        if not isinstance(remote_device, str):
            raise TypeError(f"Invalid type for remote_device: {type(remote_device)}")
        fields = remote_device.split("/")
        if len(fields) == 2:
            worker, device = fields
        elif len(fields) == 1 and _is_device(fields[0]):
            worker, device = None, fields[0]
        elif len(fields) == 1:
            worker, device = fields[0], "cpu"
        else:
            raise _parse_error(remote_device)
        if worker is not None and not worker:
            raise _parse_error(remote_device)
        self._device = torch.device(device)  # torch's own error for a bad device string
        if worker is not None:
            parts = worker.split(":")
            if len(parts) == 1:
                self._worker_name = worker
            elif len(parts) == 2 and parts[0] == "rank" and parts[1].isdigit():
                self._rank = int(parts[1])
            else:
                raise _parse_error(remote_device)

    def worker_name(self) -> str | None:
        """The worker's name, or None when the worker is given by rank (or not at all)."""
        return self._worker_name

    def rank(self) -> int | None:
        """The worker's rank, or None when the worker is given by name (or not at all)."""
        return self._rank

    def device(self) -> torch.device:
        """The device on that worker."""
        return self._device

    def __repr__(self) -> str:
        if self._worker_name is not None:
            return f"{self._worker_name}/{self._device}"
        if self._rank is not None:
            return f"rank:{self._rank}/{self._device}"
        return str(self._device)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _remote_device) and (
            (self._worker_name, self._device, self._rank)
            == (other._worker_name, other._device, other._rank))

    def __hash__(self) -> int:
        return hash((self._worker_name, self._device, self._rank))
