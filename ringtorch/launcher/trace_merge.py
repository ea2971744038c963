"""ringrun's side of the timeline: tell the workers to trace, merge their files at the end.

With ``--trace DIR`` (or ``RINGTORCH_TRACE=DIR`` in the launcher's environment) every worker
gets ``RINGTORCH_TRACE=DIR`` and writes ``trace-<rank>.json`` into its attempt's observe
folder (``RINGTORCH_OBSERVE_DIR``); when the attempt's workers have ended, the launcher
merges those files into ``DIR/trace.json`` (a later attempt, after a restart, replaces it).
On a job of several nodes each node's launcher merges the ranks it ran: node 0 into
``DIR/trace.json``, node N into ``DIR/trace-nodeN.json``; all are on rank 0's clock, so
``python -m ringtorch.distributed.trace DIR`` on a folder holding them joins them into one.

Example::

    ringrun --nproc-per-node 2 --trace /tmp/tl train.py    # then open /tmp/tl/trace.json
"""

from __future__ import annotations

import os

from ringtorch import _config
from ringtorch._observe import trace_merge
from ringtorch.launcher.config import LaunchConfig
from ringtorch.launcher.messages import say


def trace_dir(config: LaunchConfig) -> str:
    """The folder the timeline goes to ("" when the job is not traced)."""
    return config.trace_dir or _config.TRACE.get()


def worker_env(config: LaunchConfig) -> dict[str, str]:
    """What a worker's environment needs for tracing (nothing when the job is not traced)."""
    directory = trace_dir(config)
    return {_config.TRACE.name: os.path.abspath(directory)} if directory else {}


def merge_attempt(config: LaunchConfig, observe_dir: str, node: int) -> str | None:
    """Merge the ranks' trace files of one attempt (``observe_dir``) into the trace folder;
    the merged file's path, or None (not traced, or no rank wrote a file)."""
    directory = trace_dir(config)
    if not directory:
        return None
    os.makedirs(directory, exist_ok=True)
    name = trace_merge.MERGED_NAME if node == 0 else trace_merge.node_file_name(node)
    path, ranks = trace_merge.merge_directory(observe_dir, os.path.join(directory, name))
    if path is None:
        say(f"no timeline: no worker wrote a trace file (into {observe_dir})")
        return None
    say(f"timeline of ranks {_ranks_text(ranks)}: {path}")
    return path


def _ranks_text(ranks: list[int]) -> str:
    if ranks and ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


__all__ = ["merge_attempt", "trace_dir", "worker_env"]
