"""The launcher agent behind ``ringrun`` and ``python -m ringtorch.distributed.launch``.

One agent per node: it agrees with the other nodes on ranks (static node ranks, or a
dynamic rendezvous through the store), starts the local workers with torchrun's
environment, watches them, restarts the group or gives up, and never leaves a process of
the job behind. Imports the store, the rendezvous helpers and ``_workers``; never torch.
"""

from __future__ import annotations

from ringtorch.launcher.agent import Agent, launch
from ringtorch.launcher.config import (
    LOCAL_RANK_MACRO,
    LaunchConfig,
    LaunchConfigError,
    Std,
    parse_endpoint,
    parse_nnodes,
    parse_rdzv_conf,
    parse_signals,
    parse_std,
    resolve_nproc_per_node,
)
from ringtorch.launcher.decisions import Action, GroupState, Observation, decide
from ringtorch.launcher.node_rendezvous import (
    NodeRendezvous,
    RendezvousClosedError,
    RendezvousError,
)
from ringtorch.launcher.workers import Assignment, worker_env

__all__ = [
    "LOCAL_RANK_MACRO",
    "Action",
    "Agent",
    "Assignment",
    "GroupState",
    "LaunchConfig",
    "LaunchConfigError",
    "NodeRendezvous",
    "Observation",
    "RendezvousClosedError",
    "RendezvousError",
    "Std",
    "decide",
    "launch",
    "parse_endpoint",
    "parse_nnodes",
    "parse_rdzv_conf",
    "parse_signals",
    "parse_std",
    "resolve_nproc_per_node",
    "worker_env",
]
