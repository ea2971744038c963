"""_buffers.byte_view: the bytes of any contiguous tensor, shared with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ringtorch._buffers import as_bytes, byte_view


@pytest.mark.parametrize("make", [
    lambda: torch.arange(6, dtype=torch.float32).reshape(2, 3),
    lambda: torch.tensor(3.0).expand(1),          # one element, stride 0 (autograd's grads)
    lambda: torch.tensor([[1.5]]).expand(1, 1),
    lambda: torch.tensor([1.0, -2.0], dtype=torch.bfloat16),
], ids=["2d", "expanded-scalar", "expanded-1x1", "bfloat16"])
def test_byte_view_gives_the_tensors_bytes(make) -> None:
    t = make()
    fresh = torch.empty(t.shape, dtype=t.dtype).copy_(t)  # new memory, strides (.., 1)
    want = fresh.view(-1).view(torch.uint8).numpy().tobytes()
    assert bytes(byte_view(t)) == want


def test_byte_view_shares_memory_with_the_tensor() -> None:
    t = torch.zeros(4, dtype=torch.int32)
    np.frombuffer(byte_view(t), dtype=np.int32)[:] = 0  # readable as the tensor's dtype
    view = byte_view(t)
    view[0:4] = np.int32(7).tobytes()
    assert t[0].item() == 7


def test_byte_view_refuses_a_non_contiguous_tensor() -> None:
    with pytest.raises(ValueError, match="byte_view needs a contiguous tensor"):
        byte_view(torch.zeros(4, 4).t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_reaching_a_tensors_bytes_leaves_its_storage_resizable(dtype: torch.dtype,
                                                               requires_grad: bool) -> None:
    # torch's FSDP frees the storage it gathered into by resizing it to 0: a tensor that went
    # through a collective must stay resizable, as it does through gloo (numpy() would not)
    for reach in (as_bytes, byte_view):
        t = torch.zeros(4, dtype=dtype, requires_grad=requires_grad and dtype.is_floating_point)
        view = reach(t)
        assert len(bytes(view)) == t.nbytes
        del view
        t.untyped_storage().resize_(0)
        assert t.untyped_storage().nbytes() == 0


def test_as_bytes_writes_through_to_a_parameter_and_keeps_it_alive() -> None:
    p = torch.nn.Parameter(torch.ones(3))
    view = as_bytes(p)
    del p  # the array keeps the tensor (and its memory) alive
    view[:4] = np.array([5.0], dtype=np.float32).view(np.uint8)
    assert view.base.tensor.tolist() == [5.0, 1.0, 1.0]


def test_as_bytes_refuses_a_tensor_whose_bits_say_its_memory_is_not_its_values() -> None:
    for t in (torch.ones(2, dtype=torch.complex64).conj(), torch.ones(2)._neg_view()):
        with pytest.raises(RuntimeError, match=r"a tensor with its conjugate or negative bit set "
                                               r"has no plain bytes: call resolve_conj\(\) / "
                                               r"resolve_neg\(\) on it first"):
            as_bytes(t)
