"""The timing model on microkernels whose cost is known by construction."""
from __future__ import annotations

import struct

import pytest
import torch

from gfxasm import perf
from gfxasm.perf import params as P

from . import microkernels as mk

prm = P.DEFAULT
Q = prm.issue_quantum


def cycles(co: bytes, waves: int = 1) -> float:
    est = perf.estimate(co, grid=(1, 1, 1), block=(64 * waves, 1, 1))
    assert est.rounds == 1
    return est.cycles_per_round


def delta(make, n1: int, n2: int, waves: int = 1) -> float:
    """Extra cycles of n2 over n1 repetitions: the steady-state cost, free of prologue."""
    return cycles(make(n2), waves) - cycles(make(n1), waves)


def test_dependent_accumulating_mfma_chain_runs_at_pipe_rate():
    # srcC == vdst needs no wait states: each 8-pass MFMA starts when the previous leaves the pipe.
    assert delta(mk.mfma_chain, 16, 32) == 16 * 8 * P.CYCLES_PER_PASS


def test_mfma_result_as_operand_waits_for_writeback():
    # srcA = previous result: issue P+4 wait states after the producer (fact sheet §4).
    per = 4 * P.CYCLES_PER_PASS + prm.mfma_read_extra_slots * Q
    assert delta(mk.mfma_dependent, 8, 24) == 16 * per


def test_independent_mfmas_on_four_waves_use_four_simds():
    one = delta(mk.mfma_chain, 16, 32, waves=1)
    assert delta(mk.mfma_chain, 16, 32, waves=4) == one          # one wave per SIMD
    assert delta(mk.mfma_chain, 16, 32, waves=8) == 2 * one      # two waves share each matrix pipe


def test_valu_and_transcendental_issue_cost():
    assert delta(mk.valu_stream, 32, 96) == 64 * prm.valu_cycles
    exp = lambda n: mk.valu_stream(n, "v_exp_f32 v{d}, v20")       # noqa: E731
    assert delta(exp, 32, 96) == 64 * prm.trans_cycles


def test_bandwidth_bound_copy_runs_at_the_hbm_share():
    iters, groups = 16, 1024                      # 64 KiB per workgroup, 64 MiB each way
    n = groups * iters * 4096
    src = torch.empty(n, dtype=torch.uint8)
    dst = torch.empty(n, dtype=torch.uint8)
    kernarg = struct.pack("<QQ", src.data_ptr(), dst.data_ptr())
    est = perf.estimate(mk.copy(iters), grid=(groups, 1, 1), block=(64, 1, 1), kernarg=kernarg,
                        buffers=[src, dst])
    assert est.dram_bytes == pytest.approx(2 * n)
    ideal = 2 * n / (P.HBM_BYTES_PER_S * prm.hbm_efficiency)
    modelled = est.seconds - est.launch_overhead_s
    # by construction: the bytes over the HBM share, plus the start-up round trips (kernarg
    # load, first loads) and the last stores' drain: a few memory latencies in all
    clock = est.clock_hz
    latency = (prm.global_latency_ns + prm.dram_extra_latency_ns) * 1e-9 * clock
    slack = (2 * latency + prm.smem_latency + 64) / clock
    assert ideal <= modelled <= ideal + slack
    assert est.loop_iterations and max(est.loop_iterations.values()) == iters
