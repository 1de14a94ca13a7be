"""DS (LDS) reads and writes of every width, and read2/write2.

Address = vaddr + offset (16-bit unsigned; read2/write2 take offset0/offset1 in units
of the element size, ×64 for the st64 forms). Reads take LDS bytes at issue and land in
the destination registers when `s_waitcnt lgkmcnt` retires them.
"""
from __future__ import annotations

import numpy as np

from .. import lds
from ..errors import MemoryFault
from ..registry import handles

READS = {"ds_read_b32": 4, "ds_read_b64": 8, "ds_read_b96": 12, "ds_read_b128": 16,
         "ds_read_u8": 1, "ds_read_i8": 1, "ds_read_u16": 2, "ds_read_i16": 2}
WRITES = {"ds_write_b8": 1, "ds_write_b16": 2, "ds_write_b32": 4, "ds_write_b64": 8,
          "ds_write_b96": 12, "ds_write_b128": 16}
# Alignment the hardware requires (fact sheet §3; llc only emits b128 for 16-aligned).
ALIGN = {16: 16}


def base_address(ex, inst, w, op) -> np.ndarray:
    return ex.v32(op, w).astype(np.int64)


def check_alignment(ex, w, addr, mask, align: int, what: str):
    bad = mask & (addr % align != 0)
    if bad.any():
        row, lane = np.argwhere(bad)[0]
        raise MemoryFault(f"{what} at LDS address {int(addr[row, lane]):#x} (lane {lane}) is not "
                          f"{align}-byte aligned ({ex.where(int(ex.wave_ids(w)[row]))})")


def land_bytes(ex, inst, w, dst, data: np.ndarray, mask: np.ndarray, extend: str = ""):
    """Queue uint8[n,64,nbytes] to land in `dst` (zero/sign-extended to dwords)."""
    nbytes = data.shape[2]
    if nbytes < 4:
        raw = np.zeros(data.shape[:2] + (4,), np.uint8)
        raw[:, :, :nbytes] = data
        value = raw.view(np.uint32)[:, :, 0]
        if extend == "i":
            bits = 8 * nbytes
            value = ((value.astype(np.int64) ^ (1 << (bits - 1))) - (1 << (bits - 1))).astype(np.uint32)
        regs = value[:, None, :]
    else:
        regs = np.ascontiguousarray(data).view(np.uint32).transpose(0, 2, 1)   # [n, k, 64]
    count = regs.shape[1]
    waves = ex.wave_ids(w)
    file = ex.waves.file(dst.kind)

    def land(rows):
        r = waves[rows]
        cur = file[r, dst.index:dst.index + count]
        file[r, dst.index:dst.index + count] = np.where(mask[rows][:, None, :], regs[rows], cur)
    ex.issue(w, "lgkm", land, dest=(dst.kind, dst.index, count))


@handles(*READS, klass="ds")
def ds_read(ex, inst, w):
    dst, addr_op = inst.ops
    nbytes = READS[inst.name]
    mask = ex.exec_bits(w)
    addr = base_address(ex, inst, w, addr_op) + int(inst.mods.get("offset", 0))
    if nbytes in ALIGN:
        check_alignment(ex, w, addr, mask, ALIGN[nbytes], inst.name)
    data = lds.read(ex, w, addr, nbytes, mask, inst.name)
    land_bytes(ex, inst, w, dst, data, mask, extend="i" if "_i" in inst.name[7:] else "")


@handles(*WRITES, klass="ds")
def ds_write(ex, inst, w):
    addr_op, data_op = inst.ops
    nbytes = WRITES[inst.name]
    mask = ex.exec_bits(w)
    addr = base_address(ex, inst, w, addr_op) + int(inst.mods.get("offset", 0))
    if nbytes in ALIGN:
        check_alignment(ex, w, addr, mask, ALIGN[nbytes], inst.name)
    data = store_bytes(ex, w, data_op, nbytes)
    release = lds.write(ex, w, addr, data, mask, inst.name)
    ex.issue(w, "lgkm", release)


def store_bytes(ex, w, op, nbytes: int) -> np.ndarray:
    """uint8[n,64,nbytes]: the low `nbytes` of the data registers, lane by lane."""
    count = max(1, nbytes // 4)
    ex.role = "store"
    regs = ex.vregs(op, w, count) if op.count > 1 or count > 1 else ex.v32(op, w)[:, None, :]
    ex.role = None
    raw = np.ascontiguousarray(regs.transpose(0, 2, 1)).view(np.uint8)   # [n, 64, 4*count]
    return raw[:, :, :nbytes]


# ------------------------------------------------------------- read2 / write2
PAIRED = {"ds_read2_b32": 4, "ds_read2_b64": 8, "ds_read2st64_b32": 4, "ds_read2st64_b64": 8}
PAIRED_WRITES = {"ds_write2_b32": 4, "ds_write2_b64": 8, "ds_write2st64_b32": 4, "ds_write2st64_b64": 8}


def _pair_addresses(ex, inst, w, addr_op, size):
    scale = size * (64 if "st64" in inst.name else 1)
    base = base_address(ex, inst, w, addr_op)
    return (base + scale * int(inst.mods.get("offset0", 0)),
            base + scale * int(inst.mods.get("offset1", 0)))


@handles(*PAIRED, klass="ds")
def ds_read2(ex, inst, w):
    dst, addr_op = inst.ops
    size = PAIRED[inst.name]
    mask = ex.exec_bits(w)
    a0, a1 = _pair_addresses(ex, inst, w, addr_op, size)
    data = np.concatenate([lds.read(ex, w, a0, size, mask, inst.name),
                           lds.read(ex, w, a1, size, mask, inst.name)], axis=2)
    land_bytes(ex, inst, w, dst, data, mask)


@handles(*PAIRED_WRITES, klass="ds")
def ds_write2(ex, inst, w):
    addr_op, d0, d1 = inst.ops
    size = PAIRED_WRITES[inst.name]
    mask = ex.exec_bits(w)
    a0, a1 = _pair_addresses(ex, inst, w, addr_op, size)
    r0 = lds.write(ex, w, a0, store_bytes(ex, w, d0, size), mask, inst.name)
    r1 = lds.write(ex, w, a1, store_bytes(ex, w, d1, size), mask, inst.name)

    def release(rows):
        r0(rows)
        r1(rows)
    ex.issue(w, "lgkm", release)
