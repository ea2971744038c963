"""``python -m ringtorch.distributed.run`` and the ``ringrun`` console script: torchrun's place.

Flags, defaults and messages are torchrun's; the code is ``ringtorch.launcher.cli`` (also runnable
as ``python -m ringtorch.launcher``, which skips importing torch), re-exported here under
torch.distributed.run's names. This module does not import torch; ``ringtorch.distributed``,
imported first by ``python -m``, does, as torch's own launcher does.
"""

from __future__ import annotations

import sys

from ringtorch.launcher.cli import (
    EXIT_USAGE,
    check_env,
    config_from_args,
    env,
    get_args_parser,
    main,
    parse_args,
    run,
    worker_command,
)

__all__ = ["EXIT_USAGE", "check_env", "config_from_args", "env", "get_args_parser", "main",
           "parse_args", "run", "worker_command"]

if __name__ == "__main__":
    sys.exit(main())
