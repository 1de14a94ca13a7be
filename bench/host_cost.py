"""Host time per op call with the kernel launch stubbed out (the backends' launch is a no-op).

    python3 bench/host_cost.py [--calls N] [--repeats R] [--wall] [--gpu-path] [--only TEXT]

What a call costs on the host before the GPU sees anything: argument checks, the plan,
kernarg packing, output allocation. Every op is measured four ways (three for
moe_align_block_size, which has no `_out` form), the attention ops six:

    gfxasm.<op>(...)                the Python function (a plain eager call on plain
                                    tensors skips torch's dispatcher)
    gfxasm.<op>(..., out=...)       the same writing the caller's outputs
    torch.ops.gfxasm.<op>           the registered op through the dispatcher
    torch.ops.gfxasm.<op>_out       its `_out` form through the dispatcher
    gfxasm.<op>(..., return_lse=True), torch.ops.gfxasm.<op>_with_lse
                                    the attention ops' call returning LSE too, and its op

so every op registered under torch.ops.gfxasm is measured (tests/test_host_cost.py holds
the bench to that).

quant_q_fp8 (batch_prefill's pre-pass for bf16 q over an FP8 cache) has no function in the
`gfxasm` namespace: its declared op (`fp8_query.QUANT_Q_FP8`) is called instead.
The torch.ops calls take exactly the positional arguments the Python function hands its
op (recorded from one call), so they track the schemas as they change. Each figure is the
best of R repeats of N back-to-back calls; by default it is the calling thread's CPU time
(time.thread_time), which other processes on a busy machine disturb far less than wall
time (--wall measures wall time instead). Both backends' launch functions are replaced by
no-ops, so neither the emulator nor HIP runs. The tensors are on the CPU: where an op reads
tensor data on the host (CPU tensors only, e.g. decode_attention's cache_seqlens check, the
M <= 2 mxfp8_gemm GEMV's scale check), that cost is included; a call on GPU tensors skips it.
--gpu-path skips those reads as a GPU call does (CPU_ONLY_DATA_READS), so the figure is what
a call on GPU tensors pays before its launch, but for one thing the CPU cannot stand in for:
batch_prefill's max seqlen_q, which a GPU call reads back from the device (a synchronisation).
The shapes are a decode step's (one token; the MoE at T = 1), the regime where host time
matters most. --only runs the cases whose label holds TEXT.

Another tree (an older commit, to compare): `git archive` it, make a folder holding one link
`gfxasm` -> its `loader/`, touch empty `build/<variant>.co` files where its objects are
missing (a stubbed launch never opens them) and run this file with that folder first on
PYTHONPATH (docs/ops.md's table: aa47a61, whose library.Op has no `direct`, ran so).
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
from gfxasm.ops import fmha, fp8_query, library                     # noqa: E402
from gfxasm.ops import mxfp8_gemm as mx                              # noqa: E402

TARGET_US = 20.0                     # issue 21: <= 20 us of host time per call, launch stubbed

# What only a call on CPU tensors runs, and what a GPU call does instead: (module, name, stand-in)
CPU_ONLY_DATA_READS = (
    (fmha, "readable", lambda call: False),     # the attention ops' reads: tables, indptr, seqlens, descales, sinks
    (mx, "_gemv_reads_data", lambda call, M: False),                  # the GEMV's scaled-overflow check
)


def skip_cpu_only_reads() -> None:
    """Replace the CPU-only data reads by what a call on GPU tensors does (--gpu-path)."""
    for module, name, stand_in in CPU_ONLY_DATA_READS:
        getattr(module, name)                  # (a renamed function fails here, not silently)
        setattr(module, name, stand_in)


def per_call_us(fn, calls: int, repeats: int, clock) -> float:
    fn()                                   # the first call plans (and is not the steady state)
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        for _ in range(calls):
            fn()
        best = min(best, (clock() - start) / calls)
    return best * 1e6


def through_dispatcher(fn):
    """A call of the registered op (torch.ops.gfxasm.<name>) with the positional arguments
    `fn` (a call of the Python function) hands it: recorded once, replayed each call."""
    recorded = []
    plain_call = library.Op.__call__
    plain_direct = library.Op.__dict__.get("direct")     # (None in a tree before the shortcut: aa47a61)

    def record(op, *args):
        recorded.append((op, args))
        return plain_call(op, *args)
    library.Op.__call__ = record
    library.Op.direct = lambda op, args: False       # the Python function's call of its op, not its shortcut
    try:
        fn()
    finally:
        library.Op.__call__ = plain_call
        if plain_direct is None:
            del library.Op.direct
        else:
            library.Op.direct = plain_direct
    (op, args), = recorded
    overload = op.op

    def replay():
        return overload(*args)
    replay.op = overload                            # (which op it measures: tests/test_host_cost.py)
    return replay


def e4m3(gen, *shape):
    """Random e4m3 codes of moderate magnitude (below 0x70), so no scale check trips."""
    return torch.randint(0, 0x70, shape, generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn)


def e8m0(gen, *shape):
    return torch.randint(118, 123, shape, generator=gen, dtype=torch.uint8).view(torch.float8_e8m0fnu)


def op_calls(gen: torch.Generator) -> dict[str, tuple]:
    """Per op: (a call of the Python function, the same with out= or None, the same with
    return_lse=True or None)."""
    bf16 = torch.bfloat16
    q = torch.randn(1, 1, 8, 128, generator=gen).to(bf16)
    k, v = (torch.randn(1, 512, 1, 128, generator=gen).to(bf16) for _ in range(2))
    o = torch.empty_like(q)
    k_pages, v_pages = (torch.randn(32, 16, 1, 128, generator=gen).to(bf16) for _ in range(2))
    table = torch.randperm(32, generator=gen).to(torch.int32).view(1, 32)
    seqlens = torch.tensor([500], dtype=torch.int32)
    qp = q.view(1, 8, 128)
    qo_indptr = torch.tensor([0, 1], dtype=torch.int32)
    op_ = torch.empty_like(qp)
    a, sa, b, sb = mx.random_operands(1, 4096, 4096, gen)
    out_mx = torch.empty(1, 4096, dtype=bf16)
    T, top_k, E, H, I = 1, 4, 16, 512, 256
    x = torch.randn(T * top_k, 2 * I, generator=gen).to(bf16)
    xq, xs = torch.empty(T * top_k, I, dtype=torch.float8_e4m3fn), torch.empty(T * top_k, I // 32, dtype=torch.float8_e8m0fnu)
    ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(T)]).to(torch.int32)
    routing = gfxasm.moe_align_block_size(ids, 16, E)
    hx, hs = e4m3(gen, T, H), e8m0(gen, T, H // 32)
    w1, w1s = e4m3(gen, E, 2 * I, H), e8m0(gen, E, 2 * I, H // 32)
    w2, w2s = e4m3(gen, E, H, I), e8m0(gen, E, H, I // 32)
    weights = torch.rand(T, top_k, generator=gen)
    gate_up = torch.empty(T * top_k, 2 * I, dtype=bf16)
    out_moe = torch.empty(T, H, dtype=bf16)
    moe = (hx, hs, w1, w1s, w2, w2s, weights, ids)
    q8, q_descale = torch.empty(qp.shape, dtype=torch.float8_e4m3fn), torch.empty(1)
    return {
        "fmha_fwd (B1 Sq1 Sk512 Hq8 Hk1)":
            (lambda: gfxasm.fmha_fwd(q, k, v), lambda: gfxasm.fmha_fwd(q, k, v, out=o),
             lambda: gfxasm.fmha_fwd(q, k, v, return_lse=True)),
        "batch_prefill (1 token over 500 paged keys)":
            (lambda: gfxasm.batch_prefill(qp, k_pages, v_pages, qo_indptr, block_table=table, seqlens_k=seqlens),
             lambda: gfxasm.batch_prefill(qp, k_pages, v_pages, qo_indptr, block_table=table, seqlens_k=seqlens,
                                          out=op_),
             lambda: gfxasm.batch_prefill(qp, k_pages, v_pages, qo_indptr, block_table=table, seqlens_k=seqlens,
                                          return_lse=True)),
        "decode_attention (Hq8 Hkv1, 500 paged keys)":
            (lambda: gfxasm.decode_attention(q, k_pages, v_pages, seqlens, block_table=table),
             lambda: gfxasm.decode_attention(q, k_pages, v_pages, seqlens, block_table=table, out=o),
             lambda: gfxasm.decode_attention(q, k_pages, v_pages, seqlens, block_table=table, return_lse=True)),
        "mxfp8_gemm (M1 N4096 K4096)":
            (lambda: gfxasm.mxfp8_gemm(a, sa, b, sb), lambda: gfxasm.mxfp8_gemm(a, sa, b, sb, out=out_mx), None),
        "swiglu_mxfp8_quant (4 x 512)":
            (lambda: gfxasm.swiglu_mxfp8_quant(x), lambda: gfxasm.swiglu_mxfp8_quant(x, out=(xq, xs)), None),
        "moe_align_block_size (T1 top4 E16)":
            (lambda: gfxasm.moe_align_block_size(ids, 16, E), None, None),
        "mxfp8_moe_gemm (gate_up, T1 top4)":
            (lambda: gfxasm.mxfp8_moe_gemm(hx, hs, w1, w1s, *routing, a_div=top_k),
             lambda: gfxasm.mxfp8_moe_gemm(hx, hs, w1, w1s, *routing, a_div=top_k, out=gate_up), None),
        "mxfp8_moe (layer, T1 top4 E16 H512 I256)":
            (lambda: gfxasm.mxfp8_moe(*moe), lambda: gfxasm.mxfp8_moe(*moe, out=out_moe), None),
        "quant_q_fp8 (batch_prefill's pre-pass, 1 token Hq8)":
            (lambda: fp8_query.QUANT_Q_FP8(qp), lambda: fp8_query.QUANT_Q_FP8(qp, out=(q8, q_descale)), None),
    }


def cases(gen: torch.Generator | None = None) -> dict[str, object]:
    """Every measured call by label."""
    measured = {}
    for op, (plain, with_out, with_lse) in op_calls(gen or torch.Generator().manual_seed(0)).items():
        measured[f"{op}: gfxasm"] = plain
        measured[f"{op}: torch.ops"] = through_dispatcher(plain)
        if with_out is not None:
            measured[f"{op}: gfxasm, out="] = with_out
            measured[f"{op}: torch.ops _out"] = through_dispatcher(with_out)
        if with_lse is not None:
            measured[f"{op}: gfxasm, return_lse"] = with_lse
            measured[f"{op}: torch.ops _with_lse"] = through_dispatcher(with_lse)
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--wall", action="store_true", help="wall time instead of the thread's CPU time")
    parser.add_argument("--gpu-path", action="store_true",
                        help="skip the data reads only CPU tensors get (CPU_ONLY_DATA_READS), as a GPU call does")
    parser.add_argument("--only", default="", help="only the cases whose label holds this text")
    ns = parser.parse_args(argv)
    if ns.gpu_path:
        skip_cpu_only_reads()
    clock = time.perf_counter if ns.wall else time.thread_time
    launched = []
    launcher.emu_backend.launch = lambda *args: launched.append(1)      # the stub: no kernel runs
    launcher.hip_backend.launch = lambda *args: launched.append(1)
    over = 0
    for label, fn in cases().items():
        if ns.only not in label:
            continue
        us = per_call_us(fn, ns.calls, ns.repeats, clock)
        over += us > TARGET_US
        print(f"{label:<62} {us:7.1f} us per call{'  (over ' + str(TARGET_US) + ')' if us > TARGET_US else ''}")
    assert launched, "the stub was never reached: nothing was measured up to the launch"
    print(f"({'wall' if ns.wall else 'CPU'} time, best of {ns.repeats} x {ns.calls} calls, launch stubbed"
          f"{', CPU-only data reads skipped' if ns.gpu_path else ''}; "
          f"{over} over {TARGET_US} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
