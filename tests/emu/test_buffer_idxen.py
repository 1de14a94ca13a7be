"""Structured-buffer (idxen) loads and stores, against the ISA's address definition:
address = base + soffset + index * stride + voffset + inst_offset, with vaddr = index
(idxen) or the pair (index, offset) (idxen offen); a lane is in range iff index <
num_records (records of `stride` bytes): out-of-range loads read 0, stores are dropped.
"""
import struct

import numpy as np
import torch

import gfxasm.emu as emu
from asm_harness import snippet_source
from kernel_source import assemble

PROLOGUE = """
  s_load_dwordx2 s[92:93], s[0:1], 0x10      // table
  s_load_dwordx2 s[94:95], s[0:1], 0x18      // (num_records, stride << 16)
  s_waitcnt lgkmcnt(0)
  s_and_b32 s93, s93, 0xffff
  s_or_b32 s93, s93, s95
  s_mov_b32 s95, 0x20000
  global_load_dword v2, v255, s[88:89]       // index
  s_add_u32 s88, s88, 256
  s_addc_u32 s89, s89, 0
  global_load_dword v3, v255, s[88:89]       // byte offset within the record
  s_waitcnt vmcnt(0)"""

BODY = """
  buffer_load_dword v4, v[2:3], s[92:95], 0 idxen offen offset:4
  v_add_u32 v5, 7, v0
  s_waitcnt vmcnt(0)
  global_store_dword v255, v4, s[90:91]
  buffer_store_dword v5, v2, s[92:95], 0 idxen offset:8
  s_waitcnt vmcnt(0)"""


def test_idxen_load_and_store():
    rng = np.random.default_rng(21)
    stride, records = 24, 9
    table = rng.integers(0, 2**32, 6 * 16, dtype=np.uint64).astype(np.uint32)   # 16 records of 24 bytes
    index = rng.integers(0, 12, 64).astype(np.uint32)          # some beyond num_records
    offset = (4 * rng.integers(0, 3, 64)).astype(np.uint32)
    inp = torch.from_numpy(np.concatenate([index, offset]).view(np.int32).copy())
    out = torch.full((64,), -1, dtype=torch.int32)
    tab = torch.from_numpy(table.view(np.int32).copy())
    src = snippet_source(BODY, PROLOGUE, args=("inp", "out", "tab", ("records", 4), ("stride", 4)))
    kernarg = struct.pack("<QQQII", inp.data_ptr(), out.data_ptr(), tab.data_ptr(), records, stride << 16)
    emu.load(assemble(src)).kernel("snippet").launch(grid=(1, 1, 1), block=(64, 1, 1), kernarg=kernarg,
                                                     buffers=[inp, out, tab])
    words = table.copy()
    want = np.zeros(64, np.uint32)
    for lane in range(64):
        if index[lane] < records:
            want[lane] = words[(stride * index[lane] + offset[lane] + 4) // 4]
    assert out.numpy().view(np.uint32).tolist() == want.tolist()
    for lane in range(64):                         # stores in lane order: the last lane wins
        if index[lane] < records:
            words[(stride * index[lane] + 8) // 4] = lane + 7
    assert tab.numpy().view(np.uint32).tolist() == words.tolist()
