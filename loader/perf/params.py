"""Every number the static analysis and the MI355X timing model use, written once.

Each parameter carries its source: a public document, a published measurement, the
project's fact sheet (../shared/docs/gfx950-isa-facts.md), an explicit derivation, or
the word ASSUMED (an engineering estimate not pinned by a source) or FITTED (set by the
calibration against ../shared/conformance/README.md's published MI355X results; there
is one parameter set for every kernel). `PARAMS` lists them all for the README table;
`Params` is the mutable set the timing model reads, so tests can build variants.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

# The device's compute units, SIMDs and occupancy resources (VGPR/SGPR files, LDS, wave and
# workgroup slots) are the emulator's: written once, with their sources, in emu/occupancy.py.
from ..emu.occupancy import (LDS_BYTES_PER_CU, LDS_GRANULE, MAX_WAVES_PER_SIMD,  # noqa: F401 (re-exported)
                             MAX_WORKGROUPS_PER_CU, NUM_CUS, SGPR_GRANULE, SGPRS_PER_SIMD, SIMDS_PER_CU,
                             VGPR_GRANULE, VGPRS_PER_SIMD_LANE, WAVE_SIZE)

# ----------------------------------------------------------------- machine (MI355X)
CLOCK_HZ = 2.4e9            # peak engine clock; conformance README, AMD MI355X spec (2400 MHz)
# peaks (conformance README "MI355X peaks")
PEAK_FLOPS = {"bf16": 2.5e15, "fp8": 5.0e15, "fp4/fp6": 10.0e15}
HBM_BYTES_PER_S = 8.0e12
# L2 -> CU peak: 16 channels x 128 B/clk per XCD L2 (CDNA3 white paper) over 32 CUs per XCD
L2_PEAK_BYTES_PER_CLK_PER_CU = 64.0

# ----------------------------------------------------------------- issue and execution
CYCLES_PER_PASS = 4         # MFMA cycles = 4 x passes (fact sheet §2; ROCm matrix-core blog)


@dataclass
class Params:
    """The timing model's tunable parameters (cycles unless named otherwise)."""
    # A SIMD is offered one issue slot every 4 cycles (4 SIMDs share the sequencer round-robin)
    # and a wave64 VALU op occupies the SIMD16 ALU for 4 cycles. Derivation: MI355X vector
    # FP32 157.3 TFLOP/s (AMD spec) = 256 CU x 4 SIMD x 16 lanes x 2 (FMA) x 2 (packed) x 2.4 GHz.
    # Peak (boost) engine clock (Hz); the published peaks assume it. The clock a launch runs
    # at is lower under load: see sustained_clock().
    clock_hz: float = CLOCK_HZ
    # Power-limited clock (DVFS): the firmware lowers the engine clock as switching activity
    # rises (AMD ROCm blog "Measuring Max-Achievable FLOPs, Part 2": GEMM max-achievable
    # FLOPs are measured at a median clock below the boost clock; the GPU throttles under
    # dense matrix load). Modelled as f = clock_hz / (1 + power_mfma * A_mfma + power_valu * A_valu)
    # with A the chip-wide busy fraction of the matrix pipes / vector ALUs. Both FITTED.
    power_mfma: float = 0.0
    power_valu: float = 0.0
    issue_quantum: int = 4
    # One instruction per wave per issue slot; "wait states" (s_nop N = N+1) count issue slots.
    # (GCN/CDNA issue rule; the wait-state unit = one issue slot is our reading of it.)
    valu_cycles: int = 4
    # Transcendentals (v_exp/v_log/v_rcp/... : stats.TRANS_NAMES): a wave64 op keeps the ALU
    # 8 cycles on gfx950 (twice a plain VALU op). Source: ROCm/gfx950-gluon-tutorials
    # kernels/attention/README.md §2 (issue-cost table "validated against ATT instruction
    # traces" on MI355X: TRANS 8 clk, VALU 4) and its FAv3 co-issue note ("1 exp = 2 valu",
    # +5.2% measured); no ISA text states it (../shared/docs/research/valu-mfma-gfx950.md §1a).
    # BRACKET: 16 (the GCN "quarter rate" of LLVM SISchedule.td) is the pessimistic corner.
    trans_cycles: int = 8
    # A trans result reaches a dependent non-trans VALU one wait state later than a plain
    # VALU result (gfx940+ "VALU Trans Writes" hazard: LLVM hasTransForwardingHazard,
    # rocRoller's gfx94x wait-state observer): extra issue slots before it is readable.
    trans_forward_slots: int = 1
    # 32-bit integer multiplies (v_mul_lo/hi_u32, v_mul_hi_i32): quarter rate on GCN. ASSUMED.
    imul_cycles: int = 16
    # A consumer of an MFMA result (VALU, store, MFMA srcA/B) may issue P+4 wait states after
    # the MFMA (LLVM 22 gfx950 hazard table, fact sheet §4); in cycles: (P + 4 + 1) x 4.
    mfma_read_extra_slots: int = 5
    # VALU result -> MFMA operand: 2 wait states (fact sheet §4); VALU -> VALU: back to back.
    valu_to_mfma_slots: int = 3
    # VALU/MFMA co-execution (research note valu-mfma-gfx950.md §2): VALU ops issue while
    # the matrix pipe runs, except in an operand-read hold after each MFMA issue of
    # 1 + (widest A/B source, bytes per lane) / 16 issue slots, counted from the issue (12
    # cycles for v_mfma_*_32x32x64_f8f6f4 with fp8 A/B, 8 for 16-byte sources such as
    # 32x32x16 bf16, 4 = the MFMA's own slot for 8-byte ones); f32/f64-input MFMAs
    # (SGEMM/DGEMM) hold every VALU for passes + 2 slots. Source: LLVM PR #233721 (rules
    # fitted to ATT traces on MI350X; not merged, the /16 questioned in review) and, for the
    # 16-byte case, the gluon tutorials' mfma_coissue_scheduling.md (no co-issue in [0, 8)
    # clk of a 32x32x16 f16). BRACKET: mfma_hold_extra_slots -1 / 0 / +1 (never below the
    # MFMA's own slot).
    mfma_hold_extra_slots: int = 0
    # Whether the hold blocks the VALU of every wave on the SIMD ("simd": it is a register
    # read-port hold, the note's assumption) or only the issuing wave's ("wave"). BRACKET:
    # no source says; "simd" is the default and pessimistic, "wave" the optimistic corner.
    mfma_hold_scope: str = "simd"
    # Extra vector-ALU cycles of a VALU op issued while its SIMD's matrix pipe is busy. The
    # ATT-fitted rules above find no such slowdown (VALU co-executes at full rate outside
    # the hold): 0, kept for sensitivity runs (--set) only.
    valu_under_mfma_cycles: int = 0
    # A taken branch refetches: one issue slot lost. ASSUMED.
    branch_taken_cycles: int = 4
    # Memory latencies. ASSUMED, order of magnitude of published MI300X pointer-chase
    # measurements (Chips and Cheese "Testing AMD's Giant MI300X"; Tee et al., SC'25 MEMO
    # workshop "The MALL is Open"): L2 hit ~ 120 ns, MALL ~ 220 ns, HBM ~ 350+ ns.
    # Loaded latency of a global load (ns): idle pointer-chase latencies are lower bounds
    # (L2 ~120 ns, MALL ~220 ns, HBM 350+ ns on MI300X); under the load of a full GPU the
    # queues add to them. FITTED.
    global_latency_ns: float = 250.0
    # Extra latency of a load served by DRAM rather than a cache (ns), weighted by the DRAM
    # share of the op's bytes: idle MI300X pointer chase, HBM 350+ ns vs L2 ~120 ns (Chips
    # and Cheese, "Testing AMD's Giant MI300X"), carried over to MI355X: ASSUMED.
    dram_extra_latency_ns: float = 230.0
    lds_latency: int = 64           # ASSUMED (LDS load-to-use, GCN ~ 64 cycles)
    smem_latency: int = 200         # ASSUMED (scalar cache / kernarg)
    # LDS bandwidth per CU. CDNA3: 128 B/clk (AMD CDNA3 white paper). CDNA4 raised LDS
    # capacity and bandwidth (Chips and Cheese, "AMD's CDNA 4 Architecture Announcement");
    # the doubling of read bandwidth to 256 B/clk is ASSUMED from that. Writes: 128 B/clk.
    lds_read_bytes_per_clk: int = 256
    lds_write_bytes_per_clk: int = 128
    # LDS bank conflicts (counted from the emulator's lane addresses, lds_banks.py): None
    # leaves them uncharged (the calibrated set); a phase hypothesis of lds_banks.HYPOTHESES
    # adds each DS instruction's conflict cycles under it to the LDS pipe. BRACKET for
    # kernel comparisons: the measured ops are alike under all hypotheses.
    lds_conflicts: str | None = None
    # Global memory per CU: requests stream through the CU's path to L2 at this rate. Peak
    # (upper bound): MI355X L2 is 4 MB per XCD with 16 channels x 128 B/clk (CDNA3 white
    # paper figure, kept for CDNA4) shared by 32 CUs -> 64 B/clk/CU. The rate a CU sustains
    # with every CU of the XCD streaming is FITTED (L2_PEAK_BYTES_PER_CLK_PER_CU is its bound).
    l2_bytes_per_clk_per_cu: float = 64.0
    # DRAM bytes share the HBM: 8 TB/s over the CUs that run (conformance README).
    # Achieved fraction of the HBM peak for these kernels' streams. FITTED (the M <= 64
    # GEMMs stream their weights once and pin it).
    hbm_efficiency: float = 0.85
    # Vector-memory bytes one CU may have in flight (issued, not yet returned; loads, LDS
    # DMA and stores alike, cache hits and DRAM reads alike). A request that would exceed it
    # waits, in order, for earlier ones to return: Little's law with a capped window, so a
    # CU's stream rate is at most this over the loaded latency. None: no cap (the kernels'
    # own vmcnt windows only). FITTED (the bandwidth-bound M <= 64 GEMMs pin it).
    vmem_inflight_bytes: float | None = None
    # Form of the loaded DRAM latency curve (model.dram_loaded_latency): "mm1" stretches the
    # unloaded latency by 1 / (1 - rho) (open queue, exponential service), "md1" by
    # 1 + rho / (2 (1 - rho)) (constant service: Pollaczek-Khinchine). Queueing theory; which
    # one the HBM follows is what the calibration data decide.
    dram_queue: str = "mm1"
    # s_barrier: release this many cycles after the last wave arrives. ASSUMED.
    barrier_cycles: int = 16
    # Kernel launch + first-wave dispatch + drain per launch, in microseconds: what a launch
    # costs beyond its simulated round(s), back to back with others as the tuners time
    # them. FITTED (the smallest launches pin it).
    launch_overhead_us: float = 3.0

    def sustained_clock(self, mfma_busy: float, valu_busy: float) -> float:
        """Engine clock (Hz) under chip-wide busy fractions of the matrix pipes and vector ALUs."""
        return self.clock_hz / (1.0 + self.power_mfma * mfma_busy + self.power_valu * valu_busy)



# The one parameter set every estimate uses. FITTED values come from bench/calibrate.py on
# the fit half of bench/calib_points.json (aiter's MI355X tuning-table timings); one set
# for every kernel, never per kernel.
CALIBRATED = Params(power_mfma=0.49, power_valu=0.0, global_latency_ns=275.4, l2_bytes_per_clk_per_cu=26.15,
                    hbm_efficiency=0.729, launch_overhead_us=2.515, lds_conflicts="by bytes",
                    # the cap: picked on the fit half alone (mean |log ratio| 0.0721 / 0.0695 /
                    # 0.0774 at 34 / 36 / 38 KiB), with the M/D/1 queue (loader/perf/README.md)
                    vmem_inflight_bytes=36864, dram_queue="md1")
DEFAULT = CALIBRATED
# What the data cannot pin (see README.md beside this file): comparisons between kernels
# are reported as ranges over these variants of DEFAULT.
# The corners of the brackets below that move attention-like VALU-heavy kernels the most:
# every kernel comparison that quotes one figure quotes it at "default" with the range
# "optimistic"..."pessimistic" (docs/model-ruler.md).
CORNERS = {"optimistic": {"mfma_hold_scope": "wave", "mfma_hold_extra_slots": -1},
           "default": {},
           "pessimistic": {"trans_cycles": 16, "mfma_hold_extra_slots": 1}}
BRACKETS = {"default: trans 8 clk, MFMA hold 1+B/16 slots on the SIMD": {},
            "trans 16 clk": {"trans_cycles": 16},
            "MFMA hold +1 slot": {"mfma_hold_extra_slots": 1},
            "MFMA hold -1 slot, issuing wave only": CORNERS["optimistic"],
            "pessimistic corner (trans 16, hold +1)": CORNERS["pessimistic"],
            "LDS phases: ds_read_b128's groups for unmeasured ops": {"lds_conflicts": "b128 groups"},
            "LDS phases: quarter waves for unmeasured ops": {"lds_conflicts": "quarter waves"}}
HOLD_SCOPES = ("simd", "wave")
FITTED = ("power_mfma", "power_valu", "global_latency_ns", "l2_bytes_per_clk_per_cu", "hbm_efficiency",
          "launch_overhead_us", "vmem_inflight_bytes")


# name -> (value, source) for the README's parameter table.
SOURCES = {
    "CLOCK_HZ": (CLOCK_HZ, "conformance README; AMD MI355X spec"),
    "NUM_CUS": (NUM_CUS, "ROCm GPU specifications (MI355X: 256 CUs, 32 per XCD)"),
    "MAX_WAVES_PER_SIMD": (MAX_WAVES_PER_SIMD, "LLVM AMDGPUBaseInfo.cpp getMaxWavesPerEU (gfx90a-class)"),
    "VGPRS_PER_SIMD_LANE": (VGPRS_PER_SIMD_LANE, "LLVM getTotalNumVGPRs (GFX90AInsts); ROCm table VGPR file 512 KiB/CU"),
    "VGPR_GRANULE": (VGPR_GRANULE, "LLVM getVGPRAllocGranule (GFX90AInsts); fact sheet §1"),
    "SGPRS_PER_SIMD": (SGPRS_PER_SIMD, "LLVM getTotalNumSGPRs; ROCm table SGPR file 12.5 KiB/CU"),
    "SGPR_GRANULE": (SGPR_GRANULE, "LLVM getSGPRAllocGranule (gfx8-9)"),
    "MAX_WORKGROUPS_PER_CU": (MAX_WORKGROUPS_PER_CU, "LLVM getMaxWorkGroupsPerCU (MaxBarriers)"),
    "LDS_BYTES_PER_CU": (LDS_BYTES_PER_CU, "ROCm table (160 KiB); fact sheet §1"),
    "LDS_GRANULE": (LDS_GRANULE, "AMDGPUUsage GRANULATED_LDS_SIZE (128 dwords, GFX7+)"),
    "CYCLES_PER_PASS": (CYCLES_PER_PASS, "fact sheet §2 (cycles = 4 x passes)"),
    "PEAK_FLOPS": (PEAK_FLOPS, "conformance README"),
    "HBM_BYTES_PER_S": (HBM_BYTES_PER_S, "conformance README"),
    "L2_PEAK_BYTES_PER_CLK_PER_CU": (L2_PEAK_BYTES_PER_CLK_PER_CU,
                                     "CDNA3 white paper: 16 ch x 128 B/clk per XCD L2, / 32 CUs per XCD"),
}
PARAM_SOURCES = {
    "clock_hz": "AMD MI355X spec: peak engine clock 2.4 GHz (the sustained clock is sustained_clock())",
    "power_mfma": "FITTED (DVFS: clock drop per unit of chip-wide matrix-pipe busy) - bench/calibrate.py",
    "power_valu": "FITTED (DVFS: clock drop per unit of chip-wide vector-ALU busy) - bench/calibrate.py",
    "valu_under_mfma_cycles": "0: ATT-fitted co-execution rules find no slowdown outside the hold (--set only)",
    "mfma_hold_extra_slots": "BRACKET -1/0/+1 on the hold 1 + (widest A/B bytes)/16 slots after an MFMA issue (LLVM PR #233721, ATT-fitted on MI350X)",
    "mfma_hold_scope": "BRACKET simd (default, pessimistic) / wave (optimistic): whom the hold blocks; no source",
    "trans_forward_slots": "gfx940+ trans forwarding hazard: +1 wait state to a non-trans VALU reader (LLVM, rocRoller)",
    "issue_quantum": "derived: MI355X FP32 vector peak = 256x4x16x2x2x2.4 GHz -> SIMD16, wave64 in 4 cycles",
    "valu_cycles": "same derivation (one wave64 VALU op = 4 cycles; packed FP32 does 2 ops/lane in them)",
    "trans_cycles": "8: gfx950 gluon tutorials' ATT-validated cost table (MI355X); BRACKET 16 = GCN quarter rate",
    "imul_cycles": "ASSUMED: GCN quarter-rate 32-bit integer multiply",
    "mfma_read_extra_slots": "fact sheet §4: consumer P+4 wait states after an MFMA (LLVM 22 gfx950)",
    "valu_to_mfma_slots": "fact sheet §4: VALU write -> MFMA read 2 wait states",
    "branch_taken_cycles": "ASSUMED",
    "dram_extra_latency_ns": "ASSUMED: idle MI300X pointer chase, HBM 350+ ns - L2 ~120 ns (Chips and Cheese)",
    "global_latency_ns": "FITTED loaded latency (idle MI300X pointer-chase: L2 ~120 ns, MALL ~220 ns, HBM 350+ ns)",
    "lds_latency": "ASSUMED",
    "smem_latency": "ASSUMED",
    "lds_read_bytes_per_clk": "CDNA3 white paper 128 B/clk; x2 for CDNA4 ASSUMED from Chips and Cheese CDNA4 article",
    "lds_write_bytes_per_clk": "CDNA3 white paper 128 B/clk",
    "lds_conflicts": "None = bank conflicts not charged; else the lds_banks phase hypothesis they are charged under",
    "l2_bytes_per_clk_per_cu": "FITTED sustained L2->CU rate (bound: L2_PEAK_BYTES_PER_CLK_PER_CU)",
    "hbm_efficiency": "FITTED achieved fraction of the 8 TB/s HBM peak",
    "barrier_cycles": "ASSUMED",
    "launch_overhead_us": "FITTED per-launch cost beyond the simulated rounds",
    "vmem_inflight_bytes": "FITTED cap on a CU's vector-memory bytes in flight (None: no cap)",
    "dram_queue": "queueing theory: mm1 = open queue 1/(1-rho); md1 = Pollaczek-Khinchine, constant service",
}


def overrides(pairs) -> dict:
    """{field: value} from "name=value" strings (a command line's --set), each value parsed as
    the field's type in Params ("none" for None where a field may be None)."""
    types = {f.name: f.type for f in fields(Params)}
    out = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or name not in types:
            raise ValueError(f"--set takes NAME=VALUE with NAME a field of params.Params, got {pair!r}")
        kind = str(types[name])
        if text.lower() == "none" and "None" in kind:
            out[name] = None
        elif kind.startswith("int"):
            out[name] = int(text)
        elif kind.startswith("float"):
            out[name] = float(text)
        else:
            out[name] = text
    return out


def param_table(p: Params = DEFAULT) -> list[tuple[str, object, str]]:
    rows = [(k, v, s) for k, (v, s) in SOURCES.items()]
    rows += [(f.name, getattr(p, f.name), PARAM_SOURCES.get(f.name, "")) for f in fields(p)]
    return rows
