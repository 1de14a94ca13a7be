"""The one place the tests write a standalone gfx950 kernel: code, descriptor, metadata.

Product and fixture kernels get these parts from the manifest (gfxasm.codegen); the
emulator and timing-model tests need throwaway kernels around a few instructions, and
they all wrap them here.
"""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from gfxasm.toolchain import find_tool

_SOURCE = """
.amdgcn_target "amdgcn-amd-amdhsa--gfx950"
.amdhsa_code_object_version 5
.text
.globl {name}
.p2align 8
.type {name},@function
{name}:
{code}
.rodata
.p2align 6
.amdhsa_kernel {name}
  .amdhsa_user_sgpr_kernarg_segment_ptr 1
  .amdhsa_system_sgpr_workgroup_id_x 1
  .amdhsa_next_free_vgpr {vgprs}
  .amdhsa_next_free_sgpr {sgprs}
  .amdhsa_accum_offset {accum_offset}
  .amdhsa_float_denorm_mode_32 {denorm}
  .amdhsa_fp16_overflow {fp16_ovfl}
  .amdhsa_ieee_mode {ieee}
  .amdhsa_group_segment_fixed_size {lds}
  .amdhsa_kernarg_size {kernarg_size}
.end_amdhsa_kernel
.amdgpu_metadata
---
amdhsa.version: [1, 2]
amdhsa.kernels:
  - .name: {name}
    .symbol: {name}.kd
    .kernarg_segment_size: {kernarg_size}
    .kernarg_segment_align: 8
    .group_segment_fixed_size: {lds}
    .private_segment_fixed_size: 0
    .wavefront_size: 64
    .sgpr_count: {sgprs}
    .vgpr_count: {vgprs}
    .max_flat_workgroup_size: {max_workgroup}
    .args:
{args}
...
.end_amdgpu_metadata
"""


def kernel_source(name: str, code: str, *, args=("inp", "out"), lds: int = 0, denorm: int = 3,
                  fp16_ovfl: int = 0, ieee: int = 1, vgprs: int = 512, accum_offset: int = 256, sgprs: int = 100,
                  max_workgroup: int = 64) -> str:
    """Assembly text of kernel `name` running `code` (which must end the program). `args`
    in kernarg order: a name is a pointer (8 bytes); (name, size) is a by-value scalar."""
    lines, offset = [], 0
    for arg in args:
        if isinstance(arg, str):
            arg_name, size, kind = arg, 8, "global_buffer, .address_space: global"
        else:
            (arg_name, size), kind = arg, "by_value"
        offset = -(-offset // size) * size                  # natural alignment
        lines.append(f"      - {{.name: {arg_name}, .offset: {offset}, .size: {size}, .value_kind: {kind}}}")
        offset += size
    return _SOURCE.format(name=name, code=code, args="\n".join(lines), lds=lds, denorm=denorm,
                          fp16_ovfl=fp16_ovfl, ieee=ieee, vgprs=vgprs, accum_offset=accum_offset, sgprs=sgprs,
                          max_workgroup=max_workgroup, kernarg_size=-(-offset // 8) * 8)


_cache: dict[str, bytes] = {}


def assemble(source: str) -> bytes:
    """The code object of `source` (cached by text); an assembler error raises with its message."""
    if source not in _cache:
        with tempfile.TemporaryDirectory() as d:
            src, obj = Path(d, "k.s"), Path(d, "k.co")
            src.write_text(source)
            proc = subprocess.run([find_tool("clang"), "-x", "assembler", "-target", "amdgcn-amd-amdhsa",
                                   "-mcpu=gfx950", str(src), "-o", str(obj)], capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"assembly failed:\n{proc.stderr}")
            _cache[source] = obj.read_bytes()
    return _cache[source]
