"""``python -m ringtorch.launcher``: ringrun without importing torch (see cli.py)."""

from __future__ import annotations

import sys

from ringtorch.launcher.cli import main

if __name__ == "__main__":
    sys.exit(main())
