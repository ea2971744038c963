"""Whether a group member's process still lives, as far as this host can tell.

Each member of a group records its host identity and process id in the group's store when the
group is made (``register``). A survivor that must decide who is gone (shrink_group's agreement)
asks ``probe``: a member on this host whose process has exited (or is a zombie) is known dead;
one whose process exists is alive, even when stopped (SIGSTOP) or busy; a member on another host
cannot be probed from here (None), and only its silence within the agreement's wait counts.
The rule kept: ``probe`` never calls a live process dead.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ringtorch._wire.mesh import host_identity

_KEY = "rt_proc/{rank}"


def register(store: Any, rank: int) -> None:
    """Record this process (host identity and pid) as ``rank`` of the group behind ``store``."""
    store.set(_KEY.format(rank=rank), json.dumps({"host": host_identity(), "pid": os.getpid()}))


def probe(store: Any, rank: int) -> bool | None:
    """True: ``rank``'s process is alive; False: it has exited; None: it cannot be told from
    this host (another host, or it never registered)."""
    key = _KEY.format(rank=rank)
    if not store.check([key]):
        return None
    info = json.loads(store.get(key))
    if info["host"] != host_identity():
        return None
    return _process_alive(int(info["pid"]))


def _process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return False
    except OSError:
        return True  # exists but unreadable: never call a live process dead
    # the state follows the command name, which is in parentheses and may hold spaces
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")


__all__ = ["probe", "register"]
