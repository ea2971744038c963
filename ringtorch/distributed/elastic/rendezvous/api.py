"""``torch.distributed.elastic.rendezvous.api``: the same names as the package (see there);
the package's ``__all__`` is the one list of them."""

from __future__ import annotations

from ringtorch.distributed.elastic.rendezvous import *  # noqa: F403 - re-exported as torch does
from ringtorch.distributed.elastic.rendezvous import __all__  # noqa: F401 - the same names
