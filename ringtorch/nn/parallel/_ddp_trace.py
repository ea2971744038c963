"""What DDP shows on the timeline (ringtorch.distributed.trace): one iteration's backward and
its buckets, so that the overlap of communication with backward can be seen.

The Reducer makes a ``BackwardTrace`` per iteration only while tracing is on (otherwise its
hooks test one attribute and go on) and tells it: the first gradient is ready (backward, as DDP
sees it, begins), bucket ``b`` is ready, is launched, its reduction completed, and backward
ended (autograd ran DDP's final callback) and the averages are written. Spans:

* ``backward``: first gradient hook -> final callback, on the thread that ran backward;
* ``bucket b ready`` (a moment) and ``bucket b all_reduce`` (launch -> reduced, an interval of
  its own: buckets overlap each other and backward);
* ``finalize``: the final callback waiting for the buckets and writing the gradients.
"""

from __future__ import annotations

import threading
from typing import Any

from ringtorch.distributed import trace


class BackwardTrace:
    """One iteration's DDP events (see the module docstring)."""

    def __init__(self, sizes: list[int]) -> None:
        self._sizes = sizes  # bytes of each bucket
        self._begun = 0
        self._thread = 0
        self._ended = 0
        self._launch: dict[int, int] = {}

    @classmethod
    def if_tracing(cls, buckets: list[Any]) -> BackwardTrace | None:
        """A new one for ``buckets`` (the Reducer's, each with its ``buffer``) while tracing
        is on, else None (one check: the Reducer calls this every iteration)."""
        if not trace.enabled():
            return None
        return cls([bucket.buffer.nbytes for bucket in buckets])

    def begin(self) -> None:
        """The first gradient of the iteration is ready."""
        self._begun = trace.now()
        self._thread = threading.get_native_id()

    def bucket_ready(self, b: int) -> None:
        trace.instant("ddp", f"bucket {b} ready", nbytes=self._sizes[b])

    def launching(self, b: int) -> None:
        self._launch[b] = trace.now()

    def launched(self, b: int, pending: Any) -> None:
        """Bucket ``b``'s reduction was issued; ``pending`` completes with it (a _Pending of
        a Work or a Future; None: it completed already)."""
        start = self._launch.get(b, trace.now())

        def done(_: Any = None) -> None:
            trace.async_span("ddp", f"bucket {b} all_reduce", start, trace.now(),
                             bucket=b, nbytes=self._sizes[b])

        if pending is None:
            done()
            return
        future = pending.future if pending.future is not None else pending.work.get_future()
        future.add_done_callback(done)

    def end(self) -> None:
        """Autograd ran DDP's final callback: backward is over."""
        self._ended = trace.now()
        if not self._begun:
            return
        if threading.get_native_id() == self._thread:
            trace.span("ddp", "backward", self._begun, self._ended)
        else:
            trace.async_span("ddp", "backward", self._begun, self._ended)

    def finalized(self) -> None:
        """Every bucket is reduced and the gradients written."""
        trace.span("ddp", "finalize", self._ended, trace.now())


__all__ = ["BackwardTrace"]
