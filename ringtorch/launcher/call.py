"""A worker that runs a Python callable: ``python -m ringtorch.launcher.call PAYLOAD RESULTS``
(``start_method="spawn"``; with ``"fork"`` the forked worker calls :func:`call_and_store`
directly).

``elastic_launch(config, fn)(*args)`` starts one of these per rank. PAYLOAD, written by the
calling program in a private (0700) directory, holds two pickles: the standard library's
spawn preparation data (``sys.path``, the working directory, the caller's main module, which
is imported again as ``__mp_main__`` the way ``multiprocessing``'s spawn does it), then
``(fn, args)``. The worker calls ``fn(*args)`` under ``record`` (an exception lands in its
error file, and so in the caller's ``ChildFailedError``) and writes the pickled return value
to ``RESULTS/<global rank>`` by an atomic rename, where the caller reads it back. Nothing
arrives from the network: both files are written and read by the same user's processes.
"""

from __future__ import annotations

import multiprocessing.process
import multiprocessing.spawn
import os
import pickle
import sys
from typing import Any

from ringtorch._workers import record
from ringtorch.launcher.config import LOCAL_RANK_MACRO


def write_payload(path: str, fn: Any, args: tuple[Any, ...]) -> None:
    """Write what a worker needs to call ``fn(*args)`` as this process would (mode 0600).

    Raises:
        ValueError: ``fn`` or an argument cannot be pickled (a function typed into an
            interactive session, a lambda, an open socket...); the message says which.
    """
    prep = multiprocessing.spawn.get_preparation_data("elastic_launch worker")
    prep.pop("authkey", None)  # the workers need none: they talk to no multiprocessing manager
    try:
        call = pickle.dumps((fn, args))
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        raise ValueError(
            f"elastic_launch cannot send {name} and its arguments to the workers: {exc}. The "
            f"function must be importable by name (defined in a module, or at the top level "
            f"of the script that calls elastic_launch); a function typed into an interactive "
            f"session or a lambda is not: put it in a module") from exc
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        pickle.dump(prep, f)
        f.write(call)


def check_not_preparing() -> None:
    """Refuse to launch from a worker that is still importing the caller's main module.

    Raises:
        RuntimeError: the launching script calls elastic_launch at import time (no
            ``if __name__ == "__main__":``), which would make every worker launch again.
    """
    if getattr(multiprocessing.process.current_process(), "_inheriting", False):
        raise RuntimeError(
            "elastic_launch was called while a worker imported the launching script: the "
            "workers import that script again to find the function, so the launch must run "
            "only under 'if __name__ == \"__main__\":'")


def read_result(results_dir: str, rank: int) -> Any:
    """Rank ``rank``'s return value (None when it wrote none)."""
    path = os.path.join(results_dir, str(rank))
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return pickle.load(f)


def _call(payload: str, results_dir: str) -> None:
    with open(payload, "rb") as f:
        process = multiprocessing.process.current_process()
        process._inheriting = True  # type: ignore[attr-defined]  # as spawn's children do
        try:
            multiprocessing.spawn.prepare(pickle.load(f))
        finally:
            process._inheriting = False  # type: ignore[attr-defined]
        fn, args = pickle.load(f)
    call_and_store(fn, args, results_dir)


def call_and_store(fn: Any, args: tuple[Any, ...], results_dir: str) -> None:
    """In a worker: ``fn(*args)`` (``${local_rank}`` substituted in string arguments), its
    return value pickled to ``results_dir/<RANK>``."""
    local_rank = os.environ.get("LOCAL_RANK", "0")
    args = tuple(a.replace(LOCAL_RANK_MACRO, local_rank) if isinstance(a, str) else a
                 for a in args)
    result = fn(*args)
    rank = os.environ.get("RANK", "0")
    tmp = os.path.join(results_dir, f".{rank}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    os.replace(tmp, os.path.join(results_dir, rank))


def main(argv: list[str]) -> int:
    """Run the payload; 0 on success (an exception propagates: exit code 1, error file)."""
    if len(argv) != 2:
        print("usage: python -m ringtorch.launcher.call PAYLOAD RESULTS_DIR", file=sys.stderr)
        return 2
    record(_call)(*argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
