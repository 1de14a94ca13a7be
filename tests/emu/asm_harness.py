"""Run a few gfx950 instructions on the emulator with chosen register inputs.

    out = run_snippet("v_add_f32 v2, v0, v1", vgprs={0: a, 1: b}, outputs=["v2"])

Inputs are per-lane uint32 arrays (64 lanes) for VGPRs/AGPRs and uint32 scalars for
SGPRs; they are loaded from a buffer by a generated prologue (with the waits the
strict emulator demands), then the snippet runs, then a generated epilogue stores the
requested registers. The harness owns v255, v254 and s[88:91]; snippets must not
touch them.
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
  s_waitcnt lgkmcnt(0)
{prologue}
  s_waitcnt vmcnt(0) lgkmcnt(0)
  s_nop 7
{body}
  s_nop 7
  s_nop 7
  s_nop 7
{epilogue}
  s_waitcnt vmcnt(0)
  s_endpgm"""


def snippet_source(body: str, prologue: str = "", epilogue: str = "", *, lds: int = 0, denorm: int = 3,
                   ieee: int = 1, args=("inp", "out")) -> str:
    """The harness kernel `snippet` around `body`: s[88:89] = inputs, s[90:91] = outputs."""
    code = _CODE.format(prologue=prologue, body=body, epilogue=epilogue)
    return kernel_source("snippet", code, args=args, lds=lds, denorm=denorm, ieee=ieee)


def _reg(name: str) -> tuple[str, int]:
    return name[0], int(name[1:])


def run_snippet(body: str, *, vgprs=None, agprs=None, sgprs=None, outputs=(), lds_bytes: int = 0,
                denorm: int = 3, ieee: int = 1, strict: bool = True, exec_mask: int | None = None,
                waive=()) -> dict[str, np.ndarray]:
    """Run `body` in one wave; returns {register name: uint32[64] (or a scalar for SGPRs)}."""
    vgprs, agprs, sgprs = dict(vgprs or {}), dict(agprs or {}), dict(sgprs or {})
    slots = [("v", r, np.asarray(v, np.uint32)) for r, v in vgprs.items()]
    slots += [("a", r, np.asarray(v, np.uint32)) for r, v in agprs.items()]
    prologue = []
    data = []
    for n, (kind, reg, values) in enumerate(slots):
        assert values.shape == (64,), "vector inputs are 64 lanes"
        target = f"v{reg}" if kind == "v" else "v254"
        prologue.append(f"  global_load_dword {target}, v255, s[88:89] offset:{0}")
        prologue.append(f"  s_add_u32 s88, s88, 256\n  s_addc_u32 s89, s89, 0")
        if kind == "a":
            prologue.append("  s_waitcnt vmcnt(0)\n  s_nop 1")
            prologue.append(f"  v_accvgpr_write_b32 a{reg}, v254")
        data.append(values)
    for n, (reg, value) in enumerate(sgprs.items()):
        prologue.append(f"  s_load_dword s{reg}, s[88:89], {4 * n:#x}")
    if sgprs:
        prologue.append("  s_waitcnt lgkmcnt(0)")
        data.append(np.array(list(sgprs.values()) + [0] * (64 - len(sgprs)), np.uint32))
    if exec_mask is not None:
        prologue.append(f"  s_mov_b32 exec_lo, {exec_mask & 0xFFFFFFFF:#x}\n  s_mov_b32 exec_hi, {exec_mask >> 32:#x}")
    epilogue = []
    if exec_mask is not None:
        epilogue.append("  s_mov_b64 exec, -1")
    for reg in outputs:
        kind, index = _reg(reg)
        if kind == "s":
            epilogue.append(f"  v_mov_b32 v254, s{index}\n  s_nop 1")
            src = "v254"
        elif kind == "a":
            epilogue.append(f"  v_accvgpr_read_b32 v254, a{index}\n  s_nop 1")
            src = "v254"
        else:
            src = f"v{index}"
        epilogue.append(f"  global_store_dword v255, {src}, s[90:91]\n  s_add_u32 s90, s90, 256\n  s_addc_u32 s91, s91, 0")
    source = snippet_source(body, "\n".join(prologue), "\n".join(epilogue), lds=lds_bytes, denorm=denorm, ieee=ieee)
    inp = torch.from_numpy(np.concatenate(data).view(np.int32) if data else np.zeros(64, np.int32)).clone()
    out = torch.full((max(1, len(outputs)) * 64,), -1, dtype=torch.int32)
    kernarg = struct.pack("<QQ", inp.data_ptr(), out.data_ptr())
    emu.load(assemble(source)).kernel("snippet").launch(grid=(1, 1, 1), block=(64, 1, 1), kernarg=kernarg,
                                                        buffers=[inp, out], strict=strict, waive=waive)
    res = out.numpy().view(np.uint32).reshape(-1, 64)
    return {reg: (res[n][0] if reg[0] == "s" else res[n].copy()) for n, reg in enumerate(outputs)}
