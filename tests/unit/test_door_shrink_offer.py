"""ringtorch.c10d.shrink_group on a torch without torch.distributed.shrink_group: refused at
once, before any argument is looked at (the GPU machine's torch may lack it)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist

import ringtorch.c10d


def test_a_torch_without_shrink_group_is_offered_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(dist, "shrink_group")
    message = (f"torch {torch.__version__} has no shrink_group: shrinking a group needs a "
               f"torch that offers it")
    with pytest.raises(NotImplementedError, match=f"^{re.escape(message)}$"):
        ringtorch.c10d.shrink_group([1])
