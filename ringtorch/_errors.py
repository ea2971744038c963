"""The error family of ringtorch, named as torch.distributed names its errors.

torch defines ``DistError`` (a ``RuntimeError``) and its children ``DistBackendError``,
``DistNetworkError``, ``DistStoreError`` and ``QueueEmptyError``. ringtorch's lower layers
(wire, store, rendezvous) must not import torch, which costs over a second to import, so the
family is defined here with the same names and the same bases: ``except RuntimeError`` and
``except dist.DistStoreError`` (with ``dist`` being ``ringtorch.distributed``) keep working.
Every layer may import this module.
"""

from __future__ import annotations


class DistError(RuntimeError):
    """Base of every error ringtorch raises for a distributed failure."""


class DistBackendError(DistError):
    """A collective or point-to-point operation failed (peer died, mismatch, timeout)."""


class DistNetworkError(DistError):
    """A connection could not be made or broke: the message names the peer."""


class PeerLostError(DistBackendError, DistNetworkError):
    """An operation of a group failed because a connection to a peer broke: the peer's
    process exited (known dead) or the network to its host failed (unreachable). The message
    names the peer, its host, the group and the operation, and says which of the two it was.

    Both a ``DistNetworkError`` (torch's name for a broken connection) and a
    ``DistBackendError`` (what a failed collective raises), so either ``except`` catches it.
    """


class DistStoreError(DistError):
    """A store operation failed or timed out: the message names the keys and the timeout."""


class QueueEmptyError(DistStoreError):
    """``queue_pop(block=False)`` found the queue empty."""


__all__ = ["DistBackendError", "DistError", "DistNetworkError", "DistStoreError", "PeerLostError",
           "QueueEmptyError"]
