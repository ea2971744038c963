"""The GPU probe's checks, one function each, independent of one another (see probe.py).

Each returns a JSON-able dict of what it measured, or raises; a check that cannot apply on
this machine raises :class:`NotRun`. On CPU-only torch (the dry run) the checks that can run
on the simulated runtime do, so the dry run goes through the same code as the GPU run.
Child processes are spawned, never forked (CUDA may be initialised here), and joined with a
time limit, so a hung child fails its check instead of the probe.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from typing import Any

import torch

from ringtorch import _config
from ringtorch._device import nccl_lib, runtime
from ringtorch._device.api import DeviceRuntime

CHILD_TIMEOUT_S = 90.0


class NotRun(Exception):
    """The check does not apply here (the message says why)."""


def _gpu() -> bool:
    return torch.cuda.is_available()


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {
        "kernel": platform.release(), "python": platform.python_version(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cuda_built": torch.backends.cuda.is_built(),
        "cuda_available": torch.cuda.is_available(),
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "(unset)"),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)"),
        "runtime": runtime().name,
    }
    try:
        shm = os.statvfs("/dev/shm")
        info["dev_shm_free_bytes"] = shm.f_bavail * shm.f_frsize
    except OSError as exc:
        info["dev_shm_free_bytes"] = f"unavailable: {exc}"
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_mode",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = (out.stdout or out.stderr).strip()
    else:
        info["nvidia_smi"] = "not found"
    if _gpu():
        info["device_count"] = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
        info["device0"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                           "total_memory": props.total_memory}
        try:
            version = torch.cuda.nccl.version()  # a tuple; an int in old torch
            info["torch_nccl_version"] = (".".join(map(str, version))
                                          if isinstance(version, tuple) else str(version))
        except Exception as exc:  # torch built without NCCL
            info["torch_nccl_version"] = f"unavailable: {exc!r}"
    return info


def nccl_library() -> dict[str, Any]:
    lib = nccl_lib.load()
    code = lib.version()
    uid = lib.unique_id()
    return {"path": lib.path, "found_by": lib.how, "version": nccl_lib.version_string(code),
            "version_code": code, "unique_id_bytes": len(uid),
            "error_string_4": lib.error_string(4)}


def pinned_copies(nbytes: int = 64 << 20, reps: int = 5) -> dict[str, Any]:
    rt = runtime()
    n = nbytes // 4
    expected = torch.arange(n, dtype=torch.float32)
    host_in = rt.pinned_empty((n,), torch.float32)
    host_out = rt.pinned_empty((n,), torch.float32)
    host_in.copy_(expected)
    device = rt.empty((n,), torch.float32, 0)
    stream = rt.new_stream(0)
    done = rt.new_event()

    def timed(dst: torch.Tensor, src: torch.Tensor) -> float:
        times = []
        for _ in range(reps + 1):  # the first is a warm-up
            stream.synchronize()
            start = time.perf_counter()
            rt.copy(dst, src, stream)
            done.record(stream)
            done.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])

    h2d = timed(device, host_in)
    rt.launch(stream, lambda: device.add_(1.0))
    d2h = timed(host_out, device)
    if not torch.equal(host_out, expected + 1.0):
        raise AssertionError("the round trip host -> device (+1) -> host changed the data")
    return {"bytes": nbytes, "h2d_GBps": round(nbytes / h2d / 1e9, 2),
            "d2h_GBps": round(nbytes / d2h / 1e9, 2), "runtime": rt.name}


def runtime_contract() -> dict[str, Any]:
    """A minimal pass over the contract (the full one is tests/unit/test_device_runtime.py)."""
    rt = runtime()
    x = rt.empty((1024,), torch.float32, 0)
    first, second = rt.new_stream(0), rt.new_stream(0)
    # CUDA loads a kernel's module at its first launch, which may wait for the device to go
    # idle: every kernel timed below runs once first, so the busy stream stays busy
    rt.busy(first, 0.001)
    rt.launch(first, lambda: x.fill_(0.0))
    rt.launch(first, lambda: x.mul_(1.0))
    first.synchronize()
    event = rt.new_event()
    if not event.query():
        raise AssertionError("an event never recorded is not complete")
    second.wait_event(event)  # before any record: must not wait for the record below
    rt.busy(first, 0.3)
    rt.launch(first, lambda: x.fill_(2.0))
    event.record(first)
    rt.launch(second, lambda: None)
    second.synchronize()
    early = not first.query()
    second.wait_event(event)
    rt.launch(second, lambda: x.mul_(3.0))
    second.synchronize()
    if not torch.equal(x.to("cpu"), torch.full((1024,), 6.0)):
        raise AssertionError(f"stream order broken: {x[:4].tolist()} instead of 6.0")
    if not early:
        raise AssertionError("a wait placed before the first record waited for a later record")
    return {"runtime": rt.name, "fifo_and_event_order": "ok", "wait_before_record": "no-op"}


def _ipc_peer(runtime_name: str, buffer: Any, handle: bytes, conn: Any) -> None:
    """Spawned: open the owner's buffer and event, wait (device-side) after the owner says it
    recorded, send back what it read and add 1 to the buffer."""
    try:
        with _config.override(DEVICE_RUNTIME=runtime_name):
            rt = runtime()
        shared = rt.open(buffer)
        event = rt.open_event(handle, 0)
        conn.send("opened")
        if conn.recv() != "recorded":
            return
        stream = rt.new_stream(0)
        copy = rt.empty(tuple(shared.shape), shared.dtype, 0)
        stream.wait_event(event)
        rt.launch(stream, lambda: copy.copy_(shared))
        rt.launch(stream, lambda: shared.add_(1.0))
        stream.synchronize()
        conn.send(("ok", float(copy.sum().item())))
    except BaseException as exc:
        import traceback

        conn.send(("error", f"{exc!r}\n{traceback.format_exc()}"))


def ipc_exchange(n: int = 1 << 20) -> dict[str, Any]:
    rt: DeviceRuntime = runtime()
    shared = rt.empty((n,), torch.float32, 0)
    stream = rt.new_stream(0)
    rt.launch(stream, lambda: shared.zero_())
    stream.synchronize()
    event = rt.new_event(interprocess=True)
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    start = time.perf_counter()
    peer = ctx.Process(target=_ipc_peer, args=(rt.name, rt.export(shared), event.ipc_handle(),
                                               there), daemon=True)
    peer.start()
    try:
        if not here.poll(CHILD_TIMEOUT_S):
            raise TimeoutError(f"the peer did not open the buffer in {CHILD_TIMEOUT_S} s")
        opened = here.recv()
        if opened != "opened":
            raise AssertionError(f"peer: {opened}")
        rt.busy(stream, 0.2)
        rt.launch(stream, lambda: shared.fill_(2.0))
        event.record(stream)
        here.send("recorded")
        if not here.poll(CHILD_TIMEOUT_S):
            raise TimeoutError(f"the peer did not answer in {CHILD_TIMEOUT_S} s")
        kind, value = here.recv()
        if kind != "ok":
            raise AssertionError(f"peer failed: {value}")
        if value != 2.0 * n:
            raise AssertionError(f"the peer read a sum of {value}, not {2.0 * n}: its wait on "
                                 "the interprocess event did not order it after the owner")
        after = float(shared.sum().item())
        if after != 3.0 * n:
            raise AssertionError(f"the owner sees a sum of {after} after the peer's +1, "
                                 f"not {3.0 * n}")
    finally:
        peer.join(CHILD_TIMEOUT_S)
        if peer.is_alive():
            peer.kill()
    return {"runtime": rt.name, "bytes": n * 4, "seconds": round(time.perf_counter() - start, 2),
            "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "(unset)")}


def nccl_world_1() -> dict[str, Any]:
    if not _gpu():
        raise NotRun("no CUDA device")
    lib = nccl_lib.load()
    comm = lib.comm_init_rank(1, lib.unique_id(), 0)
    try:
        data = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
        out = torch.empty_like(data)
        stream = torch.cuda.current_stream()
        lib.all_reduce(data.data_ptr(), out.data_ptr(), data.numel(),
                       nccl_lib.DATATYPES["float32"], nccl_lib.SUM, comm, stream.cuda_stream)
        stream.synchronize()
        if not torch.equal(out.cpu(), torch.arange(1 << 20, dtype=torch.float32)):
            raise AssertionError("ncclAllReduce at world 1 changed the data")
        error = lib.async_error(comm)
    finally:
        lib.comm_destroy(comm)
    return {"version": nccl_lib.version_string(lib.version()), "async_error": error}


def _gloo_rank(rank: int, world: int, init_file: str, use_cuda: bool, numel: int, iters: int,
               conn: Any) -> None:
    """Spawned: torch's own gloo, one all_reduce checked, then ``iters`` timed."""
    import torch.distributed as tdist

    try:
        tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                 world_size=world)
        device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
        data = torch.full((numel,), float(rank + 1), device=device)
        tdist.all_reduce(data)
        expected = float(world * (world + 1) // 2)
        ok = bool(torch.equal(data.cpu(), torch.full((numel,), expected)))
        times = []
        for _ in range(iters):
            tdist.barrier()
            start = time.perf_counter()
            tdist.all_reduce(data)
            if use_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        tdist.destroy_process_group()
        conn.send(("ok", ok, statistics.median(times)))
    except BaseException as exc:
        import traceback

        conn.send(("error", f"{exc!r}\n{traceback.format_exc()}", 0.0))


def torch_gloo(nbytes: int = 1 << 20, iters: int = 20, world: int = 2) -> dict[str, Any]:
    use_cuda = _gpu()
    ctx = multiprocessing.get_context("spawn")
    folder = tempfile.mkdtemp(prefix="ringtorch-probe-")
    pipes, procs = [], []
    try:
        for rank in range(world):
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_gloo_rank, daemon=True, args=(
                rank, world, os.path.join(folder, "init"), use_cuda, nbytes // 4, iters, there))
            proc.start()
            pipes.append(here)
            procs.append(proc)
        answers = []
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        for rank, here in enumerate(pipes):
            if not here.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"gloo rank {rank} did not answer in {CHILD_TIMEOUT_S} s")
            answers.append(here.recv())
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        shutil.rmtree(folder, ignore_errors=True)
    for rank, (kind, ok, _) in enumerate(answers):
        if kind != "ok":
            raise AssertionError(f"gloo rank {rank} failed: {ok}")
        if not ok:
            raise AssertionError(f"gloo rank {rank}: all_reduce gave wrong values")
    seconds = max(answer[2] for answer in answers)
    return {"device": "cuda:0 (both ranks)" if use_cuda else "cpu (no GPU)", "world": world,
            "bytes": nbytes, "median_seconds": seconds,
            "algbw_GBps": round(nbytes / seconds / 1e9, 3)}


CHECKS = (environment, nccl_library, runtime_contract, pinned_copies, ipc_exchange,
          nccl_world_1, torch_gloo)
