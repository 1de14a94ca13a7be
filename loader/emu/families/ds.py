"""DS (LDS) instructions: reads and writes of every width, read2/write2, the gfx950
transposing reads, lane permutes (ds_bpermute/ds_permute/ds_swizzle) and simple atomics.

Addressing: address = vaddr + offset. The offsets are taken from the raw DS dword
(offset [15:0], or offset0 [7:0] / offset1 [15:8] for read2/write2; gds [16]) rather
than from the printed text. read2/write2 offsets count elements (x64 for st64).

Every DS result lands in its destination registers when `s_waitcnt lgkmcnt` retires it;
memory is read (and written) at issue. Accesses outside the workgroup's LDS are faults
in strict mode and read 0 / are dropped otherwise (lds.py).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .. import lds
from ..errors import MemoryFault, UnsupportedInstruction
from ..registry import handles
from ..state import occurrence_rank

READS = {"ds_read_b32": 4, "ds_read_b64": 8, "ds_read_b96": 12, "ds_read_b128": 16,
         "ds_read_u8": 1, "ds_read_i8": 1, "ds_read_u16": 2, "ds_read_i16": 2}
WRITES = {"ds_write_b8": 1, "ds_write_b16": 2, "ds_write_b32": 4, "ds_write_b64": 8,
          "ds_write_b96": 12, "ds_write_b128": 16}
# Alignment the hardware requires (fact sheet §3; llc only emits b128 for 16-aligned).
ALIGN = {16: 16}
LANE = np.arange(64)


def _dword0(ex, inst) -> int:
    d = inst.words[0]
    if (d >> 16) & 1:
        raise UnsupportedInstruction(f"GDS access is not modelled ({ex.where()})")
    return d


def offset16(ex, inst) -> int:
    return _dword0(ex, inst) & 0xFFFF


def base_address(ex, inst, w, op) -> np.ndarray:
    return ex.v32(op, w).astype(np.int64)


def check_alignment(ex, w, addr, mask, align: int, what: str):
    bad = mask & (addr % align != 0)
    if bad.any():
        row, lane = np.argwhere(bad)[0]
        raise MemoryFault(f"{what} at LDS address {int(addr[row, lane]):#x} (lane {lane}) is not "
                          f"{align}-byte aligned ({ex.where(int(ex.wave_ids(w)[row]))})")


def _land_regs(ex, w, dst, regs: np.ndarray, mask: np.ndarray, after=None):
    """Queue uint32[n,k,64] to land in k registers from `dst` where mask[n,64]; `after(rows)`
    runs when the op retires too (e.g. to release LDS bytes an atomic marked in flight)."""
    count = regs.shape[1]
    if dst.count != count:
        raise UnsupportedInstruction(f"destination {dst.text} is not {count} registers ({ex.where()})")
    ex.issue_load(w, "lgkm", dst, regs, mask, after)


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
    _land_regs(ex, w, dst, regs, mask)


@handles(*READS, klass="ds")
def ds_read(ex, inst, w):
    dst, addr_op = inst.ops
    nbytes = READS[inst.name]
    mask = ex.exec_bits(w)
    addr = base_address(ex, inst, w, addr_op) + offset16(ex, inst)
    align = ALIGN.get(nbytes, 1)
    check = (lambda: check_alignment(ex, w, addr, mask, align, inst.name)) if align > 1 else None
    data = lds.read(ex, w, addr, nbytes, mask, inst.name, check=check, align=align)
    land_bytes(ex, inst, w, dst, data, mask, extend="i" if "_i" in inst.name[7:] else "")


@handles(*WRITES, klass="ds")
def ds_write(ex, inst, w):
    addr_op, data_op = inst.ops
    nbytes = WRITES[inst.name]
    mask = ex.exec_bits(w)
    addr = base_address(ex, inst, w, addr_op) + offset16(ex, inst)
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
    d = _dword0(ex, inst)
    base = base_address(ex, inst, w, addr_op)
    return base + scale * (d & 0xFF), base + scale * ((d >> 8) & 0xFF)


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


# ------------------------------------------------------- transposing reads
# ds_read_b64_tr_b{16,8} (fact sheet §3, SETTLED by hardware-proven aiter kernels): every
# lane reads 64 bits at its own address (in[l]); within each 16-lane block b,
#   b16: out[16b+n].h[j] = in[16b + 4j + n/4].h[n%4]   (n = 0..15, j = 0..3)
#   b8:  out[16b+n].b[j] = in[16b + 2j + n/8].b[n%8]   (j = 0..7)
# i.e. with E elements per lane (4 or 8): source lane 16b + (16/E)*j + n/E, element n%E.
# The 8-byte alignment required here is UNVERIFIED (fact sheet: "Alignment requirement is
# UNVERIFIED"); issue 3 asks that misaligned transposing reads be faults, so they are.
# A 16-lane block with some lanes inactive is rejected: which data an inactive lane
# contributes to the transpose is not documented. b4/b6 forms are not implemented.
TRANSPOSE = {"ds_read_b64_tr_b16": 2, "ds_read_b64_tr_b8": 1}


@lru_cache(maxsize=None)
def _transpose_index(esize: int) -> np.ndarray:
    """int[512 / esize]: for each output element (lane 16b+n, element j) of a wave, its
    element position in the wave's [64 lanes x 8 bytes] input viewed as esize-byte
    elements (the formula above); outputs in [dword, lane, element] order."""
    per = 8 // esize                      # elements per lane
    b = np.arange(4)[:, None, None]
    n = np.arange(16)[None, :, None]
    j = np.arange(per)[None, None, :]
    lane = 16 * b + (16 // per) * j + n // per
    index = (lane * per + n % per).reshape(-1)
    # Output elements in register order [dword 0..1, lane, element]: the gathered elements
    # viewed as uint32 are the destination's [2, 64] registers, contiguous.
    index = np.ascontiguousarray(index.reshape(64, 2, per // 2).transpose(1, 0, 2)).reshape(-1)
    index.flags.writeable = False         # cached: shared by every call
    return index


@handles(*TRANSPOSE, klass="ds")
def ds_read_tr(ex, inst, w):
    dst, addr_op = inst.ops
    esize = TRANSPOSE[inst.name]
    mask = ex.exec_bits(w)
    if not ex.waves.exec_all(w):
        blocks = mask.reshape(-1, 4, 16)
        partial = blocks.any(axis=2) & ~blocks.all(axis=2)
        if partial.any():
            row = int(np.flatnonzero(partial.any(axis=1))[0])
            raise UnsupportedInstruction(f"{inst.name} with a partly active 16-lane block is not modelled "
                                         f"({ex.where(int(ex.wave_ids(w)[row]))})")
    addr = base_address(ex, inst, w, addr_op) + offset16(ex, inst)
    data = lds.read(ex, w, addr, 8, mask, inst.name, align=8,        # [n, 64, 8] = in[l]
                    check=lambda: check_alignment(ex, w, addr, mask, 8, inst.name))
    out = np.take(data.view(f"u{esize}").reshape(data.shape[0], -1), _transpose_index(esize), axis=1)
    _land_regs(ex, w, dst, out.view(np.uint32).reshape(-1, 2, 64), mask)


# ------------------------------------------------------------ lane permutes
# ds_bpermute_b32 vdst, vaddr, vdata offset: lane i reads vdata of lane ((vaddr[i] + offset)
# / 4) mod 64; ds_permute_b32 (forward): lane i's vdata goes to lane ((vaddr[i]+offset)/4)
# mod 64, the highest source lane winning a collision; active lanes nobody writes get 0.
# Inactive lanes: they supply no data (a read of one returns 0) and their vdst is not
# written. Sources: LLVM's intrinsic docs for llvm.amdgcn.ds.bpermute / ds.permute
# ("Reading from inactive lanes returns 0. In case multiple values get written to the same
# lane, the value from the source lane with the higher index is taken."), and gem5's Vega
# model (AMD) which zeroes reads of inactive lanes. No LDS memory is touched.
@handles("ds_bpermute_b32", "ds_permute_b32", klass="ds")
def ds_permute(ex, inst, w):
    dst, addr_op, data_op = inst.ops
    mask = ex.exec_bits(w)
    lane = ((ex.v32(addr_op, w).astype(np.int64) + offset16(ex, inst)) >> 2) & 63
    ex.role = "store"
    data = ex.v32(data_op, w)
    ex.role = None
    rows = np.arange(mask.shape[0])[:, None]
    if inst.name == "ds_bpermute_b32":
        out = np.where(mask[rows, lane], data[rows, lane], 0).astype(np.uint32)
    else:
        winner = np.full(mask.shape, -1, np.int64)
        r, src = np.nonzero(mask)
        np.maximum.at(winner, (r, lane[r, src]), src)
        out = np.where(winner >= 0, data[rows, np.maximum(winner, 0)], 0).astype(np.uint32)
    _land_regs(ex, w, dst, out[:, None, :], mask)


# ds_swizzle_b32 vdst, vdata offset:pattern — the 16-bit pattern from the raw dword:
#   pattern[15] = 1, pattern < 0xC000: quad-permute mode, lane 4q+k reads lane
#       4q + pattern[2k+1:2k];
#   pattern[15] = 0: bit-mask mode within each 32-lane half, lane i reads
#       (((i & 31) & and_mask) | or_mask) ^ xor_mask, with and_mask = pattern[4:0],
#       or_mask = pattern[9:5], xor_mask = pattern[14:10] (plus i & 32);
#   (LLVM's BROADCAST/SWAP/REVERSE syntaxes assemble to bit-mask patterns.)
#   pattern >= 0xC000: LLVM assembles swizzle(ROTATE, ...) / swizzle(FFT, ...) there; those
#       modes are not documented for gfx9 in anything we found: rejected.
# Reading an inactive lane returns 0; inactive lanes are not written (gem5 Vega model).
@handles("ds_swizzle_b32", klass="ds")
def ds_swizzle(ex, inst, w):
    dst, data_op = inst.ops
    pattern = offset16(ex, inst)
    if pattern >= 0xC000:
        raise UnsupportedInstruction(f"ds_swizzle pattern {pattern:#06x} (rotate/FFT mode) is not "
                                     f"modelled ({ex.where()})")
    if pattern & 0x8000:
        src = (LANE & ~3) | ((pattern >> (2 * (LANE & 3))) & 3)
    else:
        and_mask, or_mask, xor_mask = pattern & 31, (pattern >> 5) & 31, (pattern >> 10) & 31
        src = ((((LANE & 31) & and_mask) | or_mask) ^ xor_mask) | (LANE & 32)
    mask = ex.exec_bits(w)
    ex.role = "store"
    data = ex.v32(data_op, w)
    ex.role = None
    out = np.where(mask[:, src], data[:, src], 0).astype(np.uint32)
    _land_regs(ex, w, dst, out[:, None, :], mask)


# ------------------------------------------------------------------ atomics
# 32-bit LDS atomics, with and without return (ds_<op>_u32 vaddr, vdata offset;
# ds_<op>_rtn_u32 vdst, vaddr, vdata offset). Lane semantics: the active lanes of the
# waves executing the instruction together are applied one at a time in (wave, lane)
# order, each seeing the result of the ones before it; the _rtn form returns to each
# lane the value it saw. (The hardware's order among colliding lanes is not documented;
# this order makes integer results exact whatever it is, and fixes the rounding of
# ds_add_f32.) Addresses must be 4-byte aligned (MemoryFault otherwise).
# ds_add_f32 is an IEEE round-to-nearest-even f32 add ("handles NaN/INF/denormal values"
# in the ISA description gem5 quotes); NaN operands, and denormal operands or results in a
# kernel whose f32 denormal mode flushes (whether LDS atomics honour the mode is not
# documented), are rejected rather than guessed.
# Race checking (strict mode): an atomic may touch bytes another wave's atomic wrote without
# a barrier in between (atomics do not race each other), never bytes an LDS DMA has not
# landed; its bytes count as written by its wave until its lgkmcnt retires and a barrier
# follows, so a plain read or write by another wave before s_waitcnt lgkmcnt(0) + s_barrier
# is reported (lds.py's barrier-epoch model). Not caught: a plain access by another wave
# followed, without synchronisation, by an atomic to the same bytes.
def _i32(x):
    return x.astype(np.uint32).view(np.int32)


ATOMICS = {
    "add_u32": lambda m, d: m + d,
    "sub_u32": lambda m, d: m - d,
    "rsub_u32": lambda m, d: d - m,
    "inc_u32": lambda m, d: np.where(m >= d, np.uint32(0), m + np.uint32(1)),
    "dec_u32": lambda m, d: np.where((m == 0) | (m > d), d, m - np.uint32(1)),
    "min_i32": lambda m, d: np.where(_i32(d) < _i32(m), d, m),
    "max_i32": lambda m, d: np.where(_i32(d) > _i32(m), d, m),
    "min_u32": np.minimum,
    "max_u32": np.maximum,
    "and_b32": np.bitwise_and,
    "or_b32": np.bitwise_or,
    "xor_b32": np.bitwise_xor,
    "add_f32": None,     # special-cased below
}


def _atomic_names():
    for op in ATOMICS:
        kind, ty = op.split("_")
        yield f"ds_{op}"
        yield f"ds_{kind}_rtn_{ty}"


def _add_f32(ex, m, d):
    f_m, f_d = m.view(np.float32), d.view(np.float32)
    with np.errstate(all="ignore"):
        r = (f_m + f_d).astype(np.float32)
    if np.isnan(f_m).any() or np.isnan(f_d).any():
        raise UnsupportedInstruction(f"ds_add_f32 with a NaN operand: the NaN result bits are not "
                                     f"modelled ({ex.where()})")
    if not ex.denorm_f32:
        tiny = np.float32(1.1754944e-38)
        den = lambda x: (x != 0) & (np.abs(x) < tiny)   # noqa: E731
        if den(f_m).any() or den(f_d).any() or den(r).any():
            raise UnsupportedInstruction(f"ds_add_f32 with a denormal operand or result in a kernel "
                                         f"that flushes f32 denormals: not modelled ({ex.where()})")
    return r.view(np.uint32)


@handles(*_atomic_names(), klass="ds")
def ds_atomic(ex, inst, w):
    rtn = "_rtn_" in inst.name
    op = inst.name[3:].replace("_rtn", "")
    if rtn:
        dst, addr_op, data_op = inst.ops
    else:
        addr_op, data_op = inst.ops
    mask = ex.exec_bits(w)
    addr = base_address(ex, inst, w, addr_op) + offset16(ex, inst)
    check_alignment(ex, w, addr, mask, 4, inst.name)
    ex.role = "store"
    data = ex.v32(data_op, w)
    ex.role = None
    # The dwords are marked in flight until the lgkmcnt retires, and (barrier-ordering model
    # of lds.py) as written by this wave: a plain access by another wave needs
    # s_waitcnt lgkmcnt(0) + s_barrier in between; another wave's atomic does not.
    acc, release = lds.atomic_access(ex, w, addr, mask, inst.name)
    slot, index, ok = acc.slot, acc.index, acc.ok
    ret = np.zeros(mask.shape, np.uint32)
    rows, lanes = np.nonzero(ok)                       # (wave, lane) order
    if rows.size:
        slots = slot[rows, 0, 0]
        byte = index[rows, lanes, 0]
        rank = occurrence_rank(slots * (ex.waves.lds_bytes + 8) + byte)
        mem = ex.waves.lds
        span = np.arange(4)
        for r in range(int(rank.max()) + 1):
            sel = rank == r                            # at most one op per address
            s, b = slots[sel], byte[sel]
            old = np.ascontiguousarray(mem[s[:, None], b[:, None] + span]).view(np.uint32)[:, 0]
            d = data[rows[sel], lanes[sel]]
            new = _add_f32(ex, old, d) if op == "add_f32" else \
                np.asarray(ATOMICS[op](old, d)).astype(np.uint32)
            mem[s[:, None], b[:, None] + span] = new.astype("<u4").view(np.uint8).reshape(-1, 4)
            ret[rows[sel], lanes[sel]] = old
    if rtn:
        _land_regs(ex, w, dst, ret[:, None, :], mask, after=release)
    else:
        ex.issue(w, "lgkm", release)
