"""``torch.distributed.elastic.timer``: expiration timers that kill a stuck worker.

A worker wraps a block that may hang in ``with expires(after=60):``; its client tells a timer
server on the same host (in the launching process) when the block starts and ends. If the
block has not ended ``after`` seconds later, the server kills the worker: ``LocalTimerServer``
(requests over a ``multiprocessing`` queue) with SIGKILL, ``FileTimerServer`` (requests as JSON
lines over a named pipe, from any process on the host) with the signal the client named, and
then itself with the same signal, as torch's does. The launcher sees a failed worker and
restarts or stops the job.

Usage::

    import multiprocessing as mp
    import ringtorch.distributed.elastic.timer as timer

    queue = mp.get_context("spawn").Queue()
    server = timer.LocalTimerServer(queue, max_interval=0.01)
    server.start()  # a watchdog thread; start workers with ``queue`` as an argument

    def trainer(queue):
        timer.configure(timer.LocalTimerClient(queue))
        with timer.expires(after=60):  # killed if this takes more than 60 s
            train_one_epoch()
"""

from __future__ import annotations

from ringtorch.distributed.elastic.timer.api import (
    TimerClient,
    TimerRequest,
    TimerServer,
    configure,
    expires,
)
from ringtorch.distributed.elastic.timer.file_based_local_timer import (
    FileTimerClient,
    FileTimerRequest,
    FileTimerServer,
)
from ringtorch.distributed.elastic.timer.local_timer import LocalTimerClient, LocalTimerServer

__all__ = ["FileTimerClient", "FileTimerRequest", "FileTimerServer", "LocalTimerClient",
           "LocalTimerServer", "TimerClient", "TimerRequest", "TimerServer", "configure",
           "expires"]
