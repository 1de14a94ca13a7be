"""Run one instruction snippet in many independent waves at once.

    out = run_batch(body, inputs=[("v", 4), ("a", 0), ...], data=u32[G, len(inputs), 64],
                    outputs=[("v", 0), ("a", 8), ...])   # -> u32[G, len(outputs), 64]

Workgroup g (one wave of 64 lanes) loads its registers from data[g], runs `body`, and
stores the output registers to out[g]. All G waves stand at the same pc, so the
emulator runs them as one array operation: hundreds of known-answer cases cost one
launch. The kernel owns v254, v255 and s[88:95]; bodies must not touch them.
"""
from __future__ import annotations

import struct

import numpy as np
import torch

import gfxasm.emu as emu
from kernel_source import assemble, kernel_source

_CODE = """
  s_load_dwordx4 s[88:91], s[0:1], 0x0      // input buffer, output buffer
  v_and_b32 v255, 0x3ff, v0
  v_lshlrev_b32 v255, 2, v255               // byte offset of this lane
  s_mul_i32 s92, s2, {in_stride}
  s_mul_i32 s93, s2, {out_stride}
  s_waitcnt lgkmcnt(0)
  s_add_u32 s88, s88, s92
  s_addc_u32 s89, s89, 0
  s_add_u32 s90, s90, s93
  s_addc_u32 s91, s91, 0
{prologue}
  s_waitcnt vmcnt(0)
  s_nop 7
{body}
  s_nop 7
  s_nop 7
  s_nop 7
{epilogue}
  s_waitcnt vmcnt(0)
  s_endpgm"""


def batch_source(body: str, inputs, outputs, *, denorm: int = 3, fp16_ovfl: int = 0) -> str:
    prologue = []
    for kind, reg in inputs:
        target = f"v{reg}" if kind == "v" else "v254"
        prologue.append(f"  global_load_dword {target}, v255, s[88:89]")
        prologue.append("  s_add_u32 s88, s88, 256\n  s_addc_u32 s89, s89, 0")
        if kind == "a":
            prologue.append(f"  s_waitcnt vmcnt(0)\n  s_nop 1\n  v_accvgpr_write_b32 a{reg}, v254")
    epilogue = []
    for kind, reg in outputs:
        src = f"v{reg}"
        if kind == "a":
            epilogue.append(f"  v_accvgpr_read_b32 v254, a{reg}\n  s_nop 1")
            src = "v254"
        epilogue.append(f"  global_store_dword v255, {src}, s[90:91]\n"
                        "  s_add_u32 s90, s90, 256\n  s_addc_u32 s91, s91, 0")
    code = _CODE.format(prologue="\n".join(prologue), body=body, epilogue="\n".join(epilogue),
                        in_stride=256 * max(1, len(inputs)), out_stride=256 * max(1, len(outputs)))
    return kernel_source("batch", code, denorm=denorm, fp16_ovfl=fp16_ovfl)


def run_batch(body: str, inputs, data, outputs, *, denorm: int = 3, fp16_ovfl: int = 0,
              strict: bool = True) -> np.ndarray:
    data = np.ascontiguousarray(data, dtype=np.uint32)
    groups = data.shape[0]
    assert data.shape[1:] == (len(inputs), 64), data.shape
    code = assemble(batch_source(body, inputs, outputs, denorm=denorm, fp16_ovfl=fp16_ovfl))
    inp = torch.from_numpy(data.reshape(-1).view(np.int32).copy() if data.size else np.zeros(64, np.int32))
    out = torch.full((groups * max(1, len(outputs)) * 64,), -1, dtype=torch.int32)
    kernarg = struct.pack("<QQ", inp.data_ptr(), out.data_ptr())
    emu.load(code).kernel("batch").launch(grid=(groups, 1, 1), block=(64, 1, 1), kernarg=kernarg,
                                          buffers=[inp, out], strict=strict)
    return out.numpy().view(np.uint32).reshape(groups, max(1, len(outputs)), 64)[:, :len(outputs)].copy()
