"""``torch.distributed.elastic.utils.data``: data helpers for jobs whose world size changes.

``ElasticDistributedSampler`` partitions a dataset from a start index, so that a job restarted
at another world size resumes where it stopped; ``CyclingIterator`` unrolls an iterator over
several epochs. Both behave as torch's classes do, index for index.
"""

from __future__ import annotations

from ringtorch.distributed.elastic.utils.data.cycling_iterator import CyclingIterator
from ringtorch.distributed.elastic.utils.data.elastic_distributed_sampler import (
    ElasticDistributedSampler,
)

__all__ = ["CyclingIterator", "ElasticDistributedSampler"]
