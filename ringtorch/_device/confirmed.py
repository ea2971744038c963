"""Which recorded GPU run confirmed each device feature; until one has, the feature is closed.

A feature built and tested on the simulated runtime reaches users only once a run of
``scripts/gpu_check.sh`` on a real GPU has passed its checks, and that run is recorded in
``docs/gpu.md`` under "Recorded runs" (device, date, command, versions, passed/failed/
deselected counts). A feature is opened only in the commit that records its run, by naming
the run's heading here; ``tests/architecture/test_gpu_confirmed.py`` fails if a name here is
not recorded there. Until then users get today's behaviour and messages (CUDA tensors
rejected, ``is_nccl_available()`` False).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Feature:
    """A device feature and the recorded run that confirmed it (None: not confirmed)."""

    name: str
    what: str
    confirmed_by: str | None = None


FEATURES: tuple[Feature, ...] = (
    Feature("cuda_runtime", "the device seam on CUDA: streams, events, pinned copies, "
                            "IPC buffers and interprocess events"),
    Feature("nccl_binding", "NCCL through ctypes: communicators and all_reduce on a GPU"),
    Feature("cuda_tensors", "collectives, p2p and object collectives accept CUDA tensors, "
                            "staged through pinned host memory in stream order"),
    Feature("ipc_collectives", "ranks of one host exchange device memory by IPC, also when "
                               "they share one GPU"),
    Feature("nccl_backend", 'backend "nccl" and the backend map "cpu:gloo,cuda:nccl"'),
    Feature("gpu_training", "DistributedDataParallel and DataParallel on GPUs, RPC device maps"),
)


def confirmed(name: str) -> bool:
    """Whether the feature ``name`` has a recorded GPU run (and may be opened to users).

    Raises:
        KeyError: no feature has that name.
    """
    for feature in FEATURES:
        if feature.name == name:
            return feature.confirmed_by is not None
    raise KeyError(f"no device feature named {name!r}; known: "
                   f"{', '.join(feature.name for feature in FEATURES)}")
