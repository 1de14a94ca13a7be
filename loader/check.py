"""Checks a build must pass: a built `.co` against its manifest entry, and a scan of the
assembled instructions for MUBUF immediate offsets the assembler would truncate.

Both return a list of problems (empty when all is well), each a sentence naming what
differs, so a caller can print them all at once.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from .codeobj import CodeObjectError, load_code_object
from .manifest import Variant

MUBUF_MAX_OFFSET = 4095   # 12-bit unsigned immediate; llvm-mc 22 keeps only the low 12 bits
_MUBUF_OFFSET = re.compile(r"^(buffer_\w+)\b.*\boffset:(\d+)")


def mubuf_offset_problems(instructions: Iterable[str], source: Path) -> list[str]:
    """MUBUF instructions whose immediate offset does not fit in 12 bits.

    `instructions` are the assembler's own listing of the code (macros expanded, symbols
    resolved), so an offset written through a macro argument or a `.set` is seen too.
    """
    problems = []
    for text in instructions:
        match = _MUBUF_OFFSET.match(text)
        if match and int(match.group(2)) > MUBUF_MAX_OFFSET:
            problems.append(f"{source}: '{text}': MUBUF immediate offset {match.group(2)} exceeds "
                            f"{MUBUF_MAX_OFFSET}; the assembler would silently keep only its low 12 bits "
                            f"— move the excess into the voffset or soffset")
    return problems


def _compare(problems: list[str], what: str, built: object, manifest: object) -> None:
    if built != manifest:
        problems.append(f"{what}: the .co has {built}, the manifest says {manifest}")


def verify(co_path: Path, variant: Variant) -> list[str]:
    """Differences between a built code object and the manifest's variant."""
    kernel = variant.kernel
    try:
        code_object = load_code_object(co_path)
    except CodeObjectError as exc:
        return [str(exc)]
    info = code_object.kernels.get(kernel.symbol)
    if info is None:
        return [f"{co_path}: no kernel symbol '{kernel.symbol}' (it has {', '.join(code_object.kernels)})"]
    meta = info.metadata
    problems: list[str] = []
    where = f"{co_path} ({kernel.symbol})"
    if not meta:
        return [f"{where}: no metadata entry for {kernel.symbol}.kd"]
    _compare(problems, f"{where} descriptor kernarg_size", info.descriptor.kernarg_size, variant.kernarg_size)
    _compare(problems, f"{where} metadata .kernarg_segment_size", meta.get(".kernarg_segment_size"),
             variant.kernarg_size)
    _compare(problems, f"{where} LDS bytes", info.lds_bytes, kernel.lds_bytes)
    _compare(problems, f"{where} metadata .group_segment_fixed_size", meta.get(".group_segment_fixed_size"),
             kernel.lds_bytes)
    x, y, z = kernel.workgroup
    _compare(problems, f"{where} .max_flat_workgroup_size", info.max_workgroup_size, x * y * z)
    _compare(problems, f"{where} .reqd_workgroup_size", meta.get(".reqd_workgroup_size"), [x, y, z])
    _compare(problems, f"{where} float_denorm_mode_32", info.descriptor.float_denorm_mode_32,
             kernel.float_denorm_mode_32)
    built_args = {a.get(".name"): a for a in meta.get(".args", [])}
    _compare(problems, f"{where} argument names", list(built_args), [a.name for a in variant.args])
    for arg in variant.args:
        built = built_args.get(arg.name)
        if built is not None:
            _compare(problems, f"{where} argument '{arg.name}' offset", built.get(".offset"), arg.offset)
            _compare(problems, f"{where} argument '{arg.name}' size", built.get(".size"), arg.type.size)
    return problems
