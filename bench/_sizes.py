"""Message sizes and bus-bandwidth factors shared by the collective benchmarks."""

from __future__ import annotations

UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3}


def parse_size(text: str) -> int:
    """'64K' -> 65536; a plain number is bytes."""
    text = text.strip().upper().removesuffix("B")
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def parse_sizes(text: str) -> list[int]:
    """'1K,1M' or '1K..64M' (every power of 4 from the first to the last)."""
    if ".." in text:
        lo, hi = (parse_size(part) for part in text.split(".."))
        sizes = []
        while lo <= hi:
            sizes.append(lo)
            lo *= 4
        return sizes
    return [parse_size(part) for part in text.split(",")]


def human(nbytes: int) -> str:
    """65536 -> '64K'."""
    for unit, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def busbw_factor(op: str, world_size: int) -> float:
    """nccl-tests' bus-bandwidth factor: all_reduce 2(n-1)/n, all_gather and reduce_scatter
    (n-1)/n of the whole buffer, broadcast 1."""
    if op == "all_reduce":
        return 2 * (world_size - 1) / world_size
    if op in ("all_gather", "reduce_scatter"):
        return (world_size - 1) / world_size
    return 1.0
