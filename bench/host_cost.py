"""Host time per op call with the kernel launch stubbed out (the backends' launch is a no-op).

    python3 bench/host_cost.py [--calls N] [--repeats R]

What a call costs on the host before the GPU sees anything: argument checks, the plan,
kernarg packing, output allocation. Each figure is the best of R repeats of N back-to-back
calls (wall time / N), so a busy machine shows through as little as possible; both
backends' launch functions are replaced by no-ops, so neither the emulator nor HIP runs.
Cases (CPU tensors; the device changes the host path only where an op reads tensor data on
the CPU, e.g. the M <= 2 mxfp8_gemm rows include the GEMV's scale check, which a GPU call
skips):

    mxfp8_gemm  M = 1, N = K = 4096 (bf16 out)
    fmha_fwd    B = 1, Sq = 1, Sk = 512, Hq = 8, Hk = 1 (bf16)
    decode_attention  B = 1, Sq = 1, Hq = 8, Hkv = 1, D = 128, 500 of 512 keys in pages of 16 (bf16)

each through gfxasm.<op> (the Python function, which skips torch's dispatcher in plain
eager mode), with and without out=, and through torch.ops.gfxasm.<op> / <op>_out (the
registered custom ops, dispatcher included).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # noqa: E402  (run from anywhere)
import gfxasm                                                        # noqa: E402
from gfxasm import launcher                                          # noqa: E402
from gfxasm.ops import mxfp8_gemm as mx                              # noqa: E402


def per_call_us(fn, calls: int, repeats: int) -> float:
    fn()                                   # the first call plans (and is not the steady state)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def cases():
    gen = torch.Generator().manual_seed(0)
    a, sa, b, sb = mx.random_operands(1, 4096, 4096, gen)
    q = torch.randn(1, 1, 8, 128, generator=gen).bfloat16()
    k = torch.randn(1, 512, 1, 128, generator=gen).bfloat16()
    v = torch.randn(1, 512, 1, 128, generator=gen).bfloat16()
    out_mx, out_fmha = torch.empty(1, 4096, dtype=torch.bfloat16), torch.empty_like(q)
    k_pages = torch.randn(32, 16, 1, 128, generator=gen).bfloat16()
    v_pages = torch.randn(32, 16, 1, 128, generator=gen).bfloat16()
    table = torch.randperm(32, generator=gen).to(torch.int32).view(1, 32)
    seqlens = torch.tensor([500], dtype=torch.int32)
    decode_args = (q, k_pages, v_pages, seqlens, table, None, None, None, None, None, None, True, -1, -1, None, 0.0, None)
    return {
        "mxfp8_gemm M=1 N=K=4096": lambda: gfxasm.mxfp8_gemm(a, sa, b, sb),
        "mxfp8_gemm M=1 N=K=4096, out=": lambda: gfxasm.mxfp8_gemm(a, sa, b, sb, out=out_mx),
        "torch.ops.gfxasm.mxfp8_gemm (dispatcher)":
            lambda: torch.ops.gfxasm.mxfp8_gemm(a, sa, b, sb, torch.bfloat16, "auto", None),
        "torch.ops.gfxasm.mxfp8_gemm_out (dispatcher)":
            lambda: torch.ops.gfxasm.mxfp8_gemm_out(a, sa, b, sb, out_mx, torch.bfloat16, "auto", None),
        "fmha_fwd Sq=1 Sk=512 Hq=8 Hk=1": lambda: gfxasm.fmha_fwd(q, k, v),
        "fmha_fwd Sq=1 Sk=512 Hq=8 Hk=1, out=": lambda: gfxasm.fmha_fwd(q, k, v, out=out_fmha),
        "torch.ops.gfxasm.fmha_fwd (dispatcher)":
            lambda: torch.ops.gfxasm.fmha_fwd(q, k, v, False, None, -1, -1, None, 0.0, False),
        "torch.ops.gfxasm.fmha_fwd_out (dispatcher)":
            lambda: torch.ops.gfxasm.fmha_fwd_out(q, k, v, out_fmha, None, False, None, -1, -1, None, 0.0),
        "decode_attention Hq=8 Hkv=1 512 keys": lambda: gfxasm.decode_attention(q, k_pages, v_pages, seqlens,
                                                                                block_table=table),
        "decode_attention Hq=8 Hkv=1 512 keys, out=":
            lambda: gfxasm.decode_attention(q, k_pages, v_pages, seqlens, block_table=table, out=out_fmha),
        "torch.ops.gfxasm.decode_attention (dispatcher)":
            lambda: torch.ops.gfxasm.decode_attention(*decode_args, False),
        "torch.ops.gfxasm.decode_attention_out (dispatcher)":
            lambda: torch.ops.gfxasm.decode_attention_out(*decode_args, out_fmha, None),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    ns = parser.parse_args(argv)
    launched = []
    launcher.emu_backend.launch = lambda *args: launched.append(1)      # the stub: no kernel runs
    launcher.hip_backend.launch = lambda *args: launched.append(1)
    for label, fn in cases().items():
        print(f"{label:<50} {per_call_us(fn, ns.calls, ns.repeats):7.1f} us per call (best of {ns.repeats} x "
              f"{ns.calls} calls, launch stubbed)")
    assert launched, "the stub was never reached: nothing was measured up to the launch"
    return 0


if __name__ == "__main__":
    sys.exit(main())
