"""``python -m ringtorch.distributed.launch``: the legacy ``torch.distributed.launch`` command.

ringrun's flags plus ``--use-env``/``--use_env``. Without ``--use-env`` each worker gets
``--local_rank=N`` as its first script argument (the spelling scripts written for
``torch.distributed.launch`` parse: ``parser.add_argument("--local_rank", type=int)``);
with it, only the LOCAL_RANK environment variable. Every worker gets MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE either way. As in torch, the
command is deprecated in favour of ``ringrun`` and says so (a FutureWarning).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence

from ringtorch.distributed.run import EXIT_USAGE, get_args_parser, run
from ringtorch.launcher.agent import say

LEGACY_LOCAL_RANK_ARG = "--local_rank"

_DEPRECATION = (
    "The module ringtorch.distributed.launch is deprecated\n"
    "and will be removed in future. Use ringrun (python -m ringtorch.distributed.run).\n"
    "Note that --use-env is set by default in ringrun.\n"
    "If your script expects `--local_rank` argument to be set, please\n"
    "change it to read from `os.environ['LOCAL_RANK']` instead.\n"
)


def parse_args(args: Sequence[str] | None = None) -> argparse.Namespace:
    """ringrun's flags plus --use-env."""
    parser = get_args_parser(prog="python -m ringtorch.distributed.launch")
    parser.add_argument("--use-env", "--use_env", default=False, action="store_true",
                        help="Pass the local rank in LOCAL_RANK only, not as --local_rank.")
    return parser.parse_args(args)


def launch(args: argparse.Namespace) -> int:
    """Launch the job; the exit code."""
    if args.no_python and not args.use_env:
        say("error: When using the '--no-python' flag, you must also set the '--use-env' flag.")
        return EXIT_USAGE
    return run(args, use_env=args.use_env, local_rank_arg=LEGACY_LOCAL_RANK_ARG)


def main(args: Sequence[str] | None = None) -> int:
    """The legacy launcher's entry point; returns the exit code."""
    warnings.warn(_DEPRECATION, FutureWarning, stacklevel=2)
    return launch(parse_args(args))


if __name__ == "__main__":
    sys.exit(main())
