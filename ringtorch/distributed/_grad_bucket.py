"""GradBucket: what a DDP communication hook sees of one bucket of gradients.

torch's ``dist.GradBucket`` (public methods ``index``, ``buffer``, ``gradients``,
``parameters``, ``is_last``, ``set_buffer``). It lives here, below ``ringtorch.nn``, so that
``ringtorch.distributed`` exports it where torch does and hooks written against
``dist.GradBucket`` (``ringtorch.distributed.algorithms``) can name it; DDP's reducer
(``ringtorch.nn.parallel.reducer``) builds one per bucket and passes it to the hook. It holds
tensors only and imports nothing of ringtorch.
"""

from __future__ import annotations

import torch

__all__ = ["GradBucket"]


class GradBucket:
    """What a communication hook sees of one bucket (torch's ``dist.GradBucket``)."""

    def __init__(self, index: int, buffer: torch.Tensor, gradients: list[torch.Tensor],
                 parameters: list[torch.Tensor], is_last: bool) -> None:
        self._index = index
        self._buffer = buffer
        self._gradients = gradients
        self._parameters = parameters
        self._is_last = is_last
        self._views_of = buffer  # the buffer that _gradients view (laid out in order)

    def index(self) -> int:
        """The bucket's position in launch order; bucket 0 holds the last layers' gradients."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat 1-D tensor of this bucket's gradients (not divided by the world size)."""
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        """Each parameter's gradient: a view of :meth:`buffer` shaped like the parameter.

        Views of the current buffer, as torch's: after :meth:`set_buffer` they view the new
        one (a hook wrapped in ``fp16_compress_wrapper`` sees float16 gradients).
        """
        if self._views_of is not self._buffer:
            offset, views = 0, []
            for grad in self._gradients:
                views.append(self._buffer[offset:offset + grad.numel()].view(grad.shape))
                offset += grad.numel()
            self._gradients, self._views_of = views, self._buffer
        return self._gradients

    def parameters(self) -> list[torch.Tensor]:
        """The parameters whose gradients are in this bucket, in the buffer's order."""
        return self._parameters

    def is_last(self) -> bool:
        """True for the last bucket launched in the iteration."""
        return self._is_last

    def set_buffer(self, buffer: torch.Tensor) -> None:
        """Replace the buffer the next stage of a hook chain sees (e.g. a compressed copy)."""
        self._buffer = buffer
