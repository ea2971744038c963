"""DDP communication hooks: torch's ``ddp_comm_hooks.default_hooks``, over ringtorch.distributed.

A hook is ``hook(state, bucket: GradBucket) -> torch.futures.Future[Tensor]``; DDP calls it
once per bucket as soon as the bucket's gradients are ready and copies the future's tensor
back into the gradients at the end of backward. The rule every hook here keeps: the value is
the mean over the group (it divides by the group size before the sum, which also keeps fp16
from overflowing). ``state`` is the process group to use, or None for the default group.

``ringtorch.nn.parallel.comm_hooks`` re-exports these names (the path ringtorch had first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ringtorch import distributed as dist
from ringtorch.distributed import GradBucket

__all__ = ["allreduce_hook", "bf16_compress_hook", "bf16_compress_wrapper",
           "fp16_compress_hook", "fp16_compress_wrapper"]

Hook = Callable[[Any, "GradBucket"], "torch.futures.Future[torch.Tensor]"]


def _group(process_group: Any) -> Any:
    """The group a hook reduces over: ``process_group``, or the default group for None.

    Raises:
        ValueError: this rank is not in ``process_group`` (torch's hooks fail later, on a
            None Work), or there is no default group.
    """
    if isinstance(process_group, int) and process_group == dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(f"The communication hook was given a process group that rank "
                         f"{dist.get_rank()} is not a member of (new_group returns "
                         f"GroupMember.NON_GROUP_MEMBER outside the group); give each rank "
                         f"a group it belongs to")
    if process_group is not None:
        return process_group
    if dist.group.WORLD is None:
        raise ValueError("Default process group has not been initialized, please make sure to "
                         "call init_process_group.")
    return dist.group.WORLD


def _value_of(value: Any) -> Any:
    """The single tensor of a collective's result (a list of one tensor, or the tensor)."""
    return value[0] if isinstance(value, (list, tuple)) else value


def _value(fut: torch.futures.Future[Any]) -> torch.Tensor:
    """The single tensor a collective's future holds."""
    return _value_of(fut.value())


def _allreduce_fut(process_group: Any, tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """Average ``tensor`` in place over the group; the future holds it."""
    group = _group(process_group)
    tensor.div_(dist.get_world_size(group))
    work = dist.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(_value)


def allreduce_hook(process_group: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """All-reduce the bucket and average it: the same result as DDP without a hook.

    Example::

        ddp_model.register_comm_hook(None, allreduce_hook)
    """
    return _allreduce_fut(process_group, bucket.buffer())


def _compress_hook(dtype: torch.dtype, process_group: Any, bucket: GradBucket
                   ) -> torch.futures.Future[torch.Tensor]:
    group = _group(process_group)
    buffer = bucket.buffer()
    compressed = buffer.to(dtype).div_(dist.get_world_size(group))

    def decompress(fut: torch.futures.Future[Any]) -> torch.Tensor:
        buffer.copy_(_value(fut))  # in place: no second full-size buffer
        return buffer

    work = dist.all_reduce(compressed, group=group, async_op=True)
    return work.get_future().then(decompress)


def fp16_compress_hook(process_group: Any, bucket: GradBucket
                       ) -> torch.futures.Future[torch.Tensor]:
    """Send the bucket as float16 (half the bytes), divided by the group size, then cast back.

    Example::

        ddp_model.register_comm_hook(None, fp16_compress_hook)
    """
    return _compress_hook(torch.float16, process_group, bucket)


def bf16_compress_hook(process_group: Any, bucket: GradBucket
                       ) -> torch.futures.Future[torch.Tensor]:
    """Send the bucket as bfloat16, divided by the group size, then cast back.

    Unlike torch, which needs NCCL 2.10 for this, ringtorch reduces bfloat16 on the CPU.
    """
    return _compress_hook(torch.bfloat16, process_group, bucket)


def _compress_wrapper(dtype: torch.dtype, hook: Hook) -> Hook:
    def wrapper_hook(hook_state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        original = bucket.buffer()
        bucket.set_buffer(original.to(dtype))
        fut = hook(hook_state, bucket)

        def decompress(fut: torch.futures.Future[Any]) -> torch.Tensor:
            original.copy_(_value(fut))
            return original

        return fut.then(decompress)

    return wrapper_hook


def fp16_compress_wrapper(hook: Hook) -> Hook:
    """Run ``hook`` on a float16 copy of the bucket and cast its result back.

    ``fp16_compress_hook`` is ``fp16_compress_wrapper(allreduce_hook)``; the wrapper also
    compresses PowerSGD's factors: ``fp16_compress_wrapper(powerSGD_hook)``.
    """
    wrapped = _compress_wrapper(torch.float16, hook)
    wrapped.__name__ = "fp16_compress_wrapper_hook"
    return wrapped


def bf16_compress_wrapper(hook: Hook) -> Hook:
    """Run ``hook`` on a bfloat16 copy of the bucket and cast its result back."""
    wrapped = _compress_wrapper(torch.bfloat16, hook)
    wrapped.__name__ = "bf16_compress_wrapper_hook"
    return wrapped
