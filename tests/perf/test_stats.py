"""Static analysis on the hardware-proven code objects and on a microkernel."""
from __future__ import annotations

import pytest

from gfxasm import corpus, perf
from gfxasm.perf import cli, stats

from tests.conformance.cases import SHARED_DIR
from . import microkernels as mk

FMHA_FWD = f"{corpus.GFX950_DIR}/fmha_v3_fwd/fwd_hd128_bf16.co"
PAGED_ATTENTION = f"{corpus.GFX950_DIR}/pa/pa_bf16_noquant_gqa8_1tg_4w.co"


def test_copy_loop_found_with_its_traffic():
    s = perf.analyze(mk.copy(4))
    assert len(s.loops) == 1 and s.hottest is s.loops[0]
    m = s.hottest.mix
    assert m.counts["vmem"] == 8 and m.mfma == 0
    assert m.global_read_bytes == 4 * 1024 and m.global_write_bytes == 4 * 1024
    assert s.occupancy.workgroups_per_cu == 32          # 1-wave groups: 8 waves x 4 SIMDs


def test_mfma_cycles_are_passes_times_four():
    s = perf.analyze(mk.mfma_chain(10))
    assert s.mix.mfma == 10 and s.mix.mfma_cycles == 10 * 8 * 4
    assert s.mix.mfma_flops == 10 * 2 * 32 * 32 * 16


def test_fmha_fwd_static_facts():
    s = perf.analyze(str(corpus.path(FMHA_FWD)))
    r, o = s.registers, s.occupancy
    assert (r.vgpr_alloc, r.accum_offset, r.agpr_count, s.lds_bytes) == (256, 160, 0, 163840)
    assert (o.waves_per_workgroup, o.limit_vgpr, o.workgroups_per_cu, o.waves_per_simd) == (8, 2, 1, 2)
    assert len(s.loops) == 2                            # one loop per half of the waves
    h = s.hottest.mix
    # two 64-key KV tiles per iteration: 32 QK + 32 PV v_mfma_f32_32x32x16_bf16 per wave
    assert (h.mfma, h.mfma_cycles) == (64, 64 * 32)
    assert h.lds_dma_bytes == 8 * 1024                  # K and V tiles: 8 LDS-DMA dwordx4 per wave
    assert h.lds_read_bytes == 64 * 1024
    assert h.counts["trans"] == 66


@pytest.mark.shared_conformance
def test_gemm_uses_agprs_and_one_wave_per_simd():
    s = perf.analyze(str(SHARED_DIR / "bf16gemm_bf16_tn_256x256.co"))
    assert s.registers.vgpr_alloc == 512 and s.registers.highest_a == 255
    assert s.occupancy.limit_vgpr == 1 and s.occupancy.workgroups_per_cu == 1
    assert s.hottest.mix.mfma == 256 and s.hottest.mix.mfma_cycles == 256 * 16


def check_stats_cli(co, capsys):
    assert cli.stats_main([str(co)]) == 0
    out = capsys.readouterr().out
    assert "occupancy" in out and "hottest loop" in out
    assert cli.stats_main([str(co), "--json"]) == 0


@pytest.mark.parametrize("co", [FMHA_FWD, PAGED_ATTENTION])
def test_stats_cli_runs_on_corpus_objects(co, capsys):
    check_stats_cli(corpus.path(co), capsys)


@pytest.mark.shared_conformance
@pytest.mark.parametrize("co", ["bf16gemm_bf16_tn_256x256.co", "fp8gemm_bf16_blockscale_BpreShuffle_128x128.co"])
def test_stats_cli_runs_on_shared_conformance_objects(co, capsys):
    check_stats_cli(SHARED_DIR / co, capsys)


def test_bench_cli_runs_from_any_directory(tmp_path, monkeypatch, capsys):
    # Regression: `gfxasm bench` imported bench/ before putting the checkout on sys.path,
    # so it failed anywhere but the repository root.
    from gfxasm.perf.cli import bench_main
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r.json"
    # aiter's object needs no build (ours would need build/ to be populated first)
    assert bench_main(["--small", "--only", "(aiter)", "--out", str(out), "--png", str(tmp_path / "r.png")]) == 0
    printed = capsys.readouterr().out
    assert "fmha_fwd_hd128_bf16 (aiter)" in printed and "modelled" in printed
    assert out.is_file()


def test_stats_lds_reports_conflicts_of_a_known_launch(capsys):
    import json
    from gfxasm.manifest import default_manifest
    co = str(default_manifest().kernel("fmha_fwd_d128").variant("fmha_fwd_d128_bf16").co_path)
    assert cli.stats_main([co, "--lds", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)[0]["lds_conflicts"]
    hot = [r for r in rows if r["hottest_loop"]]
    ops = {r["op"] for r in hot}
    assert {"ds_read_b128", "ds_read_b64_tr_b16"} <= ops           # K and V reads of the main loop
    for r in hot:
        values = set(r["by_hypothesis"].values())
        assert r["measured_phases"] == (r["op"] == "ds_read_b128")
        if r["measured_phases"]:
            assert len(values) == 1                                  # a measured op has one answer
        assert r["extra_cycles_range"] == [min(values), max(values)]
        assert r["executions"] > 0


def test_stats_lds_without_a_known_launch_says_so(tmp_path, capsys):
    co = tmp_path / "copy.co"
    co.write_bytes(mk.copy(2))
    assert cli.stats_main([str(co), "--lds"]) == 0
    assert f"no known launch of {co}" in capsys.readouterr().out


def test_occupancy_rule_each_limit():
    """emu.occupancy's rule (the emulator's capacity and the model's occupancy both read it),
    one limit at a time, against the MI355X budgets worked by hand."""
    from gfxasm.emu.occupancy import occupancy
    o = occupancy(vgprs=128, sgprs=32, lds_bytes=0, workgroup_size=256)      # 512 // 128 = 4 waves/SIMD
    assert (o.limit_vgpr, o.workgroups_per_cu, o.limited_by) == (4, 4, "VGPRs")
    o = occupancy(vgprs=100, sgprs=32, lds_bytes=0, workgroup_size=256)      # 100 -> 104 allocated: 4
    assert o.limit_vgpr == 4
    o = occupancy(vgprs=32, sgprs=200, lds_bytes=0, workgroup_size=64)       # 200 -> 208: 800 // 208 = 3
    assert (o.limit_sgpr, o.workgroups_per_cu, o.limited_by) == (3, 12, "SGPRs")
    o = occupancy(vgprs=32, sgprs=32, lds_bytes=40000, workgroup_size=128)   # 40000 -> 40448 B: 4 per 160 KiB
    assert (o.limit_lds, o.workgroups_per_cu, o.limited_by) == (4, 4, "LDS")
    o = occupancy(vgprs=8, sgprs=16, lds_bytes=0, workgroup_size=128)        # 2-wave groups: 8 x 4 / 2 = 16 slots
    assert (o.workgroups_per_cu, o.limited_by) == (16, "VGPRs, workgroup slots")
    assert occupancy(vgprs=8, sgprs=16, lds_bytes=0, workgroup_size=64).workgroups_per_cu == 32
    assert occupancy(vgprs=512, sgprs=16, lds_bytes=0, workgroup_size=1024).workgroups_per_cu == 0   # 16 waves > 4
