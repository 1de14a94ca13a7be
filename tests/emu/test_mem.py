"""Known-answer tests for vector memory (families/mem.py): global loads/stores with and
without saddr, buffer (MUBUF) loads/stores with out-of-range tails (loads read 0, stores
are dropped), every width incl. sub-dword, and LDS DMA lane placement.

References are computed here from the addressing rules (fact sheet §3):
  global, saddr:   s[base:base+1] + zero-extended 32-bit VGPR offset + imm
  global, no saddr: 64-bit VGPR address + imm
  buffer (raw, offen): base + soffset + voffset + imm; a dword is in range iff
      voffset + imm + 4j + 4 <= num_records (soffset is not range-checked)
  LDS DMA: lane i's data lands at M0 + imm + i * size.
"""
import struct

import numpy as np
import pytest
import torch

import gfxasm.emu as emu
from asm_harness import snippet_source
from kernel_source import assemble
from gfxasm.emu.errors import HazardError, MemoryFault, UnsupportedInstruction

M32 = 0xFFFFFFFF


def rand_u32(r, n=64):
    return r.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)


def run_mem(body, mem: np.ndarray, vgprs=None, sgprs=None, outputs=(), lds=0, strict=True):
    """Like asm_harness.run_snippet, plus a third buffer `mem` whose address is in s[86:87]."""
    vgprs, sgprs = dict(vgprs or {}), dict(sgprs or {})
    pro = ["  s_load_dwordx2 s[86:87], s[0:1], 0x10"]
    data = []
    for reg, vals in vgprs.items():
        pro.append(f"  global_load_dword v{reg}, v255, s[88:89]\n  s_add_u32 s88, s88, 256\n  s_addc_u32 s89, s89, 0")
        data.append(np.asarray(vals, np.uint32))
    for n, reg in enumerate(sgprs):
        pro.append(f"  s_load_dword s{reg}, s[88:89], {4 * n:#x}")
    data.append(np.array(list(sgprs.values()) + [0] * (64 - len(sgprs)), np.uint32))
    epi = []
    for reg in outputs:
        src = reg
        if reg[0] == "s":
            epi.append(f"  v_mov_b32 v254, {reg}\n  s_nop 1")
            src = "v254"
        epi.append(f"  global_store_dword v255, {src}, s[90:91]\n  s_add_u32 s90, s90, 256\n  s_addc_u32 s91, s91, 0")
    src = snippet_source(body, "\n".join(pro), "\n".join(epi), lds=lds, args=("inp", "out", "mem"))
    src = src.replace(".kernarg_segment_size: 16", ".kernarg_segment_size: 24").replace(
        ".amdhsa_kernarg_size 16", ".amdhsa_kernarg_size 24").replace(
        "      - {.name: out,", "      - {.name: mem, .offset: 16, .size: 8, .value_kind: global_buffer, "
                               ".address_space: global}\n      - {.name: out,")
    inp = torch.from_numpy(np.concatenate(data).view(np.int32)).clone()
    out = torch.full((max(1, len(outputs)) * 64,), -1, dtype=torch.int32)
    kernarg = struct.pack("<QQQ", inp.data_ptr(), out.data_ptr(), mem.__array_interface__["data"][0])
    emu.load(assemble(src)).kernel("snippet").launch(grid=(1, 1, 1), block=(64, 1, 1), kernarg=kernarg,
                                                     buffers=[inp, out, mem], strict=strict)
    res = out.numpy().view(np.uint32).reshape(-1, 64)
    return {reg: (res[n][0] if reg[0] == "s" else res[n].copy()) for n, reg in enumerate(outputs)}


def mem_bytes(r, n):
    return r.integers(0, 256, n).astype(np.uint8)


def le(buf, addr, nbytes):
    return int.from_bytes(bytes(buf[addr:addr + nbytes]), "little")


# ------------------------------------------------------------------ global
LOADS = [("dword", 4, False), ("dwordx2", 8, False), ("dwordx3", 12, False), ("dwordx4", 16, False),
         ("ubyte", 1, False), ("sbyte", 1, True), ("ushort", 2, False), ("sshort", 2, True)]


def _dst(count, base=10):
    return f"v{base}" if count == 1 else f"v[{base}:{base + count - 1}]"


def _bases(table):
    """Destination register base per entry of a width table (4 registers each)."""
    return [10 + 4 * k for k in range(len(table))]


def _outs(table):
    return [f"v{b + d}" for b, (_, n, _) in zip(_bases(table), table) for d in range(max(1, n // 4))]


def _check_load(out, buf, addr, nbytes, signed, name, base=10, in_range=None):
    count = max(1, nbytes // 4)
    for lane in range(64):
        a = int(addr[lane])
        if nbytes < 4:
            ok = True if in_range is None else in_range(lane, 0)
            v = le(buf, a, nbytes) if ok else 0
            if signed and v >> (8 * nbytes - 1):
                v -= 1 << (8 * nbytes)
            assert int(out[f"v{base}"][lane]) == v & M32, (name, lane)
        else:
            for d in range(count):
                ok = True if in_range is None else in_range(lane, d)
                want = le(buf, a + 4 * d, 4) if ok else 0
                assert int(out[f"v{base + d}"][lane]) == want, (name, lane, d)


def test_global_load_saddr_every_width():
    r = np.random.default_rng(10)
    buf = mem_bytes(r, 8192)
    aligned = (r.integers(64, 7000 // 4, 64) * 4).astype(np.uint32)
    odd = aligned + r.integers(0, 4, 64).astype(np.uint32)      # sub-dword loads at any byte
    imm = -48
    body = ""
    for b, (kind, nbytes, _) in zip(_bases(LOADS), LOADS):
        v = "v2" if nbytes == 1 else "v1"
        body += f"  global_load_{kind} {_dst(max(1, nbytes // 4), b)}, {v}, s[86:87] offset:{imm}\n"
    body += "  s_waitcnt vmcnt(0)\n"
    out = run_mem(body, buf, vgprs={1: aligned, 2: odd}, outputs=_outs(LOADS))
    for b, (kind, nbytes, signed) in zip(_bases(LOADS), LOADS):
        addr = (odd if nbytes == 1 else aligned).astype(np.int64) + imm
        _check_load(out, buf, addr, nbytes, signed, kind, b)


def test_global_load_vaddr64():
    r = np.random.default_rng(30)
    buf = mem_bytes(r, 8192)
    off = (r.integers(0, 7000 // 4, 64) * 4).astype(np.uint64)
    table = [LOADS[0], LOADS[3], LOADS[5]]
    body = "  v_mov_b32 v3, s87\n  v_add_co_u32 v2, vcc, s86, v1\n  v_addc_co_u32 v3, vcc, 0, v3, vcc\n"
    for b, (kind, nbytes, _) in zip(_bases(table), table):
        body += f"  global_load_{kind} {_dst(max(1, nbytes // 4), b)}, v[2:3], off offset:12\n"
    body += "  s_waitcnt vmcnt(0)\n"
    out = run_mem(body, buf, vgprs={1: off.astype(np.uint32)}, outputs=_outs(table))
    for b, (kind, nbytes, signed) in zip(_bases(table), table):
        _check_load(out, buf, off.astype(np.int64) + 12, nbytes, signed, kind, b)


STORES = [("dword", 4), ("dwordx2", 8), ("dwordx3", 12), ("dwordx4", 16), ("byte", 1), ("short", 2)]


@pytest.mark.parametrize("saddr", [True, False])
def test_global_store_every_width(saddr):
    """Each width stores into its own 1 KiB region, under a random EXEC mask."""
    r = np.random.default_rng(50 + saddr)
    buf = mem_bytes(r, 1024 * len(STORES) + 64)
    expect = buf.copy()
    off = (2048 + r.permutation(64) * 16).astype(np.uint32)      # the imm offset is 13-bit signed
    data = {20 + i: rand_u32(r) for i in range(4)}
    mask = int(r.integers(0, 2**64, dtype=np.uint64))
    body = "  s_mov_b64 exec, s[10:11]\n"
    if not saddr:
        body += "  v_mov_b32 v3, s87\n  v_add_co_u32 v2, vcc, s86, v1\n  v_addc_co_u32 v3, vcc, 0, v3, vcc\n"
    for k, (kind, nbytes) in enumerate(STORES):
        count = max(1, nbytes // 4)
        src = "v20" if count == 1 else f"v[20:{19 + count}]"
        imm = 1024 * k - 2048
        body += (f"  global_store_{kind} v1, {src}, s[86:87] offset:{imm}\n" if saddr else
                 f"  global_store_{kind} v[2:3], {src}, off offset:{imm}\n")
    body += "  s_mov_b64 exec, -1\n  s_waitcnt vmcnt(0)\n"
    run_mem(body, buf, vgprs={1: off, **data}, sgprs={10: mask & M32, 11: mask >> 32})
    for k, (kind, nbytes) in enumerate(STORES):
        for lane in range(64):
            if (mask >> lane) & 1:
                raw = b"".join(int(data[20 + i][lane]).to_bytes(4, "little") for i in range(4))[:nbytes]
                a = int(off[lane]) + 1024 * k - 2048
                expect[a:a + nbytes] = np.frombuffer(raw, np.uint8)
    np.testing.assert_array_equal(buf, expect)


def test_store_outside_buffers_is_a_fault():
    buf = np.zeros(256, np.uint8)
    with pytest.raises(MemoryFault, match="outside every registered buffer"):
        run_mem("  v_lshlrev_b32 v1, 3, v0\n  global_store_dword v1, v1, s[86:87]\n  s_waitcnt vmcnt(0)\n", buf)


def test_load_result_before_vmcnt_is_a_hazard():
    buf = np.zeros(1024, np.uint8)
    with pytest.raises(HazardError, match="in flight"):
        run_mem("  v_lshlrev_b32 v1, 2, v0\n  global_load_dword v2, v1, s[86:87]\n  v_mov_b32 v3, v2\n"
                "  s_waitcnt vmcnt(0)\n", buf)


# ------------------------------------------------------------------ buffer
DESC = ("  s_mov_b32 s80, s86\n  s_and_b32 s81, s87, 0xffff\n  s_mov_b32 s82, s12\n"
        "  s_mov_b32 s83, 0x20000\n")


def test_buffer_load_out_of_range_reads_zero():
    """Every width at once; lanes whose access starts at or past num_records read 0
    (soffset is added to the address but not range-checked)."""
    r = np.random.default_rng(70)
    buf = mem_bytes(r, 4096)
    soff, imm = 64, 12
    voff = (np.arange(64) * 16).astype(np.uint32)
    num_records = 16 * 40 + imm
    body = DESC
    for b, (kind, nbytes, _) in zip(_bases(LOADS), LOADS):
        body += f"  buffer_load_{kind} {_dst(max(1, nbytes // 4), b)}, v1, s[80:83], s13 offen offset:{imm}\n"
    body += "  s_waitcnt vmcnt(0)\n"
    old = {k: rand_u32(r) for k in range(10, 10 + 4 * len(LOADS))}
    out = run_mem(body, buf, vgprs={1: voff, **old}, sgprs={12: num_records, 13: soff}, outputs=_outs(LOADS))
    for b, (kind, nbytes, signed) in zip(_bases(LOADS), LOADS):
        unit = min(nbytes, 4)
        _check_load(out, buf, soff + voff.astype(np.int64) + imm, nbytes, signed, kind, b,
                    in_range=lambda lane, d, unit=unit: int(voff[lane]) + imm + unit * (d + 1) <= num_records)


def test_buffer_store_out_of_range_dropped():
    """Every width, each into its own 2 KiB window (soffset moves the window; the range check
    uses voffset + imm only)."""
    r = np.random.default_rng(90)
    buf = mem_bytes(r, 2048 * len(STORES))
    expect = buf.copy()
    imm = 4
    voff = (np.arange(64) * 32).astype(np.uint32)
    num_records = 32 * 37 + imm
    data = {20 + i: rand_u32(r) for i in range(4)}
    body = DESC
    for k, (kind, nbytes) in enumerate(STORES):
        count = max(1, nbytes // 4)
        src = "v20" if count == 1 else f"v[20:{19 + count}]"
        body += f"  s_mov_b32 s13, {2048 * k}\n  buffer_store_{kind} {src}, v1, s[80:83], s13 offen offset:{imm}\n"
    body += "  s_waitcnt vmcnt(0)\n"
    run_mem(body, buf, vgprs={1: voff, **data}, sgprs={12: num_records})
    for k, (kind, nbytes) in enumerate(STORES):
        for lane in range(64):
            start = int(voff[lane]) + imm
            if start + min(nbytes, 4) <= num_records:
                raw = b"".join(int(data[20 + i][lane]).to_bytes(4, "little") for i in range(4))[:nbytes]
                a = 2048 * k + start
                expect[a:a + nbytes] = np.frombuffer(raw, np.uint8)
    np.testing.assert_array_equal(buf, expect)


def test_buffer_x4_partly_in_range_keeps_in_range_dwords():
    """Range checks are per dword (LLVM 'relaxed buffer OOB mode'): a dwordx4 whose first two
    dwords are in range loads them and zeros for the rest."""
    r = np.random.default_rng(95)
    buf = mem_bytes(r, 4096)
    voff = (np.arange(64) * 16).astype(np.uint32)
    num_records = 16 * 20 + 8                                   # lane 20: dwords 0-1 in, 2-3 out
    body = DESC + "  buffer_load_dwordx4 v[10:13], v1, s[80:83], 0 offen\n  s_waitcnt vmcnt(0)\n"
    out = run_mem(body, buf, vgprs={1: voff}, sgprs={12: num_records}, outputs=["v10", "v11", "v12", "v13"])
    for lane in (19, 20, 21):
        for d in range(4):
            a = 16 * lane + 4 * d
            want = le(buf, a, 4) if a + 4 <= num_records else 0
            assert int(out[f"v{10 + d}"][lane]) == want, (lane, d)


def test_buffer_straddling_dword_rejected():
    buf = np.zeros(1024, np.uint8)
    body = DESC + "  v_lshlrev_b32 v1, 2, v0\n  buffer_load_dword v10, v1, s[80:83], 0 offen\n  s_waitcnt vmcnt(0)\n"
    with pytest.raises(UnsupportedInstruction, match="straddles"):
        run_mem(body, buf, sgprs={12: 4 * 10 + 2})


# ----------------------------------------------------------------- LDS DMA
@pytest.mark.parametrize("form", ["buffer", "global"])
@pytest.mark.parametrize("kind,size", [("dword", 4), ("dwordx4", 16)])
def test_lds_dma_lane_placement(form, kind, size):
    """Lane i's data lands at M0 + imm + i*size. For dwordx4 the CDNA4 ISA (§9.1.9,
    "TIDinWave * 16") and hardware evidence agree: aiter's bf16gemm_bf16_tn_256x256.co feeds
    all its MFMA operands through 96 `buffer_load_dwordx4 ... lds` and matches its reference
    under this model (tests/conformance, gemm_bf16_*). dwordx3: see the test below."""
    r = np.random.default_rng(110 + size + 7 * (form == "buffer"))
    buf = mem_bytes(r, 4096)
    m0, imm = 256, 16
    voff = r.permutation(4096 // size - 2)[:64].astype(np.uint32) * size
    num_records = 4096 - 2 * size
    if form == "buffer":
        load = DESC + f"  buffer_load_{kind} v1, s[80:83], 0 offen offset:{imm} lds\n"
        # lanes whose source is out of range deliver zeros to LDS
        voff[5] = num_records
    else:
        if kind == "dword":
            load = f"  global_load_lds_dword v1, s[86:87] offset:{imm}\n"
        else:
            load = f"  global_load_lds_dwordx4 v1, s[86:87] offset:{imm}\n"
    lds = m0 + imm + 64 * size + 64
    body = (f"  s_mov_b32 m0, {m0}\n  s_nop 0\n" + load + "  s_waitcnt vmcnt(0)\n"
            f"  v_mul_u32_u24 v2, {size}, v0\n  v_add_u32 v2, {m0 + imm}, v2\n")
    count = size // 4
    body += f"  ds_read_b{8 * size} {_dst(count)}, v2\n  s_waitcnt lgkmcnt(0)\n"
    out = run_mem(body, buf, vgprs={1: voff}, sgprs={12: num_records}, outputs=[f"v{10 + i}" for i in range(count)],
                  lds=lds)
    for lane in range(64):
        src = int(voff[lane]) + imm
        ok = form == "global" or src + size <= num_records
        for d in range(count):
            want = le(buf, src + 4 * d, 4) if ok else 0
            assert int(out[f"v{10 + d}"][lane]) == want, (form, kind, lane, d)


def test_lds_dma_dwordx3_fills_12_bytes_of_a_16_byte_slot():
    """CDNA4 ISA §9.1.9: the LDS address steps by TIDinWave * 16 for the x3 and x4 forms, and
    LOAD_DWORDX3 writes 3 dwords and skips the 4th (whose LDS bytes keep their value)."""
    r = np.random.default_rng(333)
    buf = mem_bytes(r, 4096)
    m0, imm = 128, 32
    voff = r.permutation(4096 // 16 - 4)[:64].astype(np.uint32) * 16
    body = ("  v_lshlrev_b32 v2, 4, v0\n  v_add_u32 v2, %d, v2\n  v_mov_b32 v3, 0x5a5a5a5a\n"
            "  ds_write_b32 v2, v3 offset:12\n  s_waitcnt lgkmcnt(0)\n" % (m0 + imm))
    body += (f"  s_mov_b32 m0, {m0}\n  s_nop 0\n"
             + DESC + f"  buffer_load_dwordx3 v1, s[80:83], 0 offen offset:{imm} lds\n  s_waitcnt vmcnt(0)\n"
             "  ds_read_b128 v[10:13], v2\n  s_waitcnt lgkmcnt(0)\n")
    out = run_mem(body, buf, vgprs={1: voff}, sgprs={12: 4096}, outputs=[f"v{10 + i}" for i in range(4)],
                  lds=m0 + imm + 64 * 16)
    for lane in range(64):
        src = int(voff[lane]) + imm
        for d in range(3):
            assert int(out[f"v{10 + d}"][lane]) == le(buf, src + 4 * d, 4), (lane, d)
        assert int(out["v13"][lane]) == 0x5A5A5A5A, lane


def test_lds_dma_read_before_vmcnt_is_a_hazard():
    buf = np.zeros(1024, np.uint8)
    body = ("  s_mov_b32 m0, 0\n  s_nop 0\n  v_lshlrev_b32 v1, 2, v0\n  global_load_lds_dword v1, s[86:87]\n"
            "  ds_read_b32 v2, v1\n  s_waitcnt vmcnt(0) lgkmcnt(0)\n")
    with pytest.raises(HazardError, match="LDS DMA"):
        run_mem(body, buf, lds=256)
