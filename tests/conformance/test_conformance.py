"""Hardware-proven gfx950 code objects (../shared/conformance/) on the emulator, strict mode.

Every configuration here ran correctly on MI355X silicon and in an independent emulator
with exactly these argument layouts (../shared/conformance/README.md). A failure means the
emulator (or the recipe in cases.py) is wrong, never the kernel.
"""
from __future__ import annotations

import pytest

import gfxasm.emu as emu

from . import cases

CASES = {
    "gemm_bf16_A_256x256x512": lambda: cases.bf16_gemm(256, 256, 512),
    "gemm_bf16_B_300x512x256_tail": lambda: cases.bf16_gemm(300, 512, 256),
    "gemm_bf16_C_fp32_out": lambda: cases.bf16_gemm(256, 256, 512, out_bf16=False),
    "fmha_A_gqa2_256": lambda: cases.fmha_fwd(1, 2, 1, 256, 256),
    "fmha_B_tails_300": lambda: cases.fmha_fwd(1, 2, 2, 300, 300),
    "pa_gqa8_ctx57_282": lambda: cases.paged_attention([57, 282]),
    "pa_gqa8_ctx1_16": lambda: cases.paged_attention([1, 16]),
    "fp8gemm_A_128x256x512": lambda: cases.fp8_blockscale_gemm(128, 256, 512),
    "fp8gemm_B_100x128x256_tail": lambda: cases.fp8_blockscale_gemm(100, 128, 256),
}


@pytest.mark.parametrize("name", list(CASES))
def test_conformance(name):
    case = CASES[name]()
    kernel = emu.load(cases.CONFORMANCE_DIR / case.co).kernel(case.symbol)
    kernel.launch(grid=case.grid, block=case.block, kernarg=case.kernarg, buffers=case.buffers, strict=True)
    case.check()
