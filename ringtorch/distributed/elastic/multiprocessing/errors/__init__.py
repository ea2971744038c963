"""Error reporting from workers to the launcher, as ``torch.distributed.elastic.multiprocessing.errors``.

Decorate a worker's entry point with :func:`record`; when it raises, the exception and its
traceback are written as JSON to the file named by ``TORCHELASTIC_ERROR_FILE`` (which ringrun
sets for every worker), and ringrun's failure summary shows them. The file format is torch's,
so torchrun reads ringtorch's error files and ringrun reads torch's. The implementation is in
``ringtorch._workers.errorfile`` (no torch import).
"""

from __future__ import annotations

from ringtorch._workers.errorfile import (
    ChildFailedError,
    ErrorHandler,
    ProcessFailure,
    get_error_handler,
    record,
)

__all__ = ["ChildFailedError", "ErrorHandler", "ProcessFailure", "get_error_handler", "record"]
