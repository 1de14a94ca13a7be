"""Global and buffer atomics: lane-ordered read-modify-write, packed 16-bit adds rounded per step."""
import struct

import numpy as np
import pytest
import torch

import gfxasm.emu as emu
from asm_harness import snippet_source
from kernel_source import assemble

BODY = """
  v_and_b32 v1, 3, v0                      // lane % 4: four lanes share each word
  v_lshlrev_b32 v1, 2, v1
  global_load_dword v2, v255, s[88:89]     // this lane's packed bf16 pair
  s_waitcnt vmcnt(0)                       // v2 is the atomic's data
  global_atomic_pk_add_bf16 v1, v2, s[90:91]
  global_atomic_add v1, v2, s[92:93]
  s_waitcnt vmcnt(0)                       // atomics done before the wave ends
"""


def _kernel():
    prologue = "  s_load_dwordx2 s[92:93], s[0:1], 0x10\n  s_waitcnt lgkmcnt(0)"
    src = snippet_source(BODY, prologue, args=("inp", "out", "ints"))
    return emu.load(assemble(src)).kernel("snippet")


def test_pk_add_bf16_and_add_u32_accumulate_in_lane_order():
    g = torch.Generator().manual_seed(7)
    vals = torch.randn(64, 2, generator=g).to(torch.bfloat16)
    inp = vals.view(torch.int32).reshape(64).clone()
    acc = torch.randn(4, 2, generator=g).to(torch.bfloat16)
    out = acc.clone().view(torch.int32).reshape(4)
    ints = torch.zeros(4, dtype=torch.int32) + 5
    kernarg = struct.pack("<QQQ", inp.data_ptr(), out.data_ptr(), ints.data_ptr())
    _kernel().launch(grid=(1, 1, 1), block=(64, 1, 1), kernarg=kernarg, buffers=[inp, out, ints])

    expect = acc.clone()
    for lane in range(64):                      # bf16 add, rounded after every lane
        expect[lane % 4] = (expect[lane % 4].float() + vals[lane].float()).to(torch.bfloat16)
    got = out.view(torch.bfloat16).reshape(4, 2)
    assert torch.equal(got.view(torch.int16), expect.view(torch.int16))
    raw = inp.numpy().view(np.uint32).astype(np.uint64)
    want = [(5 + int(raw[lane::4].sum())) & 0xFFFFFFFF for lane in range(4)]
    assert ints.numpy().view(np.uint32).tolist() == want


# ----------------------------------------------------------------------------------
# MUBUF atomics. Expected values follow the ISA's definition: address = base + soffset
# + (idxen: index * stride) + voffset + inst_offset; raw buffers range-check the byte
# offset against num_records, structured ones (idxen, stride != 0) the index against
# num_records (records); an out-of-range atomic does nothing.
# ----------------------------------------------------------------------------------

BUFFER_PROLOGUE = """
  s_load_dwordx2 s[92:93], s[0:1], 0x10      // acc (the buffer the atomics hit)
  s_load_dwordx2 s[94:95], s[0:1], 0x18      // (num_records, stride << 16) from the host
  s_waitcnt lgkmcnt(0)
  s_and_b32 s93, s93, 0xffff
  s_or_b32 s93, s93, s95                     // V# dword 1: base[47:32] | stride << 16
  s_mov_b32 s94, s94                         // V# dword 2: num_records
  s_mov_b32 s95, 0x20000                     // V# dword 3 (data format 32)
  global_load_dword v2, v255, s[88:89]       // this lane's data
  s_add_u32 s88, s88, 256
  s_addc_u32 s89, s89, 0
  global_load_dword v3, v255, s[88:89]       // this lane's index or byte offset
  s_waitcnt vmcnt(0)"""


def _buffer_kernel(body: str):
    src = snippet_source(body, BUFFER_PROLOGUE, args=("inp", "out", "acc", ("records", 4), ("stride", 4)))
    return emu.load(assemble(src)).kernel("snippet")


def _launch_buffer(body, data_u32, where_u32, acc, num_records, stride):
    inp = torch.from_numpy(np.concatenate([data_u32, where_u32]).view(np.int32).copy())
    out = torch.full((64,), -1, dtype=torch.int32)
    kernarg = struct.pack("<QQQII", inp.data_ptr(), out.data_ptr(), acc.data_ptr(), num_records, stride << 16)
    _buffer_kernel(body).launch(grid=(1, 1, 1), block=(64, 1, 1), kernarg=kernarg, buffers=[inp, out, acc])
    return out


def test_buffer_atomic_add_f32_raw_lane_order_and_range():
    """offen: lane l adds to byte offset 4 * (l % 6) + 8; num_records 24 keeps offsets
    8..20 (lanes with l % 6 < 4) and drops 24 and 28."""
    rng = np.random.default_rng(11)
    vals = rng.standard_normal(64).astype(np.float32)
    start = rng.standard_normal(10).astype(np.float32)
    acc = torch.from_numpy(start.copy())
    offs = (4 * (np.arange(64) % 6)).astype(np.uint32)
    _launch_buffer("  buffer_atomic_add_f32 v2, v3, s[92:95], 0 offen offset:8\n  s_waitcnt vmcnt(0)",
                   vals.view(np.uint32), offs, acc, 24, 0)
    expect = start.copy()
    for lane in range(64):                      # sequential f32 adds, one rounding each
        word = 2 + lane % 6
        if 4 * word + 4 <= 24:
            expect[word] = np.float32(expect[word] + vals[lane])
    assert np.array_equal(acc.numpy().view(np.uint32), expect.view(np.uint32))


def test_buffer_atomic_add_f32_structured_idxen():
    """idxen, stride 16: lane l hits base + 16 * (l % 8) + 4 (offset:4); records 6, so
    indices 6 and 7 are out of range and leave memory alone."""
    rng = np.random.default_rng(12)
    vals = rng.standard_normal(64).astype(np.float32)
    start = rng.standard_normal(32).astype(np.float32)
    acc = torch.from_numpy(start.copy())
    index = (np.arange(64) % 8).astype(np.uint32)
    _launch_buffer("  buffer_atomic_add_f32 v2, v3, s[92:95], 0 idxen offset:4\n  s_waitcnt vmcnt(0)",
                   vals.view(np.uint32), index, acc, 6, 16)
    expect = start.copy()
    for lane in range(64):
        if lane % 8 < 6:
            word = 4 * (lane % 8) + 1
            expect[word] = np.float32(expect[word] + vals[lane])
    assert np.array_equal(acc.numpy().view(np.uint32), expect.view(np.uint32))


@pytest.mark.parametrize("name,dtype", [("buffer_atomic_pk_add_bf16", torch.bfloat16),
                                        ("buffer_atomic_pk_add_f16", torch.float16)])
def test_buffer_atomic_pk_add_16(name, dtype):
    """Two 16-bit adds per dword, each rounded (RNE) after every lane."""
    g = torch.Generator().manual_seed(13)
    vals = torch.randn(64, 2, generator=g).to(dtype)
    start = torch.randn(4, 2, generator=g).to(dtype)
    acc = start.clone().view(torch.int32).reshape(4)
    offs = (4 * (np.arange(64) % 4)).astype(np.uint32)
    _launch_buffer(f"  {name} v2, v3, s[92:95], 0 offen\n  s_waitcnt vmcnt(0)",
                   vals.view(torch.int32).reshape(64).numpy().view(np.uint32), offs, acc, 16, 0)
    expect = start.clone()
    for lane in range(64):
        expect[lane % 4] = (expect[lane % 4].float() + vals[lane].float()).to(dtype)
    assert torch.equal(acc.view(dtype).reshape(4, 2).view(torch.int16), expect.view(torch.int16))


def test_buffer_atomic_add_u32_returns_pre_op_value():
    """sc0 (glc): vdata receives the value before this lane's add (lanes in order)."""
    rng = np.random.default_rng(14)
    vals = rng.integers(0, 2**31, 64).astype(np.uint32)
    start = rng.integers(0, 2**31, 2).astype(np.uint32)
    acc = torch.from_numpy(start.view(np.int32).copy())
    offs = (4 * (np.arange(64) % 2)).astype(np.uint32)
    out = _launch_buffer("  buffer_atomic_add v2, v3, s[92:95], 0 offen sc0\n  s_waitcnt vmcnt(0)\n"
                         "  global_store_dword v255, v2, s[90:91]", vals, offs, acc, 8, 0)
    run = start.astype(np.uint64).copy()
    want = np.zeros(64, np.uint64)
    for lane in range(64):
        want[lane] = run[lane % 2]
        run[lane % 2] = (run[lane % 2] + vals[lane]) & 0xFFFFFFFF
    assert out.numpy().view(np.uint32).tolist() == want.tolist()
    assert acc.numpy().view(np.uint32).tolist() == run.tolist()
