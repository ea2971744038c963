"""PowerSGD gradient compression for DDP (Vogels et al., 2019), as torch's ``powerSGD_hook``.

Each gradient matrix M (n x m) of a bucket is sent as two thin factors: P = M Q (n x r),
summed over the group and orthonormalised, then Q = M^T P (m x r), averaged; every rank
rebuilds M ~= P Q^T. Tensors too small to gain (vectors, biases) are all-reduced as they are.
The rules kept, so that ranks stay identical and results match torch's bit for bit on the
same bucket layout: every random draw comes from the state's NumPy ``RandomState`` (the same
seeds in the same order as torch: one per bucket that needs a fresh Q), and Q is drawn with a
CPU generator seeded with it, as torch's ``torch.manual_seed`` inside ``fork_rng`` draws;
the arithmetic is torch's, op for op. The first ``start_powerSGD_iter`` iterations are plain
all-reduces. With error feedback, what compression lost is added back the next iteration.
Every collective starts on the thread that calls the hook, in bucket order: torch's hooks start
the P and Q all-reduces from ``then`` callbacks, which on CPU run when the previous collective
completes and so race the next bucket's hook (ranks can then pair different collectives);
here the hook waits for P's sum itself, and only the decompression runs in a callback.

Departures from torch 2.13, both where torch fails: ``batched_powerSGD_hook`` works (torch's
asserts that Q is a batch of matrices and never runs past its first compressed step), and it
pads a copy of the bucket instead of resizing DDP's buffer in place (a buffer in shared
memory cannot be resized).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ringtorch import distributed as dist
from ringtorch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
from ringtorch.distributed.algorithms.ddp_comm_hooks.default_hooks import GradBucket
from ringtorch.futures import collect_all

__all__ = ["PowerSGDState", "batched_powerSGD_hook", "powerSGD_hook"]

logger = logging.getLogger(__name__)


def _orthogonalize(matrices: torch.Tensor, epsilon: float = 0) -> None:
    """Make the columns of each matrix of a (batch, n, r) tensor orthonormal, in place.

    Gram-Schmidt for r <= 2 and for half precision (QR has no half kernels), QR otherwise.
    """
    if matrices.dim() != 3 or matrices.shape[2] > matrices.shape[1]:
        raise ValueError(f"expected a batch of tall matrices (batch, n, r) with r <= n, got "
                         f"shape {tuple(matrices.shape)}")
    rank = matrices.shape[2]
    if rank <= 2 or matrices.dtype in (torch.float16, torch.bfloat16):
        _gram_schmidt(matrices, epsilon)
    else:
        r_factor = torch.empty(matrices.shape[0], rank, rank, dtype=matrices.dtype,
                               device=matrices.device)
        torch.linalg.qr(matrices, out=(matrices, r_factor))


def _gram_schmidt(matrices: torch.Tensor, epsilon: float) -> None:
    columns = matrices.shape[2]
    for i in range(columns):
        col = matrices[:, :, i:i + 1]
        norm = torch.norm(col, dim=1, keepdim=True)
        # epsilon 0 divides by the bare norm (a zero column gives NaNs, as torch's does)
        col /= norm if epsilon == 0 else norm + epsilon
        if i + 1 < columns:
            rest = matrices[:, :, i + 1:]
            rest -= torch.sum(col * rest, dim=1, keepdim=True) * col


def _should_compress(num_rows: int, num_cols: int, matrix_approximation_rank: int,
                     min_compression_rate: float) -> tuple[bool, int, int]:
    """(worth compressing, elements before, elements after) for an n x m matrix: it is worth
    it when the factors are at least ``min_compression_rate`` times smaller."""
    uncompressed = num_rows * num_cols
    compressed = (num_rows + num_cols) * matrix_approximation_rank
    return compressed * min_compression_rate < uncompressed, uncompressed, compressed


def _report_compression_stats(bucket: GradBucket, state: PowerSGDState) -> None:
    if bucket.is_last() and state.iter >= state.next_stats_report:
        rate, before, after = state.compression_stats()
        logger.info("Compression stats: iter %s, total before compression %s, total after "
                    "compression %s, rate %s", state.iter, before, after, rate)
        state.next_stats_report = state.iter + state.compression_stats_logging_frequency


class PowerSGDState:
    """PowerSGD's hyperparameters and its per-bucket state (torch's class, same arguments).

    Args:
        process_group: the group to average over (None: the default group).
        matrix_approximation_rank: r, the rank of the factors; lower compresses more.
        start_powerSGD_iter: plain all-reduce until this iteration (at least 2 with error
            feedback or warm start, as in torch).
        min_compression_rate: compress a matrix only if its factors are this many times
            smaller; others are all-reduced as they are.
        use_error_feedback: add the previous iteration's compression error back.
        warm_start: start each iteration's Q from the previous one instead of a fresh draw.
        orthogonalization_epsilon: added to each column norm (avoids 0/0 on zero gradients).
        random_seed: seed of the draws of Q; every rank must use the same.
        compression_stats_logging_frequency: iterations between compression stats logs.
        batch_tensors_with_same_shape: compress same-shaped matrices as one batch.

    Raises:
        ValueError: ``start_powerSGD_iter <= 1`` with error feedback or warm start (torch's
            message), or ``matrix_approximation_rank < 1``.
    """

    __slots__ = ["process_group", "matrix_approximation_rank", "start_powerSGD_iter",
                 "min_compression_rate", "orthogonalization_epsilon", "use_error_feedback",
                 "warm_start", "batch_tensors_with_same_shape", "rng", "error_dict",
                 "p_memory_dict", "q_memory_dict", "iter", "total_numel_before_compression",
                 "total_numel_after_compression", "compression_stats_logging_frequency",
                 "next_stats_report"]

    def __init__(self, process_group: Any, matrix_approximation_rank: int = 1,
                 start_powerSGD_iter: int = 1_000, min_compression_rate: float = 2,
                 use_error_feedback: bool = True, warm_start: bool = True,
                 orthogonalization_epsilon: float = 0, random_seed: int = 0,
                 compression_stats_logging_frequency: int = 10_000,
                 batch_tensors_with_same_shape: bool = False) -> None:
        if matrix_approximation_rank < 1:
            raise ValueError(f"`matrix_approximation_rank` must be a positive integer, got "
                             f"{matrix_approximation_rank}")
        # The first iterations are plain all-reduces: error feedback and warm start keep
        # per-bucket tensors, which must not be made before DDP's buckets are final.
        if (use_error_feedback or warm_start) and start_powerSGD_iter <= 1:
            raise ValueError("Expect `start_powerSGD_iter` > 1 if `use_error_feedback` or "
                             "`warm_start` is enabled, because PowerSGD can only be applied "
                             "after the first two iterations in DDP.")
        self.process_group = process_group
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.orthogonalization_epsilon = orthogonalization_epsilon
        # The same seeds, in the same order, on every rank: the same projections everywhere.
        self.rng = np.random.RandomState(random_seed)
        self.error_dict: dict[int, torch.Tensor] = {}
        self.p_memory_dict: dict[int, torch.Tensor] = {}
        self.q_memory_dict: dict[int, torch.Tensor] = {}
        self.iter = 0
        self.total_numel_before_compression = 0
        self.total_numel_after_compression = 0
        self.compression_stats_logging_frequency = max(1, compression_stats_logging_frequency)
        self.next_stats_report = 0
        self.batch_tensors_with_same_shape = batch_tensors_with_same_shape

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the process group, which cannot be pickled (torch's behaviour)."""
        logger.warning("NOTE: Process group is not serializable and excluded from a saved state.")
        return {slot: getattr(self, slot) for slot in self.__slots__ if slot != "process_group"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore a saved state; its process group becomes the default group."""
        self.process_group = default._group(None)
        logger.warning("NOTE: Process group will be set to a default group (i.e. the world "
                       "size). If a different group is desired, please set "
                       "`self.process_group` after PowerSGD state is loaded.")
        for slot, value in state.items():
            setattr(self, slot, value)

    def maybe_increase_iter(self, bucket: GradBucket) -> None:
        """Count an iteration when its last bucket is processed."""
        if bucket.is_last():
            self.iter += 1
        if self.iter == self.start_powerSGD_iter:
            logger.info("Start to apply PowerSGD after %s iterations.", self.iter)

    def compression_stats(self) -> tuple[float, int, int]:
        """(compression rate, elements before compression, elements after), all so far."""
        after = self.total_numel_after_compression
        rate = self.total_numel_before_compression / after if after > 0 else 0
        return rate, self.total_numel_before_compression, after


def _add_error(state: PowerSGDState, index: int, tensor: torch.Tensor) -> torch.Tensor | None:
    """Add the bucket's remembered error to ``tensor``; return a copy of the result (what
    decompression is compared with), or None without error feedback."""
    if not state.use_error_feedback:
        return None
    if index in state.error_dict:
        tensor.add_(state.error_dict[index])
    else:
        state.error_dict[index] = torch.zeros_like(tensor)
    return tensor.detach().clone()


def _draw_q(state: PowerSGDState, qs: list[torch.Tensor]) -> None:
    """Fill ``qs`` from one fresh seed of the state's generator and orthonormalise them."""
    generator = torch.Generator().manual_seed(int(state.rng.randint(1_000_000_000)))
    for q in qs:
        q.copy_(torch.randn(*q.shape, generator=generator, dtype=q.dtype))
        _orthogonalize(q, state.orthogonalization_epsilon)


def powerSGD_hook(state: PowerSGDState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Compress each large gradient matrix of the bucket to rank ``r`` factors and average them.

    Three all-reduces per bucket: the uncompressed tensors, the P factors, the Q factors.
    The hook waits for the P factors' sum (Q is computed from it) and starts the other two
    asynchronously; every rank thus starts its collectives in the same order.

    Example::

        state = PowerSGDState(process_group=None, matrix_approximation_rank=1,
                              start_powerSGD_iter=10)
        ddp_model.register_comm_hook(state, powerSGD_hook)
    """
    group = default._group(state.process_group)
    world_size = dist.get_world_size(group)
    input_tensor = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return default._allreduce_fut(group, input_tensor)

    index = bucket.index()
    snapshot = _add_error(state, index, input_tensor)
    # Step 1: which matrices are worth compressing; the rest travel as they are.
    to_compress: list[torch.Tensor] = []
    uncompressed: list[torch.Tensor] = []
    p_numel = q_numel = 0
    for tensor in bucket.gradients():
        matrix = tensor.view(tensor.shape[0] if tensor.dim() else 1, -1)
        n, m = matrix.shape
        r = min(n, m, state.matrix_approximation_rank)
        worth, before, after = _should_compress(n, m, r, state.min_compression_rate)
        state.total_numel_before_compression += before
        if worth:
            to_compress.append(matrix)
            p_numel += n * r
            q_numel += m * r
            state.total_numel_after_compression += after
        else:
            uncompressed.append(tensor)
            state.total_numel_after_compression += before
    _report_compression_stats(bucket, state)
    flat_uncompressed = (torch.cat([t.reshape(-1) for t in uncompressed]) if uncompressed
                         else input_tensor.new_empty(0))

    # Step 2: P and Q live in two flat buffers per bucket (one all-reduce each), kept
    # between iterations with warm start.
    fresh_q = not state.warm_start or index not in state.p_memory_dict
    if fresh_q:
        state.p_memory_dict[index] = input_tensor.new_empty(p_numel)
        state.q_memory_dict[index] = input_tensor.new_empty(q_numel)
    by_shape: dict[torch.Size, list[torch.Tensor]] = defaultdict(list)
    for matrix in to_compress:
        by_shape[matrix.shape].append(matrix)
    batches = list(_batches(by_shape, state.batch_tensors_with_same_shape))
    ps, qs = _factor_views(state, index, batches)
    if fresh_q:
        _draw_q(state, qs)
    else:
        for q in qs:
            _orthogonalize(q, state.orthogonalization_epsilon)
    for batch, q, p in zip(batches, qs, ps, strict=True):
        torch.bmm(batch, q, out=p)

    # Step 3: the collectives, in the same order on every rank: all of them start on this
    # thread, in bucket order (a callback starting one would race the next bucket's hook).
    uncompressed_fut = dist.all_reduce(flat_uncompressed, group=group, async_op=True).get_future()
    # P is orthonormalised next, so its sum needs no division; it is needed now for Q
    dist.all_reduce(state.p_memory_dict[index], group=group)
    for p in ps:
        _orthogonalize(p, state.orthogonalization_epsilon)
    for batch, p, q in zip(batches, ps, qs, strict=True):
        torch.bmm(batch.transpose(1, 2), p, out=q)
    q_fut = dist.all_reduce(state.q_memory_dict[index], group=group, async_op=True).get_future()

    def decompress(both: torch.futures.Future[Any]) -> torch.Tensor:
        for fut in both.value():
            fut.value()  # raises the collective's error, if any
        flat_uncompressed.div_(world_size)
        offset = 0
        for tensor in uncompressed:
            tensor.copy_(flat_uncompressed[offset:offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()
        state.q_memory_dict[index].div_(world_size)
        for p, q, batch in zip(ps, qs, batches, strict=True):
            torch.bmm(p, q.transpose(1, 2), out=batch)
        if state.batch_tensors_with_same_shape:  # stacked copies go back to the bucket
            for batch in batches:
                if batch.shape[0] > 1:
                    for original, rebuilt in zip(by_shape[batch.shape[1:]], batch, strict=True):
                        original.copy_(rebuilt)
        if snapshot is not None:
            state.error_dict[index] = snapshot - input_tensor
        if not state.warm_start:  # this bucket's only: a later bucket's may be in use
            state.p_memory_dict.pop(index, None)
            state.q_memory_dict.pop(index, None)
        state.maybe_increase_iter(bucket)
        return input_tensor

    return collect_all([uncompressed_fut, q_fut]).then(decompress)


def _batches(by_shape: dict[torch.Size, list[torch.Tensor]], stack: bool
             ) -> Iterator[torch.Tensor]:
    """The (batch, n, m) tensors to compress: one per matrix, or one per shape if ``stack``
    (a single matrix stays a view of the bucket; a stack is a copy, written back later)."""
    for matrices in by_shape.values():
        if stack and len(matrices) > 1:
            yield torch.stack(matrices)
        elif stack:
            yield matrices[0].unsqueeze(0)
        else:
            yield from (m.unsqueeze(0) for m in matrices)


def _factor_views(state: PowerSGDState, index: int, batches: list[torch.Tensor]
                  ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Views of the bucket's flat P and Q buffers, one (batch, n, r) / (batch, m, r) each."""
    ps, qs = [], []
    p_at = q_at = 0
    for batch in batches:
        count, n, m = batch.shape
        r = min(n, m, state.matrix_approximation_rank)
        ps.append(state.p_memory_dict[index][p_at:p_at + count * n * r].view(count, n, r))
        qs.append(state.q_memory_dict[index][q_at:q_at + count * m * r].view(count, m, r))
        p_at += count * n * r
        q_at += count * m * r
    return ps, qs


def batched_powerSGD_hook(state: PowerSGDState, bucket: GradBucket
                          ) -> torch.futures.Future[torch.Tensor]:
    """PowerSGD on the whole bucket at once, seen as one square matrix padded with zeros.

    Faster than :func:`powerSGD_hook` (two all-reduces, one matrix), but the bucket's
    layout has no low-rank structure: use it with rank 1, and only if accuracy allows.

    Example::

        state = PowerSGDState(process_group=None, matrix_approximation_rank=1,
                              start_powerSGD_iter=10)
        ddp_model.register_comm_hook(state, batched_powerSGD_hook)
    """
    group = default._group(state.process_group)
    world_size = dist.get_world_size(group)
    input_tensor = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return default._allreduce_fut(group, input_tensor)

    numel = input_tensor.shape[0]
    side = math.ceil(math.sqrt(numel))
    rank = min(side, state.matrix_approximation_rank)
    state.total_numel_before_compression += numel
    state.total_numel_after_compression += side * rank * 2
    padded = input_tensor.new_zeros(side * side)
    padded[:numel] = input_tensor
    _report_compression_stats(bucket, state)
    index = bucket.index()
    snapshot = _add_error(state, index, padded)
    matrix = padded.view(side, side)
    if not state.warm_start or index not in state.p_memory_dict:
        state.p_memory_dict[index] = input_tensor.new_empty(side, rank)
        q = input_tensor.new_empty(side, rank)
        generator = torch.Generator().manual_seed(int(state.rng.randint(1_000_000_000)))
        q.copy_(torch.randn(side, rank, generator=generator, dtype=q.dtype))
        state.q_memory_dict[index] = q
    p, q = state.p_memory_dict[index], state.q_memory_dict[index]
    _orthogonalize(q.unsqueeze(0), state.orthogonalization_epsilon)
    torch.matmul(matrix, q, out=p)

    dist.all_reduce(p, group=group)  # needed now for Q (see powerSGD_hook: the order)
    _orthogonalize(p.unsqueeze(0), state.orthogonalization_epsilon)
    torch.matmul(matrix.t(), p, out=q)

    def decompress(fut: torch.futures.Future[Any]) -> torch.Tensor:
        fut.value()  # raises the collective's error, if any
        q.div_(world_size)
        torch.matmul(p, q.t(), out=matrix)
        if snapshot is not None:
            state.error_dict[index] = snapshot - padded
        if not state.warm_start:  # this bucket's only: a later bucket's may be in use
            state.p_memory_dict.pop(index, None)
            state.q_memory_dict.pop(index, None)
        input_tensor.copy_(padded[:numel])
        state.maybe_increase_iter(bucket)
        return input_tensor

    return dist.all_reduce(q, group=group, async_op=True).get_future().then(decompress)
