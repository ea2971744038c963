"""Draw a merged ringtorch timeline (trace.json) as a PNG, for docs where no browser runs.

Perfetto and chrome://tracing are the tools to read a timeline; this draws the same picture
with matplotlib (``pip install 'ringtorch[plot]'``) so that docs/img/timeline.png can be made
on a machine without a browser. One row per rank and thread (complete events as bars), one
per rank for what is in flight (async slices: DDP buckets, RPC calls; overlapping ones stacked),
instants as ticks. ``--window last-backward`` shows the last DDP backward and its buckets.

    python scripts/draw_timeline.py DIR/trace.json docs/img/timeline.png
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from typing import Any

COLORS = {"collective": "#4c72b0", "p2p": "#8172b2", "rpc": "#937860", "ddp": "#55a868",
          "user": "#c44e52"}
BACKWARD_COLOR = "#dd8452"


def _async_spans(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    begins = {}
    spans = []
    for e in events:
        key = (e["pid"], e.get("cat"), e["name"], e.get("id"))
        if e["ph"] == "b":
            begins[key] = e
        elif e["ph"] == "e" and key in begins:
            b = begins.pop(key)
            spans.append({"pid": e["pid"], "cat": b.get("cat"), "name": b["name"],
                          "ts": b["ts"], "end": e["ts"]})
    return spans


def _window(events: list[dict[str, Any]], margin_us: float) -> tuple[float, float]:
    backwards = [e for e in events if e["ph"] == "X" and e["name"] == "backward"]
    if not backwards:
        stamps = [e["ts"] for e in events if e["ph"] != "M"]
        return min(stamps), max(stamps)
    last_start = max(e["ts"] for e in backwards)
    step = [e for e in backwards if e["ts"] >= last_start - 5_000]
    ends = [e["ts"] + e["dur"] for e in events if e["ph"] == "X" and e["name"] == "finalize"
            and e["ts"] >= last_start - 5_000]
    return (min(e["ts"] for e in step) - margin_us,
            max(ends or [e["ts"] + e["dur"] for e in step]) + margin_us)


def _lanes(spans: list[dict[str, Any]]) -> list[int]:
    """Greedy stacking: each span takes the first lane free at its start."""
    ends: list[float] = []
    out = []
    for span in spans:
        for lane, end in enumerate(ends):
            if end <= span["ts"]:
                ends[lane] = span["end"]
                out.append(lane)
                break
        else:
            ends.append(span["end"])
            out.append(len(ends) - 1)
    return out


def draw(doc: dict[str, Any], out: str, margin_us: float = 300.0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = doc["traceEvents"]
    lo, hi = _window(events, margin_us)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    shown = [e for e in events if e["ph"] in ("X", "i") and lo <= e["ts"] <= hi]
    threads = sorted({(e["pid"], e["tid"]) for e in shown})
    rows: dict[Any, float] = {}
    labels = []
    y = 0.0
    in_flight = defaultdict(list)
    for span in _async_spans(events):
        if span["cat"] != "queued" and span["end"] >= lo and span["ts"] <= hi:
            in_flight[span["pid"]].append(span)
    for pid in sorted(procs):
        for key in [t for t in threads if t[0] == pid]:
            rows[key] = y
            labels.append((y, f"{procs[pid]}\n{names.get(key, key[1])}"))
            y += 1
        spans = sorted(in_flight[pid], key=lambda s: s["ts"])
        lanes = _lanes(spans)
        depth = max(lanes, default=-1) + 1
        for span, lane in zip(spans, lanes, strict=True):
            span["y"] = y + lane * 0.8 / max(depth, 1)
            span["h"] = 0.8 / max(depth, 1)
        if spans:
            labels.append((y + 0.4, f"{procs[pid]}\nin flight"))
            y += 1
        y += 0.4
    fig, ax = plt.subplots(figsize=(13, 0.9 * y + 1.2))
    for e in shown:
        row = rows[(e["pid"], e["tid"])]
        if e["ph"] == "X":
            color = BACKWARD_COLOR if e["name"] == "backward" else COLORS.get(e["cat"], "gray")
            height, base = (0.8, row) if e["name"] in ("backward", "finalize") else (0.5, row + 0.15)
            ax.broken_barh([((e["ts"] - lo) / 1000, e["dur"] / 1000)], (base, height),
                           facecolors=color, edgecolor="black", linewidth=0.3)
        else:
            ax.plot([(e["ts"] - lo) / 1000] * 2, [row + 0.82, row + 0.98], color="black", lw=0.8)
    for spans in in_flight.values():
        for span in spans:
            ax.broken_barh([((span["ts"] - lo) / 1000, (span["end"] - span["ts"]) / 1000)],
                           (span["y"], span["h"] * 0.9), facecolors=COLORS.get(span["cat"], "gray"),
                           alpha=0.7, edgecolor="black", linewidth=0.3)
    ax.set_yticks([pos + 0.4 for pos, _ in labels], [text for _, text in labels], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms (rank 0's clock; alignment within "
                  f"{doc['otherData'].get('clock_error_bound_us', 0):.0f} us)")
    ax.set_xlim(0, (hi - lo) / 1000)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in
               (BACKWARD_COLOR, COLORS["ddp"], COLORS["collective"])]
    ax.legend(handles, ["DDP backward / finalize", "bucket all_reduce in flight",
                        "collective running"], loc="lower right", fontsize=8)
    ax.set_title("ringtorch timeline: one DDP step, every rank (ticks: bucket ready)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", help="a merged trace.json")
    parser.add_argument("out", help="the PNG to write")
    args = parser.parse_args()
    with open(args.trace) as f:
        draw(json.load(f), args.out)


if __name__ == "__main__":
    main()
