"""One comparison for the tests that run the same program under torch and ringtorch."""

from __future__ import annotations

from typing import Any

import torch


def assert_same(a: Any, b: Any, where: str) -> None:
    """``a`` (torch's result) and ``b`` (ringtorch's) are equal, recursively: same types,
    tensors of the same dtype, shape and bits, same keys and lengths."""
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where}: torch {a} vs ringtorch {b}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: torch {a!r} vs ringtorch {b!r}"
