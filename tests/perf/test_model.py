"""The timing model on microkernels whose cost is known by construction."""
from __future__ import annotations

import dataclasses
import struct

import pytest
import torch

from gfxasm import perf
from gfxasm.perf import model
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


def _copy(iters, groups, params=None):
    n = groups * iters * 4096
    src = torch.empty(n, dtype=torch.uint8)
    dst = torch.empty(n, dtype=torch.uint8)
    kernarg = struct.pack("<QQ", src.data_ptr(), dst.data_ptr())
    est = perf.estimate(mk.copy(iters), grid=(groups, 1, 1), block=(64, 1, 1), kernarg=kernarg,
                        buffers=[src, dst], params=params)
    return n, est


def test_hbm_queueing_law():
    # Little's law with an open queue at the HBM: at unloaded demand a (in units of the
    # sustainable rate) a latency-bound stream gets rho = a / (1 + a) of it, and its
    # latency is stretched by 1 / (1 - rho) = 1 + a
    mm1 = dataclasses.replace(prm, dram_queue="mm1")
    assert model.hbm_utilisation(1.0, 1.0) == pytest.approx(0.5)
    assert model.hbm_utilisation(3e12, 1e12) == pytest.approx(0.75)
    unloaded = prm.global_latency_ns + prm.dram_extra_latency_ns
    assert model.dram_loaded_latency(mm1, 0.0) == pytest.approx(unloaded)
    assert model.dram_loaded_latency(mm1, 0.75) == pytest.approx(4 * unloaded)
    with pytest.raises(ValueError):
        model.dram_loaded_latency(mm1, 1.0)


def test_hbm_queueing_law_with_deterministic_service():
    # M/D/1 (Pollaczek-Khinchine, constant service): the latency stretches by
    # 1 + rho / (2 (1 - rho)); the achieved rate demand x unloaded / loaded latency must then be
    # rho x the sustainable rate, which the closed form of hbm_utilisation solves
    md1 = dataclasses.replace(prm, dram_queue="md1")
    unloaded = prm.global_latency_ns + prm.dram_extra_latency_ns
    assert model.dram_loaded_latency(md1, 0.5) == pytest.approx(1.5 * unloaded)
    for a in (0.1, 1.0, 3.0, 20.0):
        rho = model.hbm_utilisation(a, 1.0, "md1")
        assert 0.0 < rho < 1.0
        assert a * unloaded / model.dram_loaded_latency(md1, rho) == pytest.approx(rho)
        assert rho > model.hbm_utilisation(a, 1.0)           # a flatter curve than M/M/1's
    with pytest.raises(ValueError):
        model.hbm_utilisation(1.0, 1.0, "mg1")


def test_bytes_in_flight_cap_bounds_a_cu_stream():
    # 16 one-wave workgroups per CU with 4 KiB of loads each in flight: a cap of 8 KiB per CU
    # leaves at most 8 KiB in flight, each request held at least the cache latency, so the
    # CU moves at most cap / latency; a cap above what the kernel keeps in flight changes nothing
    groups, iters, cap = 4096, 8, 8192
    n, free = _copy(iters, groups)
    _, capped = _copy(iters, groups, dataclasses.replace(prm, vmem_inflight_bytes=cap))
    _, wide = _copy(iters, groups, dataclasses.replace(prm, vmem_inflight_bytes=1 << 30))
    assert wide.seconds == free.seconds
    per_cu = 2 * n / P.NUM_CUS / (capped.seconds - capped.launch_overhead_s)
    assert per_cu <= cap / (prm.global_latency_ns * 1e-9)
    assert capped.seconds > 1.5 * free.seconds


def test_copy_runs_at_the_hbm_share_with_enough_in_flight():
    iters = 16                                    # 64 KiB per 1-wave workgroup, 4 KiB loads in flight
    sustainable = P.HBM_BYTES_PER_S * prm.hbm_efficiency
    achieved = []
    for groups in (1024, 4096):                   # 4 and 16 workgroups resident per CU
        n, est = _copy(iters, groups)
        assert est.dram_bytes == pytest.approx(2 * n)
        ideal = 2 * n / sustainable
        modelled = est.seconds - est.launch_overhead_s
        assert modelled >= ideal                                     # never above the HBM's rate
        # the first pass runs at (at most) the HBM share: demand a <= 1, so rho is at most
        # the queue law's utilisation at a = 1 (1/2 under M/M/1)
        assert 0.0 < est.hbm_utilization <= model.hbm_utilisation(1.0, 1.0, prm.dram_queue) + 1e-9
        assert est.loop_iterations and max(est.loop_iterations.values()) == iters
        achieved.append(2 * n / modelled)
    # 64 KiB in flight per CU at twice the unloaded latency outruns the CU's HBM share: the
    # share binds, plus start-up round trips (kernarg, first loads) and the last stores' drain
    clock = est.clock_hz
    slack = (2 * model.dram_loaded_latency(prm, est.hbm_utilization) * 1e-9 * clock + prm.smem_latency + 64) / clock
    assert modelled <= ideal + slack
    assert achieved[0] < achieved[1]                                 # more in flight, nearer the share


def test_lanes_outside_a_buffer_move_no_bytes():
    # 64 x 1 KiB loads from a 4 KiB buffer: a range of 4096 B moves every byte, a range of
    # a quarter of it only that quarter (the other lanes read zeros without a fetch)
    src = torch.empty(4096, dtype=torch.uint8)
    kernarg = struct.pack("<Q", src.data_ptr())

    def run(records):
        return perf.estimate(mk.buffer_read(64, records), grid=(1, 1, 1), block=(64, 1, 1), kernarg=kernarg,
                             buffers=[src])

    full, quarter = run(4096), run(1024)
    assert full.requested_global_bytes == 64 * 1024
    assert quarter.requested_global_bytes == 64 * 1024 / 4
    assert quarter.cycles_per_round < full.cycles_per_round


def test_clock_falls_with_matrix_activity_and_memory_time_is_in_seconds():
    hot = dataclasses.replace(prm, power_mfma=0.5, power_valu=0.0)
    assert hot.sustained_clock(0.0, 0.0) == P.CLOCK_HZ
    assert hot.sustained_clock(1.0, 0.0) == pytest.approx(P.CLOCK_HZ / 1.5)
    # an MFMA-bound launch runs at the lower clock; its cycles do not change with the clock
    est_cold = perf.estimate(mk.mfma_chain(64), grid=(256, 1, 1), block=(64, 1, 1),
                             params=dataclasses.replace(prm, power_mfma=0.0, power_valu=0.0))
    est_hot = perf.estimate(mk.mfma_chain(64), grid=(256, 1, 1), block=(64, 1, 1), params=hot)
    assert est_hot.clock_hz < est_cold.clock_hz == P.CLOCK_HZ
    busy = est_cold.mfma_utilization              # one wave: one of the CU's four matrix pipes
    assert 0.2 < busy < 0.26
    assert est_hot.clock_hz == pytest.approx(P.CLOCK_HZ / (1 + 0.5 * busy), rel=1e-9)
    assert est_hot.cycles_per_round == est_cold.cycles_per_round


def test_bank_conflicts_are_charged_to_the_lds_pipe_only_when_asked():
    def lds_cycles(n, stride, hypothesis):
        est = perf.estimate(mk.lds_reads(n, stride), grid=(1, 1, 1), block=(64, 1, 1),
                            params=dataclasses.replace(prm, lds_conflicts=hypothesis))
        return est.cycles_per_round
    # 32-way: each of the 2 phases takes 32 cycles instead of 1 -> 62 cycles over the ideal;
    # the LDS pipe (2 cycles per conflict-free ds_read_b64) then binds, not the issue slot
    conflicted = lds_cycles(24, 256, "by bytes") - lds_cycles(8, 256, "by bytes")
    assert conflicted == 16 * (512 / prm.lds_read_bytes_per_clk + 62)
    assert lds_cycles(24, 256, None) - lds_cycles(8, 256, None) == 16 * Q      # uncharged: issue-bound
    assert lds_cycles(24, 8, "by bytes") == lds_cycles(24, 8, None)            # no conflicts, no charge
    with pytest.raises(ValueError):
        lds_cycles(8, 8, "no such hypothesis")
