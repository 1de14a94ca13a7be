"""How many workgroups of a kernel one MI355X CU holds at once: the device's resources and the rule, written once.

The emulator's concurrent schedule (concurrent.resident_capacity) and the timing model
(gfxasm.perf.stats, which the emulator may not import) both ask this; both read it here.

The rule is LLVM's AMDGPUBaseInfo occupancy for gfx90a-class targets (gfx950 among them:
FeatureGFX90AInsts): waves per SIMD = min(8, VGPR file // VGPRs allocated (unified
VGPR+AGPR, granule 8), SGPR file // SGPRs allocated (granule 16)); 4 SIMDs; LDS 160 KiB in
512-byte granules; at most 16 workgroups of several waves per CU (32 of one wave).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

NUM_CUS = 256               # 8 XCDs x 32 CUs; ROCm GPU specifications table (MI355X)
SIMDS_PER_CU = 4            # LLVM AMDGPUBaseInfo getEUsPerCU (gfx9: 4)
WAVE_SIZE = 64              # gfx950 is wave64 only (fact sheet §1)
MAX_WAVES_PER_SIMD = 8      # getMaxWavesPerEU: isGFX90A -> 8
VGPRS_PER_SIMD_LANE = 512   # getTotalNumVGPRs: FeatureGFX90AInsts -> 512 (unified VGPR+AGPR);
                            # ROCm table: VGPR file 512 KiB/CU = 4 SIMD x 512 x 64 lanes x 4 B
VGPR_GRANULE = 8            # getVGPRAllocGranule / encoding granule on gfx90a+: 8
SGPRS_PER_SIMD = 800        # getTotalNumSGPRs (gfx8+): 800; ROCm table: SGPR file 12.5 KiB/CU
SGPR_GRANULE = 16           # getSGPRAllocGranule (gfx8-gfx9): 16
SGPR_ENCODING_GRANULE = 8   # the kernel descriptor's GRANULATED_WAVEFRONT_SGPR_COUNT unit (gfx6-gfx9)
MAX_WORKGROUPS_PER_CU = 16  # getMaxWorkGroupsPerCU: MaxBarriers = 16 (multi-wave workgroups)
LDS_BYTES_PER_CU = 163840   # ROCm table: LDS 160 KiB (MI355X); fact sheet §1 (llc accepts 163840)
LDS_GRANULE = 512           # LDS allocation unit: 128 dwords (AMDGPUUsage, GRANULATED_LDS_SIZE, GFX7+)


def vgpr_alloc(info) -> int:
    """Unified VGPRs the hardware allocates per wave: the kernel descriptor's granules."""
    return (info.descriptor.granulated_vgprs + 1) * VGPR_GRANULE


def sgpr_alloc(info) -> int:
    """SGPRs a wave is charged for: the larger of what the metadata declares and what the
    kernel descriptor encodes (either can be the tighter for a hand-written object; the
    larger never overstates how many waves fit)."""
    from_descriptor = (((info.descriptor.rsrc1 >> 6) & 0xF) + 1) * SGPR_ENCODING_GRANULE
    return max(int(info.metadata.get(".sgpr_count", from_descriptor)), from_descriptor)


@dataclass
class Occupancy:
    waves_per_workgroup: int
    workgroup_size: int
    lds_bytes: int
    limit_vgpr: int          # waves per SIMD allowed by the VGPR file
    limit_sgpr: int
    limit_lds: int           # workgroups per CU allowed by LDS
    workgroups_per_cu: int   # 0: one workgroup does not fit
    waves_per_simd: float    # resident waves per SIMD at that many workgroups
    limited_by: str


def occupancy(vgprs: int, sgprs: int, lds_bytes: int, workgroup_size: int) -> Occupancy:
    """Workgroups per CU of a kernel allocating `vgprs`/`sgprs` per wave and `lds_bytes` per workgroup."""
    wpg = max(1, math.ceil(workgroup_size / WAVE_SIZE))
    v_alloc = max(VGPR_GRANULE, math.ceil(vgprs / VGPR_GRANULE) * VGPR_GRANULE)
    lim_v = min(MAX_WAVES_PER_SIMD, VGPRS_PER_SIMD_LANE // v_alloc)
    s_alloc = math.ceil(max(sgprs, 1) / SGPR_GRANULE) * SGPR_GRANULE
    lim_s = min(MAX_WAVES_PER_SIMD, SGPRS_PER_SIMD // s_alloc)
    lds_alloc = math.ceil(lds_bytes / LDS_GRANULE) * LDS_GRANULE
    lim_lds = LDS_BYTES_PER_CU // lds_alloc if lds_alloc else 10 ** 6
    by_waves = (min(lim_v, lim_s) * SIMDS_PER_CU) // wpg
    cap = MAX_WORKGROUPS_PER_CU if wpg > 1 else MAX_WAVES_PER_SIMD * SIMDS_PER_CU
    wg = min(by_waves, lim_lds, cap)
    reasons = []
    if wg == by_waves:
        reasons.append("VGPRs" if lim_v <= lim_s else "SGPRs")
    if wg == lim_lds:
        reasons.append("LDS")
    if wg == cap:
        reasons.append("workgroup slots")
    return Occupancy(wpg, workgroup_size, lds_bytes, lim_v, lim_s, lim_lds, wg,
                     wg * wpg / SIMDS_PER_CU, ", ".join(reasons) or "-")


def of_kernel(info, workgroup_size: int) -> Occupancy:
    """The occupancy of a loaded kernel (its descriptor, metadata and LDS) at `workgroup_size` threads."""
    return occupancy(vgpr_alloc(info), sgpr_alloc(info), info.lds_bytes, workgroup_size)
