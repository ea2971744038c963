"""CollectiveCall: what one collective is (op, sequence number, dtype, reduction, root, bytes,
group) and until when it may run, and every encoding of that identity.

The rule this module keeps: a collective's identity is built once per call, here, and every
place that names, frames, checks, fingerprints, reports or logs a collective takes the call
object. The three encodings that travel between ranks are produced from it and decoded back
into it in this module only (byte layouts in docs/wire-protocol.md):

* the socket frame header prefix (``_wire/mesh.py``'s COLL_HEADER without its payload size);
* the shared-memory descriptor words (``_wire/shm_domain.py``: seq, kind, detail, nbytes; a
  CollectiveCall *is* a descriptor: the domain reads those four attributes);
* the status record a rank answers to a peer's "where are you?" (op, seq, state);
* the MPI backend's agreement record (six int64: seq, op, reduce op, dtype, bytes, root;
  -1 where a field is not compared), gathered from every rank before a collective.

The words a user reads (``describe``) come from the encoded codes, so a call decoded from a
peer's bytes reads exactly as one built here. Messages are composed in reports.py.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import torch

from ringtorch._wire.mesh import COLL_HEADER
from ringtorch.collectives.reduce_op import RedOpType

# Op codes on the wire: append-only, a code never changes meaning.
OP_CODES = {"all_reduce": 1, "broadcast": 2, "reduce": 3, "all_gather": 4, "gather": 5,
            "scatter": 6, "reduce_scatter": 7, "all_to_all": 8, "barrier": 9}
OP_NAMES = {code: name for name, code in OP_CODES.items()}
DTYPES: list[torch.dtype] = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
    torch.complex128, torch.complex32, torch.bool, torch.uint8, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn,
    torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
]
DTYPE_CODES = {dtype: i + 1 for i, dtype in enumerate(DTYPES)}

# Socket frame header (see _wire/mesh.py): tag, op, dtype, reduce op, root (u32), seq, total
# bytes; the payload size (u64) follows and is packed per frame.
COLL_TAG = 0xC1
NO_ROOT = 0xFFFFFFFF
NO_REDOP = 0xFF
FRAME_HEADER = COLL_HEADER
FRAME_PREFIX = struct.Struct("<BBBBIQQ")
FRAME_PAYLOAD = struct.Struct("<Q")
assert FRAME_PREFIX.size + FRAME_PAYLOAD.size == FRAME_HEADER.size

# Shared-memory descriptor: ``detail`` = dtype code | reduce op << 8 | (root + 1) << 16 |
# (shared buffer index + 1) << 40. Shared-buffer allocations have their own kind and
# sequence numbers far from any collective's, so a late peer's collective with the same
# number is never taken for a mismatch.
SHARED_TENSOR_KIND = 64
SHARED_SEQ_BASE = 1 << 62
SHARED_SHIFT = 40


class CollectiveCall(NamedTuple):
    """One collective as every rank must agree on it, and its deadline (frozen).

    Attributes:
        op: "all_reduce", "broadcast", ... ("shared_tensor" for a shared-buffer allocation).
        dtype: the tensors' dtype (None when decoded from a code this build does not know).
        redop: the reduction the ranks must agree on (the user's: AVG and PREMUL_SUM stay
            themselves here; transports receive only the lowered base op), or None.
        root: the root rank, -1 when the collective has none.
        group: the group's name.
        kind: the op's wire code.
        detail: dtype, reduction, root and shared buffer, packed as the descriptor packs them.
        seq: the group's sequence number of the collective.
        nbytes: bytes of this rank's buffer (the input of gathers and reductions).
        deadline: ``time.monotonic()`` by which it must finish (0.0 when decoded).
    """

    op: str
    dtype: torch.dtype | None
    redop: RedOpType | None
    root: int
    group: str
    kind: int
    detail: int
    seq: int
    nbytes: int
    deadline: float

    @property
    def shared(self) -> int:
        """The index of the shared buffer this all_reduce runs on, or -1."""
        return (self.detail >> SHARED_SHIFT) - 1

    def on_shared(self, index: int) -> CollectiveCall:
        """The same call, run on shared buffer ``index`` (peers must run it on the same)."""
        return self._replace(detail=self.detail | (index + 1) << SHARED_SHIFT)

    def without_redop(self) -> CollectiveCall:
        """The same call with its reduction left out of what the ranks compare (a reduce
        whose root alone reduces applies the root's op; the others' is not compared)."""
        if self.redop is None:
            return self
        return self._replace(redop=None, detail=self.detail | NO_REDOP << 8)


_new = tuple.__new__
# The per-(op, dtype, redop, root) part of a call, in field order: a call is
# ``tuple.__new__(CollectiveCall, (*signature, seq, nbytes, deadline))``.
Signature = tuple[str, "torch.dtype | None", "RedOpType | None", int, str, int, int]


class CallMaker:
    """Builds the calls of one group; the per-(op, dtype, redop, root) part is cached, so a
    call costs one dictionary lookup and one tuple (a collective's fixed cost is a few
    microseconds: the call must not add one)."""

    __slots__ = ("group", "_signatures")

    def __init__(self, group: str) -> None:
        self.group = group
        self._signatures: dict[tuple[Any, ...], Signature] = {}

    def __call__(self, op: str, seq: int, dtype: torch.dtype | None, redop: RedOpType | None,
                 root: int, nbytes: int, deadline: float) -> CollectiveCall:
        """The call of ``op`` #``seq`` (``root`` -1 and ``redop`` None when they do not apply)."""
        key = (op, dtype, redop, root)
        sig = self._signatures.get(key)
        if sig is None:
            sig = self.signature(op, dtype, redop, root)
        return _new(CollectiveCall, (*sig, seq, nbytes, deadline))

    def signature(self, op: str, dtype: torch.dtype | None, redop: RedOpType | None,
                  root: int) -> Signature:
        """The per-(op, dtype, redop, root) part of a call (cached): a hot path may keep it
        and build its calls as ``new_call(signature, seq, nbytes, deadline)``."""
        if len(self._signatures) > 4096:
            self._signatures.clear()
        red = NO_REDOP if redop is None else int(redop)
        detail = (0 if dtype is None else DTYPE_CODES.get(dtype, 0)) | red << 8 | (root + 1) << 16
        sig: Signature = (op, dtype, redop, root, self.group, OP_CODES[op], detail)
        self._signatures[(op, dtype, redop, root)] = sig
        return sig

    def shared_tensor(self, index: int, dtype: torch.dtype, nbytes: int,
                      deadline: float) -> CollectiveCall:
        """The call of the allocation of shared buffer ``index`` (a collective too)."""
        return CollectiveCall("shared_tensor", dtype, None, -1, self.group, SHARED_TENSOR_KIND,
                              DTYPE_CODES.get(dtype, 0), SHARED_SEQ_BASE + index, nbytes,
                              deadline)


def new_call(sig: Signature, seq: int, nbytes: int, deadline: float) -> CollectiveCall:
    """A call from its signature (what CallMaker does; the hot path inlines it)."""
    return _new(CollectiveCall, (*sig, seq, nbytes, deadline))


def facade_call(op_name: str, seq: int, group: str, deadline: float) -> CollectiveCall:
    """A collective as the ProcessGroup names it ("allreduce", "reduce_scatter_single", ...)
    before its backend runs it: what the DETAIL fingerprint check and logs take. It has no
    wire encoding (kind and detail 0)."""
    return CollectiveCall(op_name, None, None, -1, group, 0, 0, seq, 0, deadline)


# -- encodings ----------------------------------------------------------------------------------


def frame_prefix(call: CollectiveCall) -> bytes:
    """The socket frame header of ``call`` without its payload size."""
    detail = call.detail
    root = (detail >> 16) & 0xFFFFFF
    return FRAME_PREFIX.pack(COLL_TAG, call.kind, detail & 0xFF, (detail >> 8) & 0xFF,
                             NO_ROOT if root == 0 else root - 1, call.seq, call.nbytes)


def from_frame(raw: bytes, group: str = "") -> tuple[CollectiveCall, int]:
    """A socket frame header decoded: (the call it belongs to, its payload bytes)."""
    _tag, kind, dtype, redop, root, seq, total, payload = FRAME_HEADER.unpack(raw)
    detail = dtype | redop << 8 | (0 if root == NO_ROOT else root + 1) << 16
    return from_descriptor(seq, kind, detail, total, group), payload


def from_descriptor(seq: int, kind: int, detail: int, nbytes: int,
                    group: str = "") -> CollectiveCall:
    """A shared-memory descriptor (or a frame header's fields) decoded into a call."""
    code, red, root = detail & 0xFF, (detail >> 8) & 0xFF, (detail >> 16) & 0xFFFFFF
    dtype = DTYPES[code - 1] if 0 < code <= len(DTYPES) else None
    redop = RedOpType(red) if red in RedOpType._value2member_map_ else None
    if kind == SHARED_TENSOR_KIND:
        return CollectiveCall("shared_tensor", dtype, None, -1, group, kind, detail,
                              seq, nbytes, 0.0)
    op = OP_NAMES.get(kind, f"op#{kind}")
    return CollectiveCall(op, dtype, redop, root - 1, group, kind, detail, seq, nbytes, 0.0)


AGREEMENT = struct.Struct("<6q")
_NOT_COMPARED = 0xFF  # the dtype code of a decoded agreement record that did not compare it


def agreement_fields(sig: Signature) -> tuple[int, int, int, int]:
    """(op code, reduce op, dtype code, root) of the agreement records of the calls with
    signature ``sig`` (a hot path caches them and packs ``AGREEMENT.pack(seq, op, reduce op,
    dtype, nbytes, root)`` itself, as :func:`agreement_record` does)."""
    op, dtype, redop, root, _group, kind, detail = sig
    return (kind, -1 if redop is None else int(redop), -1 if dtype is None else detail & 0xFF,
            root)


def agreement_record(call: CollectiveCall) -> bytes:
    """The MPI backend's agreement record of ``call``: fields it leaves out (dtype None,
    redop None, nbytes -1, root -1) are -1, so they are not compared."""
    kind, red, dtype, root = agreement_fields(call[:7])
    return AGREEMENT.pack(call.seq, kind, red, dtype, call.nbytes, root)


def from_agreement(raw: bytes, group: str = "") -> list[CollectiveCall]:
    """Every rank's agreement record, gathered back to back, decoded into calls (a dtype
    that was not compared has code 0xFF in ``detail``; an unknown one code 0)."""
    calls = []
    for seq, kind, red, code, nbytes, root in AGREEMENT.iter_unpack(raw):
        dtype = DTYPES[code - 1] if 0 < code <= len(DTYPES) else None
        redop = RedOpType(red) if red in RedOpType._value2member_map_ else None
        detail = (_NOT_COMPARED if code < 0 else code) | (NO_REDOP if red < 0 else red) << 8 \
            | (root + 1) << 16
        calls.append(CollectiveCall(OP_NAMES.get(kind, f"op#{kind}"), dtype, redop, root, group,
                                    kind, detail, seq, nbytes, 0.0))
    return calls


def status_record(call: CollectiveCall | None, running: bool) -> dict[str, Any]:
    """What this rank answers to a peer's status query: its current or last collective."""
    if call is None:
        return {"op": None, "seq": -1, "state": "idle"}
    return {"op": call.op, "seq": call.seq, "state": "running" if running else "finished"}


# -- words --------------------------------------------------------------------------------------


def _dtype_name(code: int) -> str:
    return str(DTYPES[code - 1]).replace("torch.", "") if 0 < code <= len(DTYPES) else f"#{code}"


def describe(call: CollectiveCall) -> str:
    """A call in words: 'broadcast #3 (float32, 4096 bytes, root 1)'."""
    detail = call.detail
    parts = [_dtype_name(detail & 0xFF), f"{call.nbytes} bytes"]
    if call.kind == SHARED_TENSOR_KIND:
        return f"shared_tensor #{call.seq - SHARED_SEQ_BASE} ({', '.join(parts)})"
    red, root = (detail >> 8) & 0xFF, (detail >> 16) & 0xFFFFFF
    if red != NO_REDOP:
        parts.append(f"op {RedOpType(red).name}" if red in RedOpType._value2member_map_
                     else f"op #{red}")
    if root:
        parts.append(f"root {root - 1}")
    if call.shared >= 0:
        parts.append(f"shared tensor #{call.shared}")
    return f"{OP_NAMES.get(call.kind, f'op#{call.kind}')} #{call.seq} ({', '.join(parts)})"


__all__ = ["AGREEMENT", "COLL_TAG", "DTYPES", "DTYPE_CODES", "FRAME_HEADER", "FRAME_PAYLOAD",
           "FRAME_PREFIX", "NO_REDOP", "NO_ROOT", "OP_CODES", "OP_NAMES", "SHARED_SEQ_BASE",
           "SHARED_TENSOR_KIND", "CallMaker", "CollectiveCall", "Signature", "agreement_fields",
           "agreement_record", "describe", "facade_call", "frame_prefix", "from_agreement",
           "from_descriptor", "from_frame", "new_call", "status_record"]
