"""Microkernels whose cost on the timing model is known by construction.

Each is a few lines of gfx950 assembly assembled with clang (LLVM >= 20). Register
contents are irrelevant: the timing mode skips MFMA arithmetic.
"""
from __future__ import annotations

from kernel_source import assemble as assemble_source
from kernel_source import kernel_source


def assemble(name: str, body: str, vgprs: int = 32, threads: int = 512, lds: int = 0) -> bytes:
    return assemble_source(kernel_source(name, body + "\n  s_endpgm", args=("src", "dst"), vgprs=vgprs,
                                         accum_offset=vgprs, sgprs=16, max_workgroup=threads, lds=lds))


def mfma_chain(n: int) -> bytes:
    """n 8-pass MFMAs accumulating in place into one tile (srcC == vdst): back to back."""
    body = "\n".join(["  v_mfma_f32_32x32x16_bf16 v[0:15], v[16:19], v[20:23], v[0:15]"] * n)
    return assemble("mfma_chain", body)


def mfma_dependent(n: int) -> bytes:
    """n 4-pass MFMAs, each reading the previous result as srcA (a true data dependency)."""
    body = "\n".join(["  v_mfma_f32_16x16x32_bf16 v[0:3], v[0:3], v[4:7], 0"] * n)
    return assemble("mfma_dependent", body)


def valu_stream(n: int, op: str = "v_add_f32 v{d}, v20, v21") -> bytes:
    """n independent VALU ops (destinations rotate over v0..v15)."""
    body = "\n".join("  " + op.format(d=i % 16) for i in range(n))
    return assemble("valu_stream", body)


def copy(iterations: int = 16) -> bytes:
    """Each 1-wave workgroup copies iterations x 4 KiB: 4 x 16-B loads per lane, wait, 4 stores."""
    body = f"""
  s_load_dwordx4 s[4:7], s[0:1], 0x0
  v_and_b32 v0, 0x3ff, v0
  v_lshlrev_b32 v1, 4, v0
  s_mul_i32 s8, s2, {iterations * 4096}
  v_add_u32 v1, s8, v1
  s_mov_b32 s9, {iterations}
  s_waitcnt lgkmcnt(0)
L_loop:
  global_load_dwordx4 v[4:7], v1, s[4:5]
  global_load_dwordx4 v[8:11], v1, s[4:5] offset:1024
  global_load_dwordx4 v[12:15], v1, s[4:5] offset:2048
  global_load_dwordx4 v[16:19], v1, s[4:5] offset:3072
  s_waitcnt vmcnt(0)
  global_store_dwordx4 v1, v[4:7], s[6:7]
  global_store_dwordx4 v1, v[8:11], s[6:7] offset:1024
  global_store_dwordx4 v1, v[12:15], s[6:7] offset:2048
  global_store_dwordx4 v1, v[16:19], s[6:7] offset:3072
  s_nop 1
  v_add_u32 v1, 0x1000, v1
  s_sub_u32 s9, s9, 1
  s_cmp_lg_u32 s9, 0
  s_cbranch_scc1 L_loop
  s_waitcnt vmcnt(0)"""
    return assemble("copy", body, threads=64)


def buffer_read(loads: int, records: int) -> bytes:
    """One wave: `loads` buffer_load_dwordx4 of 1 KiB (16 B per lane, lane-contiguous) from
    kernarg pointer src through a raw buffer of `records` bytes; lanes past it read zeros."""
    body = f"""
  s_load_dwordx2 s[4:5], s[0:1], 0x0
  v_and_b32 v0, 0x3ff, v0
  v_lshlrev_b32 v1, 4, v0
  s_waitcnt lgkmcnt(0)
  s_and_b32 s5, s5, 0xffff
  s_mov_b32 s6, {records}
  s_mov_b32 s7, 0x00020000"""
    body += "".join(f"\n  buffer_load_dwordx4 v[4:7], v1, s[4:7], 0 offen offset:{1024 * (n % 4)}"
                    for n in range(loads))
    body += "\n  s_waitcnt vmcnt(0)"
    return assemble("buffer_read", body, threads=64)


def lds_reads(n: int, stride: int) -> bytes:
    """One wave: n ds_read_b64 with lane l at byte stride * l (8: conflict-free; 256: all 32
    lanes of a phase in the same two banks, 32 distinct dwords each: 32-way)."""
    body = f"""
  v_and_b32 v0, 0x3ff, v0
  v_mul_u32_u24 v1, {stride}, v0"""
    body += "".join(f"\n  ds_read_b64 v[{2 + 2 * (k % 8)}:{3 + 2 * (k % 8)}], v1" for k in range(n))
    body += "\n  s_waitcnt lgkmcnt(0)"
    return assemble("lds_reads", body, threads=64, lds=65536)


def mfma_shadow(n: int, mfma: str, shadow: list[str], vgprs: int = 64) -> bytes:
    """n repetitions of one MFMA accumulating in place followed by the `shadow` ops (which
    read and write registers the MFMA does not touch)."""
    body = "\n".join("  " + line for _ in range(n) for line in [mfma] + shadow)
    return assemble("mfma_shadow", body, vgprs=vgprs)


def mfma_beside_valu(n: int, valu_ops: int) -> bytes:
    """Waves 0-3 run n back-to-back 16-pass MFMAs (v_mfma_f32_32x32x64_f8f6f4, fp8 A/B),
    waves 4-7 run `valu_ops` independent v_add_f32: SIMD s hosts wave s (MFMAs) and wave
    s + 4 (VALU), so the VALU wave lives in the MFMA wave's shadow."""
    mfma = "  v_mfma_f32_32x32x64_f8f6f4 v[0:15], v[16:23], v[24:31], v[0:15]\n"
    valu = "".join(f"  v_add_f32 v{32 + i % 16}, v48, v49\n" for i in range(valu_ops))
    body = f"""
  v_readfirstlane_b32 s10, v0
  s_and_b32 s10, s10, 0x100
  s_cmp_eq_u32 s10, 0
  s_cbranch_scc0 L_valu
{mfma * n}  s_branch L_end
L_valu:
{valu}L_end:"""
    return assemble("mfma_beside_valu", body, vgprs=64)
