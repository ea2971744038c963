"""The join context manager under its former path; it lives in ringtorch.distributed.algorithms.join.

Kept so that programs written against earlier ringtorch releases keep importing; it holds no
code of its own, so both paths name the same classes.
"""

from __future__ import annotations

from ringtorch.distributed.algorithms.join import Join, Joinable, JoinHook

__all__ = ["Join", "JoinHook", "Joinable"]
