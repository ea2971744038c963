"""Bus bandwidth against message size, drawn from bench/collectives.py's JSON cells.

One panel per op, one line per (library, world size); both axes logarithmic. Needs
matplotlib (``pip install 'ringtorch[plot]'``); nothing else in bench/ does.
"""

from __future__ import annotations

from typing import Any

from _sizes import busbw_factor

NAMES = {"shm": "ringtorch shm", "sockets": "ringtorch sockets", "gloo": "torch gloo",
         "mpi": "Open MPI (mpi4py)", "ringtorch-mpi": "ringtorch MPI backend",
         "ringtorch-dist": "ringtorch facade"}


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def busbw_plot(cells: list[dict[str, Any]], path: str, ops: list[str] | None = None,
               title: str = "") -> None:
    """Write the figure for ``cells`` (dicts with op, world, bytes, lib, seconds) to ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plotting needs matplotlib: pip install 'ringtorch[plot]'") from None
    ops = ops or sorted({c["op"] for c in cells})
    fig, axes = plt.subplots(1, len(ops), figsize=(6 * len(ops), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops, strict=True):
        series: dict[tuple[str, int], list[tuple[int, float]]] = {}
        for c in cells:
            if c["op"] == op and c["seconds"]:
                bw = c["bytes"] / c["seconds"] * busbw_factor(op, c["world"]) / 1e9
                series.setdefault((c["lib"], c["world"]), []).append((c["bytes"], bw))
        libs = [lib for lib in NAMES if any(key[0] == lib for key in series)]
        for (lib, world), points in sorted(series.items(),
                                           key=lambda kv: (libs.index(kv[0][0]), kv[0][1])):
            points.sort()
            ax.plot(*zip(*points, strict=True), marker="o" if world == 2 else "s",
                    linestyle="-" if world == 2 else "--",
                    color=f"C{libs.index(lib)}", label=f"{NAMES[lib]}, world {world}")
        ax.set(xscale="log", yscale="log", xlabel="message size (bytes)",
               ylabel="bus bandwidth (GB/s)", title=f"{op}, float32" + (f" ({title})" if title
                                                                         else ""))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
