"""What the flight recorder (and the timeline's tracing) costs, on and off, side by side in one run.

    python bench/recorder.py                      # 5 repeats: 4-5 minutes on 2 cores
    python bench/recorder.py --repeats 2 --iters 200 --blocks 60
    python bench/recorder.py --quick              # tiny settings: checks that it runs
    python bench/recorder.py --json bench/out/recorder.json   # also bench/_report.py's JSON

Two measurements, each alternating its configurations (off, on, off, on, ...) so that a
change of load on a shared machine hits them alike, each reported as the median of its
repeats:

1. The 1 KB all_reduce at world 2, over shared memory and over sockets (RINGTORCH_SHM=0):
   with the recorder off (as RINGTORCH_FLIGHT_RECORDER=0 leaves it), with its ring only
   (the flight recorder alone: what a job outside ringrun gets), and on by default as
   under ringrun (the ring and the summary's running totals, which count only where
   ringrun's RINGTORCH_OBSERVE_DIR is set), and in a job started with tracing on
   (RINGTORCH_TRACE=<a temporary folder>) when this ringtorch has that knob ("not available"
   otherwise). Each job is a fresh pair of processes that switch the recorder off and on in
   place between blocks of ``--iters`` calls (both ranks on the same schedule, a barrier
   before each block); rank 0 keeps the median block's wall time per call of each mode.
   Switching keeps the ring: a job that has run for a while has a full ring, and that is
   the state measured (the warm-up fills it; making a ring anew per block would measure a
   ring being filled, whose records all survive, and Python's garbage collector with them).
2. The cost per record, in one process: the world-1 all_reduce (no peer to wait for, so the
   recorder's share is as large as it can be; it runs on the calling thread) with the
   recorder off, with its ring only, and by default (the ring and the summary's totals, as
   the process set them up), switched in place between blocks, timed by the calling
   thread's CPU clock (``time.thread_time``), which other processes on the same cores do not
   advance: the per-record cost stays measurable on a loaded machine. Then the summary's
   totals alone (records issued and finished in a tight loop, counted and not).

The goals: at most 0.5 µs of CPU per record, and at most 5% of a 1 KB all_reduce.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _report import Recorder  # bench/ is sys.path[0]

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRANSPORTS = {"shm": {"RINGTORCH_SHM": "1"}, "sockets": {"RINGTORCH_SHM": "0"}}
ELEMENTS = 256  # float32: 1 KB


def trace_available() -> bool:
    """Whether this ringtorch has the timeline's RINGTORCH_TRACE knob."""
    from ringtorch import _config

    return "RINGTORCH_TRACE" in _config.KNOBS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _time_blocks(fn: Any, iters: int, blocks: int, before: Any = None,
                 clock: Any = time.perf_counter) -> list[float]:
    """Seconds per call of ``blocks`` blocks of ``iters`` calls (``before`` runs untimed
    ahead of each block), by ``clock``."""
    times = []
    for _ in range(blocks):
        if before is not None:
            before()
        start = clock()
        for _ in range(iters):
            fn()
        times.append((clock() - start) / iters)
    return times


def _installed() -> tuple[int, list[Any], Any]:
    """What the process set the recorder up with: (capacity, listeners, counter)."""
    from ringtorch._observe.recorder import RECORDER

    return RECORDER.capacity or 2000, list(RECORDER.listeners), RECORDER.counter


def _switch(mode: str, installed: tuple[int, list[Any], Any]) -> None:
    """Recorder off (as with RINGTORCH_FLIGHT_RECORDER=0: nothing is recorded, nothing
    listens or counts), its ring only, or as the process started (``on``: the ring, and the
    counter and listeners it installed: the summary's totals, and the trace writer when
    tracing). The ring itself is kept (see the module docstring): ``on`` is what every
    operation asks before it records."""
    from ringtorch._observe.recorder import RECORDER

    capacity, listeners, counter = installed
    if RECORDER.capacity != capacity:
        RECORDER.configure(capacity)
    RECORDER.on = mode != "off"
    RECORDER.listeners[:] = listeners if mode == "on" else []
    RECORDER.count_with(counter if mode == "on" else None)


def _busy(rounds: int) -> int:
    """Plain Python work (a loop of additions), the yardstick of ``_calibrated``."""
    total = 0
    for i in range(rounds):
        total += i
    return total


def _calibrated(target_s: float) -> int:
    """Rounds of ``_busy`` that take ``target_s`` of this thread's CPU time, measured."""
    rounds = 1
    while True:
        start = time.thread_time()
        for _ in range(2000):
            _busy(rounds)
        if (time.thread_time() - start) / 2000 >= target_s:
            return rounds
        rounds += 1


def worker(args: argparse.Namespace) -> None:
    """One rank of a world-2 job: blocks of 1 KB all_reduces, the recorder switched off and
    back on between blocks (both ranks follow the same schedule); and, as a yardstick, blocks
    with the recorder off and 1 µs of the caller's own Python work before each call (what
    any extra microsecond of CPU per operation costs in this two-rank job)."""
    import torch

    import ringtorch.distributed as dist

    dist.init_process_group("gloo")
    installed = _installed()
    tensor = torch.ones(ELEMENTS)
    rounds = _calibrated(1e-6)
    for _ in range(args.warmup):
        dist.all_reduce(tensor)

    def with_work() -> None:
        _busy(rounds)
        dist.all_reduce(tensor)

    def plain() -> None:
        dist.all_reduce(tensor)

    calls = {"off": plain, "ring": plain, "on": plain, "work": with_work}
    times: dict[str, list[float]] = {mode: [] for mode in calls}
    for block in range(args.blocks):
        for mode in list(calls)[::1 if block % 2 == 0 else -1]:  # no order bias
            _switch("off" if mode == "work" else mode, installed)
            times[mode] += _time_blocks(calls[mode], args.iters, 1, before=dist.barrier)
    _switch("on", installed)
    if dist.get_rank() == 0:
        Path(args.worker_out).write_text(json.dumps(times))
    dist.destroy_process_group()


def run_job(env_extra: dict[str, str], args: argparse.Namespace) -> dict[str, float]:
    """Median seconds per 1 KB all_reduce of one fresh world-2 job in each mode."""
    with tempfile.TemporaryDirectory(prefix="bench_recorder_") as tmp:
        out = os.path.join(tmp, "times.json")
        port = _free_port()
        procs = []
        for rank in range(2):
            env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                   "OMP_NUM_THREADS": "1",
                   # as under ringrun, the default a job gets: the summary's totals count too
                   "RINGTORCH_OBSERVE_DIR": tmp, **env_extra}
            env.pop("RINGTORCH_FLIGHT_RECORDER", None)
            env = {k: v.replace("{tmp}", tmp) for k, v in env.items()}
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", "--worker-out", out,
                 "--iters", str(args.iters), "--blocks", str(args.blocks),
                 "--warmup", str(args.warmup)], env=env, stderr=subprocess.PIPE, text=True))
        errors = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs]
        for code, err in errors:
            if code != 0:
                raise RuntimeError(f"a benchmark rank failed (exit {code}):\n{err}")
        times = json.loads(Path(out).read_text())
        return {mode: statistics.median(v) for mode, v in times.items()}


def per_record(args: argparse.Namespace) -> dict[str, float]:
    """Nanoseconds per world-1 all_reduce: recorder off, ring only, default (ring + counter)."""
    import torch

    import ringtorch.distributed as dist

    os.environ.pop("RINGTORCH_FLIGHT_RECORDER", None)
    os.environ.pop("RINGTORCH_TRACE", None)
    # as under ringrun (the summary's totals count), in a folder removed at exit
    observe = tempfile.mkdtemp(prefix="bench_recorder_")
    atexit.register(shutil.rmtree, observe, True)
    os.environ["RINGTORCH_OBSERVE_DIR"] = observe
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    installed = _installed()  # what init_process_group set up
    tensor = torch.ones(ELEMENTS)
    samples: dict[str, list[float]] = {"off": [], "ring": [], "on": []}
    for _ in range(args.warmup):
        dist.all_reduce(tensor)
    for block in range(args.repeats * 10):
        for mode in ("off", "ring", "on")[::1 if block % 2 == 0 else -1]:
            _switch(mode, installed)
            samples[mode] += _time_blocks(lambda: dist.all_reduce(tensor), args.iters, 1,
                                          clock=time.thread_time)
    _switch("on", installed)
    dist.destroy_process_group()
    found = {f"{mode}_ns": statistics.median(v) * 1e9 for mode, v in samples.items()}
    found["counting_ns"] = _counting_alone(args) * 1e9
    return found


def _counting_alone(args: argparse.Namespace) -> float:
    """CPU seconds the summary's totals add to one record: records issued and finished in a
    tight loop, with and without a Totals counting them, alternating."""
    from ringtorch._observe.recorder import COLLECTIVE, FlightRecorder
    from ringtorch._observe.totals import Totals

    recorder = FlightRecorder(2000)
    totals = Totals(recorder)

    def one() -> None:
        rec = recorder.record(COLLECTIVE, "0", "allreduce", 0, -1, 1024)
        rec.started = rec.finished = 1

    samples: dict[bool, list[float]] = {False: [], True: []}
    for block in range(args.repeats * 10):
        for on in (False, True) if block % 2 == 0 else (True, False):
            recorder.count_with(totals.add_all if on else None)
            samples[on] += _time_blocks(one, args.iters * 10, 1, clock=time.thread_time)
    return statistics.median(samples[True]) - statistics.median(samples[False])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5,
                        help="jobs per configuration, alternating; medians are reported")
    parser.add_argument("--iters", type=int, default=200, help="calls per timed block")
    parser.add_argument("--blocks", type=int, default=60,
                        help="timed blocks per job and mode (many short blocks: the medians "
                             "of ratios hold still on a noisy machine)")
    parser.add_argument("--warmup", type=int, default=2500,
                        help="calls before timing (enough to fill the ring)")
    parser.add_argument("--quick", action="store_true", help="tiny settings (checks it runs)")
    parser.add_argument("--json", help="also write the results here (bench/_report.py's format)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.repeats, args.iters, args.blocks, args.warmup = 1, 50, 2, 100
    recorder = Recorder("recorder")
    tracing = trace_available()
    jobs = {"default": {}}
    if tracing:
        jobs["trace"] = {"RINGTORCH_TRACE": "{tmp}"}
    # samples[transport][job] = [{"off": s, "on": s} per repeat]
    samples: dict[str, dict[str, list[dict[str, float]]]] = {t: {j: [] for j in jobs}
                                                             for t in TRANSPORTS}
    for _ in range(args.repeats):
        for transport, transport_env in TRANSPORTS.items():
            for job, job_env in jobs.items():
                samples[transport][job].append(run_job({**transport_env, **job_env}, args))
    record = per_record(args)
    rows = []
    print(f"1 KB all_reduce at world 2, recorder off and on in alternate blocks of {args.iters} "
          f"calls ({args.blocks} each per job), median over {args.repeats} job(s) each; "
          f"tracing: {'RINGTORCH_TRACE' if tracing else 'not available in this ringtorch'}")
    print("| transport | off µs | ring only µs | ring / off | default µs | default / off "
          "| cost per op ns | 1 µs of CPU costs ns | tracing off µs | tracing on µs "
          "| tracing / off |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for transport in TRANSPORTS:
        med = {(job, mode): statistics.median(r[mode] for r in samples[transport][job])
               for job in jobs for mode in ("off", "ring", "on", "work")}
        off, ring, on = (med[("default", mode)] for mode in ("off", "ring", "on"))
        row = {"transport": transport, "off_us": off * 1e6, "ring_us": ring * 1e6,
               "default_us": on * 1e6, "work_us": med[("default", "work")] * 1e6,
               "trace_off_us": med[("trace", "off")] * 1e6 if tracing else None,
               "trace_us": med[("trace", "on")] * 1e6 if tracing else None}
        rows.append(row)
        if tracing:
            trace_cells = (f"{row['trace_off_us']:.1f} | {row['trace_us']:.1f} | "
                           f"{row['trace_us'] / row['trace_off_us']:.3f}")
        else:
            trace_cells = "not available | not available | not available"
        print(f"| {transport} | {off * 1e6:.1f} | {ring * 1e6:.1f} | {ring / off:.3f} "
              f"| {on * 1e6:.1f} | {on / off:.3f} | "
              f"{(on - off) * 1e9:.0f} | {(row['work_us'] - row['off_us']) * 1e3:.0f} "
              f"| {trace_cells} |")
    print(f"\nper record, world 1 all_reduce in one process (CPU time of the calling thread), "
          f"median of {args.repeats * 10} alternating blocks of {args.iters} calls per mode:")
    print(f"  off {record['off_ns']:.0f} ns, ring only {record['ring_ns']:.0f} ns "
          f"(+{record['ring_ns'] - record['off_ns']:.0f} ns), default (ring + summary totals) "
          f"{record['on_ns']:.0f} ns (+{record['on_ns'] - record['off_ns']:.0f} ns); the "
          f"summary's totals alone {record['counting_ns']:.0f} ns per record")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    # results: {"repeats", "iters", "blocks", "tracing": bool, "ring_kept": True (modes
    # switched without making the ring anew; absent in older results), "rows": [{"transport",
    # "off_us", "ring_us", "default_us", "work_us" (off, plus 1 µs of the caller's own CPU
    # per call),
    # "trace_off_us", "trace_us" (None: not available)}],
    # "per_record": {"off_ns", "ring_ns", "on_ns", "counting_ns"}}
    recorder.write(args.json, {"repeats": args.repeats, "iters": args.iters,
                               "blocks": args.blocks, "tracing": tracing, "ring_kept": True,
                               "rows": rows, "per_record": record})


if __name__ == "__main__":
    main()
