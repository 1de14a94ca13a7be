"""Global atomics: lane-ordered read-modify-write, packed bf16 adds rounded per step."""
import struct

import numpy as np
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
