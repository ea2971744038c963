"""``python -m ringtorch.distributed.launch``: the legacy ``torch.distributed.launch`` command.

ringrun's flags plus ``--use-env``/``--use_env``. Without ``--use-env`` each worker gets
``--local_rank=N`` as its first script argument (the spelling scripts written for
``torch.distributed.launch`` parse: ``parser.add_argument("--local_rank", type=int)``);
with it, only the LOCAL_RANK environment variable. Every worker gets MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE either way. As in torch, the
command is deprecated in favour of ``ringrun`` and says so (a FutureWarning). The code is in
``ringtorch.launcher.cli``.
"""

from __future__ import annotations

import sys

from ringtorch.launcher.cli import LEGACY_LOCAL_RANK_ARG
from ringtorch.launcher.cli import legacy_launch as launch
from ringtorch.launcher.cli import legacy_main as main
from ringtorch.launcher.cli import parse_legacy_args as parse_args

__all__ = ["LEGACY_LOCAL_RANK_ARG", "launch", "main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
