"""Known-answer tests for the scalar ALU and program control (families/sop.py).

References are plain-Python transcriptions of the ISA's operation descriptions (32/64-bit
two's complement; SCC rules per instruction: carry/borrow for the u32 add/sub family,
signed overflow for s_add_i32/s_sub_i32/s_addk_i32, "result != 0" for logic, shifts and
bit-field ops, the comparison result for compares and s_min/s_max). Several random
inputs per kernel, each kernel assembled once.
"""
import numpy as np
import pytest

from asm_harness import run_snippet

M32, M64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF


def sx(x, bits=32):
    x &= (1 << bits) - 1
    return x - (1 << bits) if x >> (bits - 1) else x


def inputs(seed, n=12):
    """n random u32 values, with some edge values mixed in."""
    r = np.random.default_rng(seed)
    vals = [int(v) for v in r.integers(0, 2**32, n, dtype=np.uint64)]
    edges = [0, 1, M32, 0x80000000, 0x7FFFFFFF, 31, 32, 33, 63]
    for k in range(n // 3):
        vals[int(r.integers(0, n))] = edges[int(r.integers(0, len(edges)))]
    return vals


def run(cases, seed):
    """cases: [(asm, [(out sgpr, ref(in) -> value)])]; inputs in s10..s21."""
    ins = inputs(seed)
    sgprs = {10 + k: v for k, v in enumerate(ins)}
    body, outs = [], []
    for asm, checks in cases:
        body.append(asm)
        outs += checks
    out = run_snippet("\n".join(body) + "\n", sgprs=sgprs, outputs=[o for o, _ in outs])
    s = {10 + k: v for k, v in enumerate(ins)}
    for name, ref in outs:
        assert int(out[name]) == ref(s) & M32, (name, [hex(v) for v in ins])


def scc_to(reg):
    return f"  s_cselect_b32 {reg}, 1, 0"


SEEDS = [1, 2, 3]

# ------------------------------------------------------------ add/sub carries
ARITH = [
    # 64-bit add of (s11:s10) + (s13:s12) through s_add_u32 / s_addc_u32
    ("  s_add_u32 s30, s10, s12\n" + scc_to("s31") + "\n  s_addc_u32 s32, s11, s13\n" + scc_to("s33"),
     [("s30", lambda s: s[10] + s[12]), ("s31", lambda s: (s[10] + s[12]) >> 32),
      ("s32", lambda s: s[11] + s[13] + ((s[10] + s[12]) >> 32)),
      ("s33", lambda s: (s[11] + s[13] + ((s[10] + s[12]) >> 32)) >> 32)]),
    ("  s_sub_u32 s34, s10, s12\n" + scc_to("s35") + "\n  s_subb_u32 s36, s11, s13\n" + scc_to("s37"),
     [("s34", lambda s: s[10] - s[12]), ("s35", lambda s: int(s[12] > s[10])),
      ("s36", lambda s: s[11] - s[13] - int(s[12] > s[10])),
      ("s37", lambda s: int(s[13] + int(s[12] > s[10]) > s[11]))]),
    ("  s_add_i32 s38, s14, s15\n" + scc_to("s39"),
     [("s38", lambda s: s[14] + s[15]), ("s39", lambda s: int(not -2**31 <= sx(s[14]) + sx(s[15]) < 2**31))]),
    ("  s_sub_i32 s40, s14, s15\n" + scc_to("s41"),
     [("s40", lambda s: s[14] - s[15]), ("s41", lambda s: int(not -2**31 <= sx(s[14]) - sx(s[15]) < 2**31))]),
    ("  s_mul_i32 s42, s14, s15\n  s_mul_hi_u32 s43, s14, s15\n  s_mul_hi_i32 s44, s14, s15",
     [("s42", lambda s: s[14] * s[15]), ("s43", lambda s: (s[14] * s[15]) >> 32),
      ("s44", lambda s: (sx(s[14]) * sx(s[15])) >> 32)]),
    ("  s_min_i32 s45, s14, s16\n" + scc_to("s46") + "\n  s_max_u32 s47, s14, s16\n" + scc_to("s48"),
     [("s45", lambda s: s[14] if sx(s[14]) < sx(s[16]) else s[16]), ("s46", lambda s: int(sx(s[14]) < sx(s[16]))),
      ("s47", lambda s: max(s[14], s[16])), ("s48", lambda s: int(s[14] > s[16]))]),
    ("  s_min_u32 s49, s14, s16\n  s_max_i32 s50, s14, s16",
     [("s49", lambda s: min(s[14], s[16])), ("s50", lambda s: s[14] if sx(s[14]) > sx(s[16]) else s[16])]),
    ("  s_mov_b32 s51, s17\n  s_addk_i32 s51, 0x8123\n" + scc_to("s52") + "\n  s_mov_b32 s53, s17\n  s_mulk_i32 s53, 0x7ff1"
     + "\n  s_movk_i32 s54, 0xfedc",
     [("s51", lambda s: s[17] - 0x10000 + 0x8123),
      ("s52", lambda s: int(not -2**31 <= sx(s[17]) + sx(0x8123, 16) < 2**31)),
      ("s53", lambda s: sx(s[17]) * 0x7ff1), ("s54", lambda s: sx(0xfedc, 16))]),
    ("  s_lshl2_add_u32 s55, s18, s19\n  s_lshl4_add_u32 s56, s18, s19",
     [("s55", lambda s: (s[18] << 2) + s[19]), ("s56", lambda s: (s[18] << 4) + s[19])]),
]


@pytest.mark.parametrize("seed", SEEDS)
def test_arithmetic_carries_and_overflow(seed):
    run(ARITH, 100 + seed)


# ------------------------------------------------------------------- shifts
SHIFTS = [
    ("  s_lshl_b32 s30, s10, s11\n" + scc_to("s31"),
     [("s30", lambda s: s[10] << (s[11] & 31)), ("s31", lambda s: int((s[10] << (s[11] & 31)) & M32 != 0))]),
    ("  s_lshr_b32 s32, s10, s11\n" + scc_to("s33"),
     [("s32", lambda s: s[10] >> (s[11] & 31)), ("s33", lambda s: int(s[10] >> (s[11] & 31) != 0))]),
    ("  s_ashr_i32 s34, s10, s11\n" + scc_to("s35"),
     [("s34", lambda s: sx(s[10]) >> (s[11] & 31)), ("s35", lambda s: int(sx(s[10]) >> (s[11] & 31) != 0))]),
    ("  s_lshl_b64 s[36:37], s[12:13], s14\n" + scc_to("s38"),
     [("s36", lambda s: (s[12] | s[13] << 32) << (s[14] & 63)),
      ("s37", lambda s: (((s[12] | s[13] << 32) << (s[14] & 63)) & M64) >> 32),
      ("s38", lambda s: int(((s[12] | s[13] << 32) << (s[14] & 63)) & M64 != 0))]),
    ("  s_lshr_b64 s[40:41], s[12:13], s14",
     [("s40", lambda s: (s[12] | s[13] << 32) >> (s[14] & 63)),
      ("s41", lambda s: ((s[12] | s[13] << 32) >> (s[14] & 63)) >> 32)]),
    ("  s_ashr_i64 s[42:43], s[12:13], s15",
     [("s42", lambda s: sx(s[12] | s[13] << 32, 64) >> (s[15] & 63)),
      ("s43", lambda s: (sx(s[12] | s[13] << 32, 64) >> (s[15] & 63)) >> 32)]),
]


@pytest.mark.parametrize("seed", SEEDS)
def test_shifts(seed):
    run(SHIFTS, 200 + seed)


# --------------------------------------------------------- bit-field / bit ops
def bfe(x, ctl, signed):
    off, width = ctl & 31, (ctl >> 16) & 0x7F
    width = min(width, 32)
    v = (x >> off) & ((1 << width) - 1)
    if signed and width and (v >> (width - 1)) & 1:
        v -= 1 << width
    return v


def ff1(x):
    return (x & -x).bit_length() - 1 if x else M32


def flbit(x):
    return 32 - x.bit_length() if x else M32


BITS = [
    ("  s_bfe_u32 s30, s10, s11\n" + scc_to("s31") + "\n  s_bfe_i32 s32, s10, s11\n" + scc_to("s33"),
     [("s30", lambda s: bfe(s[10], s[11], False)), ("s31", lambda s: int(bfe(s[10], s[11], False) != 0)),
      ("s32", lambda s: bfe(s[10], s[11], True)), ("s33", lambda s: int(bfe(s[10], s[11], True) != 0))]),
    ("  s_bfm_b32 s34, s12, s13",
     [("s34", lambda s: ((1 << (s[12] & 31)) - 1) << (s[13] & 31))]),
    ("  s_brev_b32 s35, s10\n  s_ff1_i32_b32 s36, s14\n  s_flbit_i32_b32 s37, s14",
     [("s35", lambda s: int(f"{s[10]:032b}"[::-1], 2)), ("s36", lambda s: ff1(s[14])),
      ("s37", lambda s: flbit(s[14]))]),
    ("  s_bcnt1_i32_b32 s38, s10\n" + scc_to("s39") + "\n  s_bcnt0_i32_b32 s40, s10",
     [("s38", lambda s: bin(s[10]).count("1")), ("s39", lambda s: int(s[10] != 0)),
      ("s40", lambda s: 32 - bin(s[10]).count("1"))]),
    ("  s_sext_i32_i8 s41, s10\n  s_sext_i32_i16 s42, s10\n  s_abs_i32 s43, s15\n" + scc_to("s44"),
     [("s41", lambda s: sx(s[10] & 0xFF, 8)), ("s42", lambda s: sx(s[10] & 0xFFFF, 16)),
      ("s43", lambda s: abs(sx(s[15]))), ("s44", lambda s: int(abs(sx(s[15])) & M32 != 0))]),
    ("  s_and_b32 s45, s10, s15\n" + scc_to("s46") + "\n  s_andn2_b32 s47, s10, s15\n  s_orn2_b32 s48, s10, s15"
     "\n  s_nand_b32 s49, s10, s15\n  s_xnor_b32 s50, s10, s15\n  s_nor_b32 s51, s10, s15\n  s_not_b32 s52, s16",
     [("s45", lambda s: s[10] & s[15]), ("s46", lambda s: int(s[10] & s[15] != 0)),
      ("s47", lambda s: s[10] & ~s[15]), ("s48", lambda s: s[10] | ~s[15]), ("s49", lambda s: ~(s[10] & s[15])),
      ("s50", lambda s: ~(s[10] ^ s[15])), ("s51", lambda s: ~(s[10] | s[15])), ("s52", lambda s: ~s[16])]),
    ("  s_xor_b64 s[54:55], s[10:11], s[12:13]\n  s_andn2_b64 s[56:57], s[10:11], s[12:13]",
     [("s54", lambda s: s[10] ^ s[12]), ("s55", lambda s: s[11] ^ s[13]),
      ("s56", lambda s: s[10] & ~s[12]), ("s57", lambda s: s[11] & ~s[13])]),
    ("  s_pack_ll_b32_b16 s58, s10, s11\n  s_pack_lh_b32_b16 s59, s10, s11\n  s_pack_hh_b32_b16 s60, s10, s11",
     [("s58", lambda s: (s[10] & 0xFFFF) | (s[11] & 0xFFFF) << 16),
      ("s59", lambda s: (s[10] & 0xFFFF) | (s[11] & 0xFFFF0000)),
      ("s60", lambda s: (s[10] >> 16) | (s[11] & 0xFFFF0000))]),
]


@pytest.mark.parametrize("seed", SEEDS)
def test_bit_ops(seed):
    run(BITS, 300 + seed)


# ----------------------------------------------------------------- compares
def cmp_cases():
    ops = {"eq": lambda a, b: a == b, "lg": lambda a, b: a != b, "gt": lambda a, b: a > b,
           "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b}
    cases, reg = [], 30
    for name, f in ops.items():
        for ty in ("i32", "u32"):
            conv = sx if ty == "i32" else (lambda x: x)
            cases.append((f"  s_cmp_{name}_{ty} s10, s11\n" + scc_to(f"s{reg}"),
                          [(f"s{reg}", lambda s, f=f, c=conv: int(f(c(s[10]), c(s[11]))))]))
            cases.append((f"  s_cmp_{name}_{ty} s12, s12\n" + scc_to(f"s{reg + 1}"),
                          [(f"s{reg + 1}", lambda s, f=f: int(f(0, 0)))]))
            k = 0x8765 if ty == "i32" else 0x1234
            kv = sx(k, 16) if ty == "i32" else k
            cases.append((f"  s_cmpk_{name}_{ty} s13, {k:#x}\n" + scc_to(f"s{reg + 2}"),
                          [(f"s{reg + 2}", lambda s, f=f, c=conv, kv=kv: int(f(c(s[13]), kv)))]))
            reg += 3
    cases.append(("  s_cmp_eq_u64 s[10:11], s[12:13]\n" + scc_to(f"s{reg}") +
                  "\n  s_cmp_lg_u64 s[10:11], s[10:11]\n" + scc_to(f"s{reg + 1}") +
                  "\n  s_bitcmp1_b32 s10, s14\n" + scc_to(f"s{reg + 2}") +
                  "\n  s_bitcmp0_b32 s10, s14\n" + scc_to(f"s{reg + 3}"),
                  [(f"s{reg}", lambda s: int(s[10] == s[12] and s[11] == s[13])), (f"s{reg + 1}", lambda s: 0),
                   (f"s{reg + 2}", lambda s: (s[10] >> (s[14] & 31)) & 1),
                   (f"s{reg + 3}", lambda s: 1 - ((s[10] >> (s[14] & 31)) & 1))]))
    return cases


@pytest.mark.parametrize("seed", SEEDS)
def test_compares(seed):
    run(cmp_cases(), 400 + seed)


# ---------------------------------------------------------- exec / branches
def test_saveexec_family():
    r = np.random.default_rng(500)
    e, v = (int(x) for x in r.integers(0, 2**64, 2, dtype=np.uint64))
    body = ""
    refs = {"and": lambda e, s: s & e, "or": lambda e, s: s | e, "xor": lambda e, s: s ^ e,
            "andn2": lambda e, s: s & ~e, "orn2": lambda e, s: s | ~e, "andn1": lambda e, s: ~s & e}
    outs = []
    for k, op in enumerate(refs):
        base = 30 + 6 * k
        body += (f"  s_mov_b64 exec, s[10:11]\n  s_{op}_saveexec_b64 s[{base}:{base + 1}], s[12:13]\n"
                 f"  s_cselect_b32 s{base + 4}, 1, 0\n  s_mov_b64 s[{base + 2}:{base + 3}], exec\n")
        outs += [f"s{base}", f"s{base + 1}", f"s{base + 2}", f"s{base + 3}", f"s{base + 4}"]
    body += "  s_mov_b64 exec, -1\n"
    out = run_snippet(body, sgprs={10: e & M32, 11: e >> 32, 12: v & M32, 13: v >> 32}, outputs=outs)
    for k, (op, f) in enumerate(refs.items()):
        base = 30 + 6 * k
        new = f(e, v) & M64
        got = [int(out[f"s{base + i}"]) for i in range(5)]
        assert got == [e & M32, e >> 32, new & M32, new >> 32, int(new != 0)], op


LOOP = """
  s_mov_b32 s30, 0
  s_mov_b32 s31, s10
L_loop:
  s_add_u32 s30, s30, 3
  s_sub_u32 s31, s31, 1
  s_cmp_lg_u32 s31, 0
  s_cbranch_scc1 L_loop
  s_mov_b32 s32, 0
  s_cmp_gt_u32 s11, s12
  s_cbranch_scc0 L_skip
  s_mov_b32 s32, 7
L_skip:
  s_mov_b32 s33, 0
  s_mov_b64 vcc, s[14:15]
  s_cbranch_vccz L_vz
  s_mov_b32 s33, 1
L_vz:
  s_mov_b32 s34, 0
  s_cbranch_vccnz L_vnz
  s_mov_b32 s34, 1
L_vnz:
  s_mov_b32 s35, 0
  s_mov_b64 s[16:17], exec
  s_mov_b64 exec, s[14:15]
  s_cbranch_execz L_ez
  s_mov_b32 s35, 1
L_ez:
  s_mov_b32 s36, 0
  s_cbranch_execnz L_enz
  s_mov_b32 s36, 1
L_enz:
  s_mov_b64 exec, s[16:17]
  s_branch L_end
  s_mov_b32 s35, 99
L_end:
"""


@pytest.mark.parametrize("vcc", [0, 1 << 40, 0xFFFF_FFFF_FFFF_FFFF])
def test_branches(vcc):
    r = np.random.default_rng(600 + vcc % 7)
    n = int(r.integers(1, 20))
    a, b = (int(x) for x in r.integers(0, 2**32, 2, dtype=np.uint64))
    out = run_snippet(LOOP, sgprs={10: n, 11: a, 12: b, 14: vcc & M32, 15: vcc >> 32},
                      outputs=["s30", "s31", "s32", "s33", "s34", "s35", "s36"])
    got = [int(out[f"s{30 + i}"]) for i in range(7)]
    nz = int(vcc != 0)
    assert got == [3 * n, 0, 7 if a > b else 0, nz, 1 - nz, nz, 1 - nz]
