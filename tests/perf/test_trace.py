"""Timing mode (gfxasm.perf.trace): vector ops whose results reach nothing the trace records
are skipped, and the trace is the same as with every op run."""
from __future__ import annotations

import numpy as np
import pytest

from gfxasm import emu
from gfxasm.perf import aiter_f4gemm, trace
from gfxasm.perf.estimator import _dims, representative_workgroups
from gfxasm.perf.stats import analyze_kernel, classify

from .microkernels import assemble

# A loop whose body loads, computes a value only stored (v3, v7), advances its address
# across the back edge (v1), overwrites a register before using it as an address (v5) and
# reads LDS (v8).
LOOP = """
  s_load_dwordx4 s[4:7], s[0:1], 0x0
  v_and_b32 v0, 0x3ff, v0
  v_lshlrev_b32 v1, 2, v0
  v_mov_b32 v5, 7
  s_mov_b32 s10, 4
  s_waitcnt lgkmcnt(0)
L_loop:
  global_load_dword v2, v1, s[4:5]
  s_waitcnt vmcnt(0)
  v_mul_f32 v3, v2, v2
  v_exp_f32 v3, v3
  v_cmp_gt_u32 vcc, 32, v0
  s_and_b64 s[8:9], vcc, exec
  global_store_dword v1, v3, s[6:7]
  {advance}
  v_mov_b32 v5, v3
  v_mov_b32 v5, v0
  global_store_dword v5, v3, s[6:7]
  v_max_f32 v7, v3, v5
  ds_write_b32 v0, v7
  ds_read_b32 v8, v0 offset:4
  {lds_use}
  s_sub_u32 s10, s10, 1
  s_cmp_lg_u32 s10, 0
  s_cbranch_scc1 L_loop
"""


def _dead_texts(body: str) -> set[str]:
    k = emu.load(assemble("dead_ops", body, threads=64, lds=256)).kernel("dead_ops")
    insts = k.program.insts
    mfma = {n for n, i in enumerate(insts) if classify(i) == "mfma"}
    return {insts[n].text for n in trace.dead_ops(insts, mfma)}


def test_only_ops_feeding_addresses_exec_or_branches_are_kept():
    dead = _dead_texts(LOOP.format(advance="v_add_u32 v1, 0x100, v1", lds_use="v_mov_b32 v9, v8"))
    assert dead == {"v_mov_b32_e32 v5, 7",           # overwritten before its only use
                    "v_mul_f32_e32 v3, v2, v2",      # v3: stored data only
                    "v_exp_f32_e32 v3, v3",
                    "v_mov_b32_e32 v5, v3",          # overwritten by v5 = v0 (an address)
                    "v_max_f32_e32 v7, v3, v5",      # LDS data; what comes back feeds nothing:
                    "ds_read_b32 v8, v0 offset:4",   # the read only counts its addresses
                    "v_mov_b32_e32 v9, v8"}
    # kept: v0/v1 (addresses; v1's advance is read across the back edge), the compare
    # (VCC feeds a scalar op), v5 = v0 (an address)


def test_stored_data_is_kept_once_a_load_result_reaches_an_address():
    # the loaded value now advances the address: a store could hand it back, so what is
    # stored to global memory is needed; LDS data (its read feeds nothing) still is not
    dead = _dead_texts(LOOP.format(advance="v_add_u32 v1, v2, v1", lds_use=""))
    assert dead == {"v_mov_b32_e32 v5, 7", "v_mov_b32_e32 v5, v3", "v_max_f32_e32 v7, v3, v5",
                    "ds_read_b32 v8, v0 offset:4"}
    # and an LDS read whose value becomes an address makes what is written to LDS needed
    dead = _dead_texts(LOOP.format(advance="v_add_u32 v1, 0x100, v1", lds_use="v_add_u32 v1, v8, v1"))
    assert dead == {"v_mov_b32_e32 v5, 7", "v_mov_b32_e32 v5, v3"}


def test_indirect_register_indexing_disables_the_pruning():
    body = LOOP.format(advance="v_add_u32 v1, 0x100, v1", lds_use="").replace(
        "  v_mov_b32 v5, 7", "  s_set_gpr_idx_on s10, gpr_idx(SRC0)\n  v_mov_b32 v6, v3\n  s_set_gpr_idx_off\n  v_mov_b32 v5, 7")
    assert _dead_texts(body) == set()


def _aiter_fmha():
    from bench.bench_conformance import fmha_case
    return fmha_case(1, 2, 1, 512).__dict__


def _aiter_f4gemm():
    cfg = aiter_f4gemm.configs()["_ZN5aiter41f4gemm_bf16_per1x32Fp4_BpreShuffle_32x128E"]
    return aiter_f4gemm.launch(cfg, 20, 384, 1024)


def _aiter_bf16gemm():
    from bench.bench_conformance import gemm_bf16_case
    return gemm_bf16_case(300, 256, 512).__dict__


LAUNCHES = {"aiter fmha fwd B1 H2/1 S512": _aiter_fmha, "aiter f4gemm 32x128 M20 N384 K1024": _aiter_f4gemm,
            "aiter bf16gemm 256x256 M300 N256 K512": _aiter_bf16gemm}
ON_SHARED = {"aiter bf16gemm 256x256 M300 N256 K512"}      # its object is a ../shared/conformance one


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.shared_conformance) if n in ON_SHARED else n
                                  for n in LAUNCHES])
def test_skipping_dead_ops_leaves_the_trace_unchanged(name):
    kw = LAUNCHES[name]()
    k = emu.load(kw["co"]).kernel(kw["kernel"])
    grid, block = _dims(kw["grid"]), _dims(kw["block"])
    per_cu = analyze_kernel(k, block[0] * block[1] * block[2]).occupancy.workgroups_per_cu
    chosen = representative_workgroups(grid, max(1, per_cu), 1)
    mfma = {n for n, i in enumerate(k.program.insts) if classify(i) == "mfma"}
    assert trace.dead_ops(k.program.insts, mfma), "nothing to skip: the comparison would be vacuous"
    fast = trace.record(k, grid, block, kw["kernarg"], kw["buffers"], chosen)
    full = trace.record(k, grid, block, kw["kernarg"], kw["buffers"], chosen, skip_dead=False)
    assert [(w["group"], w["wave"]) for w in fast.waves] == [(w["group"], w["wave"]) for w in full.waves]
    for a, b in zip(fast.waves, full.waves):
        assert np.array_equal(a["stream"], b["stream"])
    for a, b in zip(fast.mem_lanes, full.mem_lanes):
        assert np.array_equal(a, b)
    assert (fast.touched, fast.requested, fast.inst_buffers, fast.in_range) == \
        (full.touched, full.requested, full.inst_buffers, full.in_range)
    assert fast.lds_conflicts.keys() == full.lds_conflicts.keys()
    for n, c in fast.lds_conflicts.items():
        assert c == full.lds_conflicts[n]
    assert fast.wave_instructions == full.wave_instructions
    # what gfxasm.perf.grid's probes record: the same streams and lanes, nothing of memory
    bare = trace.record(k, grid, block, kw["kernarg"], kw["buffers"], chosen, detail=False)
    for a, b in zip(bare.waves, full.waves):
        assert np.array_equal(a["stream"], b["stream"])
    for a, b in zip(bare.mem_lanes, full.mem_lanes):
        assert np.array_equal(a, b)
    assert len(bare.waves) == len(full.waves) and not bare.touched and not bare.lds_conflicts
