"""RPC messages without processes: pickling with out-of-band tensors, the header layout, the
handler and extension registries, options and the errors raised before RPC is initialized."""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import ringtorch.distributed.rpc as rpc
from ringtorch.distributed.rpc import _serialization as ser
from ringtorch.distributed.rpc import extensions, messages
from ringtorch.distributed.rpc._stream import build_parts, message_from_parts
from ringtorch.distributed.rpc._workerinfo import WorkerInfo

ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
              torch.complex128, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
              torch.bool, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn]


def roundtrip(obj: object) -> object:
    encoded = ser.encode(obj, dst=1)
    return ser.decode(encoded.data, ser.copy_buffers(encoded.buffers), src=0)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_tensors_of_every_dtype_come_back_equal_and_out_of_band(dtype: torch.dtype) -> None:
    source = torch.arange(12, dtype=torch.float64).reshape(3, 4).to(dtype)
    encoded = ser.encode(source, dst=1)
    assert [b.nbytes for b in encoded.buffers] == [source.numel() * source.element_size()]
    assert len(encoded.data) < 120  # dtype, shape and the rebuild function's name only
    back = roundtrip(source)
    assert back.dtype == dtype and back.shape == source.shape
    assert torch.equal(back.view(torch.uint8), source.view(torch.uint8))


def test_the_pickle_never_holds_the_tensor_bytes() -> None:
    source = torch.full((1000,), 7.0)
    encoded = ser.encode({"t": source}, dst=1)
    assert len(encoded.data) < 200
    assert np.shares_memory(np.frombuffer(encoded.buffers[0], dtype=np.float32), source.numpy())


def test_non_contiguous_conjugate_empty_and_zero_dim_tensors() -> None:
    strided = torch.arange(24.0).reshape(4, 6)[:, ::2]
    conj = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj()
    for source in (strided, conj, torch.zeros(0, 3), torch.tensor(5), torch.ones(2, 3).t()):
        back = roundtrip(source)
        assert torch.equal(back, source.resolve_conj())
        assert back.shape == source.shape


def test_requires_grad_and_parameters_survive() -> None:
    back = roundtrip([torch.ones(2, requires_grad=True), torch.nn.Parameter(torch.ones(3))])
    assert back[0].requires_grad and back[0].is_leaf
    assert type(back[1]) is torch.nn.Parameter and back[1].requires_grad


def test_modules_travel_with_their_weights() -> None:
    module = torch.nn.Linear(3, 2)
    back = roundtrip(module)
    assert torch.equal(back.weight, module.weight) and torch.equal(back.bias, module.bias)


def test_numpy_arrays_go_out_of_band_too() -> None:
    array = np.arange(1000, dtype=np.int32)
    encoded = ser.encode(array, dst=1)
    assert [b.nbytes for b in encoded.buffers] == [4000]
    np.testing.assert_array_equal(roundtrip(array), array)


def test_sparse_coo_tensors_travel_as_indices_and_values() -> None:
    source = torch.sparse_coo_tensor([[0, 2]], [1.0, 5.0], (4,), check_invariants=True)
    encoded = ser.encode(source, dst=1)
    assert len(encoded.buffers) == 2
    assert torch.equal(roundtrip(source).to_dense(), torch.tensor([1.0, 0.0, 5.0, 0.0]))


def test_tensors_not_on_the_cpu_are_refused_with_torchs_message() -> None:
    with pytest.raises(RuntimeError, match=r"^TensorPipe RPC backend only supports CPU tensors "
                                           r"by default, please move your tensors to CPU before "
                                           r"sending them over RPC .*; got a tensor on meta$"):
        ser.encode(torch.ones(2, device="meta"), dst=1)


def test_received_tensors_own_fresh_writable_memory() -> None:
    back = roundtrip(torch.zeros(4))
    back += 1  # no warning, no error: the receive buffer belongs to the tensor
    assert back.tolist() == [1.0] * 4


def test_a_missing_function_gets_torchs_hint() -> None:
    data = pickle.dumps(roundtrip).replace(b"roundtrip", b"roundtrix")
    with pytest.raises(AttributeError, match="Default RPC pickler does not serialize function "
                                             "code. Ensure that UDFs are defined on both caller "
                                             "and callee modules."):
        ser.decode(data, [], src=0)


def test_a_failed_encode_runs_the_rollbacks() -> None:
    undone: list[int] = []

    class Marker:
        pass

    def reduce_marker(obj: object) -> object:
        ser.encode_context().rollback.append(lambda: undone.append(1))
        return (dict, ())

    ser.register_reducer(Marker, reduce_marker)
    with pytest.raises(TypeError, match="cannot pickle '_thread.lock' object"):
        ser.encode([Marker(), threading.Lock()], dst=1)
    assert undone == [1]


def test_header_round_trips_and_bad_magic_is_caught() -> None:
    raw = messages.pack_header(messages.CALL, messages.FLAG_ONE_WAY, 77, 123456789, 5, 6, 2)
    assert len(raw) == messages.HEADER.size == 40
    header = messages.unpack_header(raw)
    assert (header.kind, header.flags, header.pickle_nbytes, header.message_id,
            header.context_id, header.context_message_id, header.nbuffers) == (
        messages.CALL, messages.FLAG_ONE_WAY, 77, 123456789, 5, 6, 2)
    with pytest.raises(ValueError, match=r"^bad RPC message magic b'XX' \(expected b'RP'\)$"):
        messages.unpack_header(b"XX" + raw[2:])


def test_an_absurd_buffer_count_is_refused() -> None:
    raw = messages.pack_header(messages.CALL, 0, 0, 1, -1, -1, messages.MAX_BUFFERS + 1)
    with pytest.raises(ValueError, match="buffers; at most"):
        messages.unpack_header(raw)


def test_message_parts_decode_back_to_the_same_message() -> None:
    encoded = ser.encode(("x", torch.arange(3.0)), dst=0)
    parts, by_reference = build_parts(messages.CALL, 0, 9, (-1, -1), encoded, False)
    assert not by_reference
    message = message_from_parts(parts)
    assert message.header.message_id == 9 and message.header.nbuffers == 1
    value = ser.decode(message.data, message.buffers, src=0)
    assert value[0] == "x" and torch.equal(value[1], torch.arange(3.0))


def test_handler_registry_refuses_response_kinds_and_duplicates() -> None:
    noop = extensions.Handler(messages.RESPONSE, lambda a, s, p: None)
    with pytest.raises(ValueError, match=r"^request kinds are 1\.\.63, got 64$"):
        extensions.register_handler(noop)
    other = extensions.Handler(messages.CALL, lambda a, s, p: None)
    with pytest.raises(ValueError, match=r"^RPC message kind 1 already has a handler$"):
        extensions.register_handler(other)


def test_extension_registry_refuses_clashes_and_bad_attach_names() -> None:
    clash = r"^RPC extension 'mine' clashes with the registered extension 'distributed autograd'"
    with pytest.raises(ValueError, match=clash):
        extensions.register_extension(extensions.Extension("mine", "m:f", kinds=range(40, 41)))
    with pytest.raises(ValueError, match=clash):
        extensions.register_extension(extensions.Extension("mine", "m:f", context_ids=True))
    with pytest.raises(ValueError, match=r"^Extension\.attach must be 'module:function', "
                                         r"got 'no_function'$"):
        extensions.register_extension(extensions.Extension("mine", "no_function"))


def test_distributed_autograd_loads_on_the_first_request_of_its_kinds() -> None:
    # a fresh interpreter: this one may have imported distributed autograd already
    code = ("import sys; from ringtorch.distributed.rpc import api, extensions; "
            "before = 'ringtorch.distributed.autograd' in sys.modules; "
            "h = extensions.handler(32); "
            "print(before, h.run.__module__, h.inline, extensions.handler(30))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["False", "ringtorch.distributed.autograd.engine", "False",
                                   "None"]


def test_worker_info_compares_hashes_prints_and_pickles_like_torchs() -> None:
    info = WorkerInfo("ps", 0)
    assert info == WorkerInfo("ps", 0) and info != WorkerInfo("ps", 1)
    assert len({info, WorkerInfo("ps", 0)}) == 1
    assert repr(info) == "WorkerInfo(id=0, name=ps)"
    assert pickle.loads(pickle.dumps(info)) == info


def test_backend_options_have_torchs_defaults_and_checks() -> None:
    options = rpc.TensorPipeRpcBackendOptions()
    assert (options.num_worker_threads, options.rpc_timeout, options.init_method) == (
        16, 60.0, "env://")
    assert repr(rpc.BackendType.TENSORPIPE) == "BackendType.TENSORPIPE"
    with pytest.raises(ValueError, match="only supports 1-to-1 mapping"):
        rpc.TensorPipeRpcBackendOptions(device_maps={"w": {"cpu": "cpu:0", "meta": "cpu:0"}})
    with pytest.raises(ValueError, match=r"^num_worker_threads must be a positive integer, "
                                         r"got 0$"):
        rpc.TensorPipeRpcBackendOptions(num_worker_threads=0)


def test_calls_before_init_rpc_raise_torchs_message() -> None:
    message = r"^RPC has not been initialized\. Call ringtorch\.distributed\.rpc\.init_rpc first\.$"
    with pytest.raises(RuntimeError, match=message):
        rpc.rpc_sync("worker1", len, args=([],))
    with pytest.raises(RuntimeError, match=message):
        rpc.RRef(1)
    with pytest.raises(RuntimeError, match=message):
        rpc.shutdown()


@pytest.mark.parametrize("kwargs, error, message", [
    ({"backend": "TENSORPIPE"}, TypeError, r"^Argument backend must be a member of BackendType$"),
    ({"rpc_backend_options": {"rpc_timeout": 1}}, TypeError,
     r"^Argument rpc_backend_options must be an instance of RpcBackendOptions$"),
    ({"name": "bad name!"}, ValueError, r"^RPC worker name must match"),
    ({"world_size": None}, ValueError, r"dynamic RPC groups \(world_size=None\) are not "
                                       r"supported"),
    ({"rpc_backend_options": rpc.TensorPipeRpcBackendOptions(devices=["meta"])}, ValueError,
     r"CPU tensors only"),
])
def test_init_rpc_checks_its_arguments_before_anything_else(kwargs: dict, error: type,
                                                             message: str) -> None:
    args = {"name": "worker0", "rank": 0, "world_size": 1, **kwargs}
    with pytest.raises(error, match=message):
        rpc.init_rpc(**args)
