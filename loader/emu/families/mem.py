"""Vector memory: global_* and buffer_* (MUBUF) loads and stores, and LDS DMA.

Loads read memory at issue and land when `s_waitcnt vmcnt` retires them (in issue
order). Stores write at issue and count against vmcnt. LDS DMA (`... lds`) writes LDS
when its vmcnt retires; lane i's bytes go to M0 + inst_offset + i * stride, where the
stride is the access size except for dwordx3, which fills 12 bytes of a 16-byte slot
(CDNA4 ISA §9.1.9: "TIDinWave * 16"; "LOAD_DWORDX3 writes 3 dwords and skips the 4th").

Buffer range checking, raw buffers (stride 0 or no idxen): a dword at voffset +
inst_offset + 4j is in range iff it ends at or below num_records; soffset is not
range-checked (fact sheet §3, LLVM's relaxed buffer OOB mode). Out-of-range loads
return 0 and stores are dropped. Descriptor features we do not model (swizzle, add_tid,
addr64, a dword straddling num_records) are rejected.

Structured buffers (idxen with a non-zero stride, V# dword 1 bits [29:16]): vaddr holds
the index (with offen too, vaddr+1 the offset); address = base + soffset + index * stride
+ voffset + inst_offset, and num_records counts records of `stride` bytes, so a lane is
in range iff index < num_records (Mesa's ac_build_buffer_descriptor: on gfx6-7 and
gfx9-10 NUM_RECORDS is in units of STRIDE when STRIDE != 0 and IDXEN is used; gfx8
alone differs). The offset is not checked against the stride: aiter's hardware-proven
fmha_v3_bwd objects issue `buffer_atomic_add_f32 ... idxen offset:128` on stride-4
buffers, which such a check would drop — inferred from that use, not from a document.
"""
from __future__ import annotations

import numpy as np

from .. import lds, numerics, races
from ..errors import UnsupportedInstruction
from ..memory import OutOfBounds
from ..registry import handles
from ..state import LANES, M0
from .ds import store_bytes

SIZES = {"dword": 4, "dwordx2": 8, "dwordx3": 12, "dwordx4": 16, "ubyte": 1, "sbyte": 1,
         "ushort": 2, "sshort": 2, "byte": 1, "short": 2}


def _size(name: str, prefix: str) -> tuple[int, str]:
    kind = name[len(prefix):]
    if kind not in SIZES:
        raise UnsupportedInstruction(f"{name} is not implemented by the emulator")
    return SIZES[kind], kind


def _to_regs(data: np.ndarray, kind: str) -> np.ndarray:
    """uint8[m, nbytes] -> uint32[m, k] register values (sub-dword loads extended)."""
    nbytes = data.shape[1]
    if nbytes >= 4:
        return np.ascontiguousarray(data).view(np.uint32)
    raw = np.zeros((data.shape[0], 4), np.uint8)
    raw[:, :nbytes] = data
    value = raw.view(np.uint32)[:, :1]
    if kind.startswith("s"):
        bits = 8 * nbytes
        value = ((value.astype(np.int64) ^ (1 << (bits - 1))) - (1 << (bits - 1))).astype(np.uint32)
    return value


def _read_lanes(ex, w, addr: np.ndarray, ok: np.ndarray, nbytes: int, what: str) -> np.ndarray:
    """uint8[n,64,nbytes]: memory at addr[n,64] for lanes `ok`, zero elsewhere."""
    if ok.all():
        try:
            out = ex.memory.read(addr.reshape(-1), nbytes).reshape(addr.shape + (nbytes,))
        except OutOfBounds as err:
            ex.fault(w, err, what)        # err.position is already the flat lane position
    else:
        out = np.zeros(addr.shape + (nbytes,), np.uint8)
        flat = np.flatnonzero(ok)
        try:
            out.reshape(-1, nbytes)[flat] = ex.memory.read(addr.reshape(-1)[flat], nbytes)
        except OutOfBounds as err:
            err.position = int(flat[err.position])
            ex.fault(w, err, what)
    races.note(ex, w, addr, ok, nbytes, races.READ)
    return out


def _write_lanes(ex, w, addr: np.ndarray, ok: np.ndarray, data: np.ndarray, what: str):
    flat = np.flatnonzero(ok)
    try:
        ex.memory.write(addr.reshape(-1)[flat], data.reshape(-1, data.shape[2])[flat])
    except OutOfBounds as err:
        err.position = int(flat[err.position])
        ex.fault(w, err, what)
    races.note(ex, w, addr, ok, data.shape[2], races.WRITE)


def _land_load(ex, w, dst, data: np.ndarray, mask: np.ndarray, kind: str):
    """Queue a VGPR/AGPR load result: data uint8[n,64,nbytes]."""
    n, _, nbytes = data.shape
    regs = _to_regs(data.reshape(-1, nbytes), kind).reshape(n, LANES, -1).transpose(0, 2, 1)
    count = regs.shape[1]
    if dst.count < count:
        raise UnsupportedInstruction(f"destination {dst.text} is narrower than the load ({ex.where()})")
    ex.issue_load(w, "vm", dst, regs, mask)


def _lds_dma(ex, inst, w, data: np.ndarray, mask: np.ndarray, size: int):
    """LDS DMA: queue data[n,64,size] to land at M0 + inst_offset + lane*size."""
    from ..decode import Operand
    # A SALU write of M0 needs 1 wait state before global_load_lds (CDNA4 ISA Table 11 lists
    # "global with LDS = 1") but none before the MUBUF `buffer_load ... lds` forms, which the
    # table leaves out and aiter's hardware-proven GEMMs issue right after `s_add_u32 m0`
    # (docs/isa-notes.md, "M0 -> LDS DMA").
    ex.role = "m0_dma" if inst.name.startswith("global_") else None
    m0 = ex.s32(Operand("s", M0, 1, text="m0"), w).astype(np.int64)
    ex.role = None
    stride = 16 if size == 12 else size
    lane_addr = m0[:, None] + int(inst.mods.get("offset", 0)) + stride * np.arange(LANES)
    land_lds = lds.dma_reserve(ex, w, lane_addr, size, mask, inst.name, data)
    ex.issue(w, "vm", lambda rows: land_lds(rows, data))


# ------------------------------------------------------------------ global
def _global_address(ex, inst, w, vaddr, saddr) -> np.ndarray:
    offset = np.int64(int(inst.mods.get("offset", 0)))
    if saddr.kind == "off":
        base = ex.v64(vaddr, w)
    else:
        base = ex.s64(saddr, w)[:, None] + ex.v32(vaddr, w).astype(np.uint64)
    return (base.astype(np.int64) + offset).astype(np.uint64)


GLOBAL_LOADS = [f"global_load_{k}" for k in SIZES if k not in ("byte", "short")]
GLOBAL_STORES = [f"global_store_{k}" for k in ("dword", "dwordx2", "dwordx3", "dwordx4", "byte", "short")]
GLOBAL_LDS = ["global_load_lds_dword", "global_load_lds_dwordx3", "global_load_lds_dwordx4",
              "global_load_lds_ubyte", "global_load_lds_sbyte", "global_load_lds_ushort", "global_load_lds_sshort"]


@handles(*GLOBAL_LOADS, klass="vmem")
def global_load(ex, inst, w):
    dst, vaddr, saddr = inst.ops
    nbytes, kind = _size(inst.name, "global_load_")
    mask = ex.exec_bits(w)
    addr = _global_address(ex, inst, w, vaddr, saddr)
    data = _read_lanes(ex, w, addr, mask, nbytes, inst.name)
    _land_load(ex, w, dst, data, mask, kind)


@handles(*GLOBAL_STORES, klass="vmem")
def global_store(ex, inst, w):
    vaddr, vdata, saddr = inst.ops
    nbytes, _ = _size(inst.name, "global_store_")
    mask = ex.exec_bits(w)
    addr = _global_address(ex, inst, w, vaddr, saddr)
    data = store_bytes(ex, w, vdata, nbytes)
    _write_lanes(ex, w, addr, mask, data, inst.name)
    ex.issue(w, "vm", lambda rows: None)


@handles(*GLOBAL_LDS, klass="lds_dma")
def global_load_lds(ex, inst, w):
    vaddr, saddr = inst.ops
    nbytes, _ = _size(inst.name, "global_load_lds_")
    if nbytes < 4:
        raise UnsupportedInstruction(f"{inst.name}: sub-dword LDS DMA is not modelled ({ex.where()})")
    mask = ex.exec_bits(w)
    addr = _global_address(ex, inst, w, vaddr, saddr)
    _lds_dma(ex, inst, w, _read_lanes(ex, w, addr, mask, nbytes, inst.name), mask, nbytes)


# ------------------------------------------------------------------ buffer
def _buffer_address(ex, inst, w, vaddr, srsrc, soffset, nbytes):
    """(address[n,64] uint64, in_range[n,64,dwords]) for a buffer access."""
    if inst.mods.get("addr64"):
        raise UnsupportedInstruction(f"addr64 buffer addressing is not modelled ({ex.where()})")
    desc = ex.sregs(srsrc, w, 4).astype(np.uint64)
    if ((desc[:, 1] >> np.uint64(31)) & np.uint64(1)).any():
        raise UnsupportedInstruction(f"swizzled buffer descriptors are not modelled ({ex.where()})")
    if ((desc[:, 3] >> np.uint64(23)) & np.uint64(1)).any():
        raise UnsupportedInstruction(f"ADD_TID_ENABLE buffer descriptors are not modelled ({ex.where()})")
    base = desc[:, 0] | ((desc[:, 1] & np.uint64(0xFFFF)) << np.uint64(32))
    num_records = desc[:, 2].astype(np.int64)
    soff = ex.s32(soffset, w).astype(np.int64) if soffset.kind != "off" else np.zeros(ex._n(w), np.int64)
    index = None
    if inst.mods.get("idxen"):
        index_op, vaddr = _idxen_vaddr(ex, inst, vaddr)
        index = ex.v32(index_op, w).astype(np.int64)
    voff = ex.v32(vaddr, w).astype(np.int64) if inst.mods.get("offen") else np.zeros((ex._n(w), LANES), np.int64)
    offset = voff + int(inst.mods.get("offset", 0))
    stride = ((desc[:, 1] >> np.uint64(16)) & np.uint64(0x3FFF)).astype(np.int64)
    if index is not None and (stride != 0).any():
        if (stride == 0).any():
            raise UnsupportedInstruction(f"idxen access with waves of stride 0 and non-zero mixed "
                                         f"({ex.where()})")
        addr = (base[:, None].astype(np.int64) + soff[:, None] + index * stride[:, None] + offset)
        in_range = np.repeat((index < num_records[:, None])[:, :, None], max(1, nbytes // 4), axis=2)
        return addr.astype(np.uint64), in_range
    # Range-check dword by dword (sub-dword accesses by their own size).
    unit, dwords = min(nbytes, 4), max(1, nbytes // 4)
    addr = (base[:, None].astype(np.int64) + soff[:, None] + offset).astype(np.uint64)
    if (offset + unit * dwords <= num_records[:, None]).all():
        return addr, np.ones(offset.shape + (dwords,), bool)     # every lane's last dword ends in range
    ends = offset[:, :, None] + unit * np.arange(1, dwords + 1)
    starts = ends - unit
    limit = num_records[:, None, None]
    straddle = (starts < limit) & (ends > limit)
    if straddle.any():
        raise UnsupportedInstruction(f"a buffer access straddles num_records ({int(limit.flat[0])}); the "
                                     f"hardware's per-byte behaviour there is not modelled ({ex.where()})")
    return addr, ends <= limit          # [n, 64, dwords]


def _idxen_vaddr(ex, inst, vaddr):
    """(index VGPR, offset VGPR) of an idxen access: vaddr is the index; with offen it is
    a pair whose second VGPR is the offset."""
    from ..decode import Operand
    pair = 2 if inst.mods.get("offen") else 1
    if vaddr.kind != "v" or vaddr.count != pair:
        raise UnsupportedInstruction(f"{inst.name}: vaddr {vaddr.text} must be {pair} VGPR(s) with idxen "
                                     f"({ex.where()})")
    return (Operand("v", vaddr.index, 1, text=f"v{vaddr.index}"),
            Operand("v", vaddr.index + pair - 1, 1, text=f"v{vaddr.index + pair - 1}"))


def _buffer_bytes_ok(in_range: np.ndarray, nbytes: int) -> np.ndarray:
    unit = min(nbytes, 4)
    return np.repeat(in_range, unit, axis=2)[:, :, :nbytes]


def _buffer_read(ex, inst, w, addr, in_range, mask, nbytes):
    """uint8[n,64,nbytes]; out-of-range dwords read 0."""
    full = in_range[:, :, -1] & mask      # a lane's in-range dwords are a prefix: its last decides
    if full.all():
        return _read_lanes(ex, w, addr, full, nbytes, inst.name)
    ok_bytes = _buffer_bytes_ok(in_range, nbytes) & mask[:, :, None]
    lanes_touching = ok_bytes.any(axis=2)
    data = np.zeros(addr.shape + (nbytes,), np.uint8)
    if lanes_touching.any():
        # Read each lane's in-range prefix; in-range dwords of one lane are contiguous
        # from the start because range grows with the offset.
        data[full] = _read_lanes(ex, w, addr, full, nbytes, inst.name)[full]
        partial = lanes_touching & ~full
        if partial.any():
            for k in range(1, in_range.shape[2]):
                sel = partial & (in_range.sum(axis=2) == k)
                if sel.any():
                    got = _read_lanes(ex, w, addr, sel, 4 * k, inst.name)
                    data[sel, :4 * k] = got[sel]
    return data


BUFFER_LOADS = [f"buffer_load_{k}" for k in SIZES if k not in ("byte", "short")]
BUFFER_STORES = [f"buffer_store_{k}" for k in ("dword", "dwordx2", "dwordx3", "dwordx4", "byte", "short")]


@handles(*BUFFER_LOADS, klass="vmem")
def buffer_load(ex, inst, w):
    nbytes, kind = _size(inst.name, "buffer_load_")
    mask = ex.exec_bits(w)
    if inst.mods.get("lds"):
        ex.klass = "lds_dma"
        vaddr, srsrc, soffset = inst.ops
        if nbytes < 4:
            raise UnsupportedInstruction(f"{inst.name} lds: sub-dword LDS DMA is not modelled ({ex.where()})")
        addr, in_range = _buffer_address(ex, inst, w, vaddr, srsrc, soffset, nbytes)
        # Out-of-range lanes deliver zeros to LDS (the fwd kernels' tails rely on it).
        _lds_dma(ex, inst, w, _buffer_read(ex, inst, w, addr, in_range, mask, nbytes), mask, nbytes)
        return
    dst, vaddr, srsrc, soffset = inst.ops
    addr, in_range = _buffer_address(ex, inst, w, vaddr, srsrc, soffset, nbytes)
    _land_load(ex, w, dst, _buffer_read(ex, inst, w, addr, in_range, mask, nbytes), mask, kind)


@handles(*BUFFER_STORES, klass="vmem")
def buffer_store(ex, inst, w):
    vdata, vaddr, srsrc, soffset = inst.ops
    nbytes, _ = _size(inst.name, "buffer_store_")
    mask = ex.exec_bits(w)
    addr, in_range = _buffer_address(ex, inst, w, vaddr, srsrc, soffset, nbytes)
    data = store_bytes(ex, w, vdata, nbytes)
    ok_bytes = _buffer_bytes_ok(in_range, nbytes) & mask[:, :, None]
    full = ok_bytes.all(axis=2)
    _write_lanes(ex, w, addr, full, data, inst.name)
    partial = ok_bytes.any(axis=2) & ~full
    if partial.any():
        for k in range(1, in_range.shape[2]):
            sel = partial & (in_range.sum(axis=2) == k)
            if sel.any():
                _write_lanes(ex, w, addr, sel, np.ascontiguousarray(data[:, :, :4 * k]), inst.name)
    ex.issue(w, "vm", lambda rows: None)


# ------------------------------------------------------------------ global atomics
def _pk_add_16(old: np.ndarray, add: np.ndarray, to_f32, from_f32) -> np.ndarray:
    """Two 16-bit float adds per dword (each half rounded to nearest even)."""
    out = np.empty_like(old)
    for shift in (0, 16):
        a = to_f32(((old >> np.uint32(shift)) & np.uint32(0xFFFF)).astype(np.uint16))
        b = to_f32(((add >> np.uint32(shift)) & np.uint32(0xFFFF)).astype(np.uint16))
        with np.errstate(all="ignore"):
            r = from_f32((a + b).astype(np.float32)).astype(np.uint32)
        out = (out & ~np.uint32(0xFFFF << shift)) | (r << np.uint32(shift)) if shift else r
    return out


ATOMICS = {
    "global_atomic_add": lambda old, v: old + v,
    "global_atomic_sub": lambda old, v: old - v,
    "global_atomic_add_f32": lambda old, v: (old.view(np.float32) + v.view(np.float32)).view(np.uint32),
    "global_atomic_pk_add_bf16": lambda old, v: _pk_add_16(old, v, numerics.bf16_to_f32, numerics.f32_to_bf16_rne),
    "global_atomic_pk_add_f16": lambda old, v: _pk_add_16(old, v, numerics.f16_to_f32, numerics.f32_to_f16_rne),
    "global_atomic_smax": lambda old, v: np.maximum(old.view(np.int32), v.view(np.int32)).view(np.uint32),
    "global_atomic_umax": lambda old, v: np.maximum(old, v),
    "global_atomic_smin": lambda old, v: np.minimum(old.view(np.int32), v.view(np.int32)).view(np.uint32),
    "global_atomic_umin": lambda old, v: np.minimum(old, v),
    "global_atomic_swap": lambda old, v: v,
}


def _atomic_rmw(ex, w, addr: np.ndarray, ok: np.ndarray, values: np.ndarray, fn, what: str) -> np.ndarray:
    """Apply fn(old, value) to the dword at addr for the lanes `ok`, as one lane at a time
    in (wave, lane) order would (so lanes hitting one address combine in that order);
    returns the old values (0 where not applied). Done in rounds: round i applies, all at
    once, the i-th op on each address, so the ops on one address keep their order and
    different addresses do not interact. An out-of-range lane faults before any write
    (one at a time, the lanes before it would have written; the launch stops either way)."""
    old_values = np.zeros(addr.shape, np.uint32)
    rows, lanes = np.nonzero(ok)
    a = addr[rows, lanes]
    if a.size == 0:
        return old_values
    _, first, inverse = np.unique(a, return_index=True, return_inverse=True)
    if first.size == a.size:
        rank = np.zeros(a.size, np.int64)                   # every address once: one round
    else:
        order = np.argsort(inverse, kind="stable")          # op positions grouped by address
        rank = np.empty(a.size, np.int64)
        rank[order] = np.arange(a.size) - np.repeat(np.cumsum(np.bincount(inverse)) - np.bincount(inverse),
                                                    np.bincount(inverse))
    vals = values[rows, lanes]
    for r in range(int(rank.max()) + 1):
        sel = np.flatnonzero(rank == r)
        try:
            old = ex.memory.read(a[sel], 4).view(np.uint32).reshape(-1)
        except OutOfBounds as err:
            p = sel[err.position]
            err.position = int(rows[p]) * LANES + int(lanes[p])
            ex.fault(w, err, what)
        old_values[rows[sel], lanes[sel]] = old
        new = np.asarray(fn(old.copy(), vals[sel]), np.uint32)
        ex.memory.write(a[sel], new.view(np.uint8).reshape(-1, 4))
    return old_values


def _atomic_return(ex, w, vdst, old_values: np.ndarray, mask: np.ndarray):
    data = old_values.view(np.uint8).reshape(old_values.shape + (4,))
    _land_load(ex, w, vdst, data, mask, "dword")


@handles(*ATOMICS, klass="vmem")
def global_atomic(ex, inst, w):
    """32-bit atomics, applied lane by lane in lane order (so equal addresses combine).

    With glc ("return") the pre-op value lands in vdst like a load. f32 adds keep
    denormals (the atomic unit is not governed by the wave's MODE; UNVERIFIED)."""
    returns = bool(inst.mods.get("glc") or inst.mods.get("sc0"))
    if returns:
        vdst, vaddr, vdata, saddr = inst.ops
    else:
        vaddr, vdata, saddr = inst.ops
    mask = ex.exec_bits(w)
    addr = _global_address(ex, inst, w, vaddr, saddr)
    ex.role = "store"
    values = ex.v32(vdata, w)
    ex.role = None
    old_values = _atomic_rmw(ex, w, addr, mask, values, ATOMICS[inst.name], inst.name)
    races.note_atomic(ex, w, addr, mask, values, inst.name, returns)
    if returns:
        _atomic_return(ex, w, vdst, old_values, mask)
    else:
        ex.issue(w, "vm", lambda rows: None)


BUFFER_ATOMICS = {"buffer_" + name[len("global_"):]: fn for name, fn in ATOMICS.items()}


@handles(*BUFFER_ATOMICS, klass="vmem")
def buffer_atomic(ex, inst, w):
    """MUBUF 32-bit atomics: the global atomics' operations on a buffer address (raw or
    structured, range-checked like a dword store: an out-of-range lane does nothing).
    With glc the pre-op value lands in vdata. What an out-of-range lane returns then is
    not documented that we found, so that case is rejected."""
    vdata, vaddr, srsrc, soffset = inst.ops
    returns = bool(inst.mods.get("glc") or inst.mods.get("sc0"))
    mask = ex.exec_bits(w)
    addr, in_range = _buffer_address(ex, inst, w, vaddr, srsrc, soffset, 4)
    ok = in_range[:, :, 0] & mask
    if returns and (mask & ~ok).any():
        raise UnsupportedInstruction(f"{inst.name} glc with an out-of-range lane: the value it returns "
                                     f"is unverified ({ex.where()})")
    ex.role = "store"
    values = ex.v32(vdata, w)
    ex.role = None
    old_values = _atomic_rmw(ex, w, addr, ok, values, BUFFER_ATOMICS[inst.name], inst.name)
    races.note_atomic(ex, w, addr, ok, values, inst.name, returns)
    if returns:
        _atomic_return(ex, w, vdata, old_values, mask)
    else:
        ex.issue(w, "vm", lambda rows: None)
