"""``torch.distributed.argparse_util``: argparse actions whose default comes from the
environment (``env``: from ``PET_<DEST>``; ``check_env``: a flag also set by ``PET_<DEST>=1``),
the ones torchrun's flags use. The code is ringrun's (``ringtorch.launcher.cli``).
"""

from __future__ import annotations

from ringtorch.launcher.cli import check_env, env

__all__ = ["check_env", "env"]
