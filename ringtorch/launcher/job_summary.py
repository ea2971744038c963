"""What ringrun prints when a job ends: each rank's time in collectives, the bytes they carried
and the slowest rank of each collective.

The ranks leave their running totals in the attempt's observe folder
(``RINGTORCH_OBSERVE_DIR``, ``summary-<rank>.json``); this module reads those of the last
attempt and prints them merged (``ringtorch/_observe/summary.py`` does the merging). Each
node's launcher prints the part of its own ranks: the files are local, and gathering them
through the rendezvous store would make the end of a job wait on the slowest node. A rank
that left no file (killed before its first write, or not a ringtorch program) is named; a job
where no rank left one prints nothing, so plain programs run under ringrun look as before.
On by default; ``--no-summary`` turns it off.
"""

from __future__ import annotations

from ringtorch._observe.summary import format_summary, read_summaries
from ringtorch.launcher.config import LaunchConfig
from ringtorch.launcher.messages import say
from ringtorch.launcher.workers import LocalWorkerGroup


def job_summary(config: LaunchConfig, group: LocalWorkerGroup) -> str:
    """The summary of ``group``'s ranks ("" when off or when no rank left its totals)."""
    if not config.summary:
        return ""
    found, problems = read_summaries(group.observe_dir)
    base = group.assignment.base_global_rank
    expected = list(range(base, base + config.nproc_per_node))
    return format_summary(found, expected, problems)


def print_job_summary(config: LaunchConfig, group: LocalWorkerGroup, embedded: bool) -> None:
    """Print the summary on stderr, unless the launcher runs inside the user's program
    (``elastic_launch``: its caller prints what it wants)."""
    text = "" if embedded else job_summary(config, group)
    if text:
        say(text)


__all__ = ["job_summary", "print_job_summary"]
