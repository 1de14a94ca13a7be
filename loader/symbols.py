"""Names the generated code part defines for every kernel (see codegen).

Kept apart from codegen so the manifest can refuse defines that would collide with them
without importing the generator: codegen reads the manifest, never the other way round.
"""
from __future__ import annotations

KERNARG_SYMBOL_PREFIX = "k_"
# Symbols the code part defines for every kernel; manifest defines may not reuse them.
CONSTANT_SYMBOLS = ("KERNARG_SIZE", "LDS_BYTES", "WORKGROUP_SIZE_X", "WORKGROUP_SIZE_Y", "WORKGROUP_SIZE_Z")
# Only the kernarg pointer is enabled among the user SGPRs, so it lands in s[0:1] and the
# three workgroup ids follow in s2..s4 (fact sheet §1). The descriptor codegen writes
# enables exactly these; the hardware writes them whether the code reads them or not.
INITIAL_REGISTERS = (("s_kernarg", 0, "s[0:1] kernarg segment pointer"),
                     ("s_wg_x", 2, "workgroup id x"),
                     ("s_wg_y", 3, "workgroup id y"),
                     ("s_wg_z", 4, "workgroup id z"),
                     ("v_workitem", 0, "v0: work-item ids packed x[9:0] y[19:10] z[29:20]; mask before use"))
FIRST_FREE_SGPR = 5
GENERATED_SYMBOLS = frozenset(CONSTANT_SYMBOLS) | {name for name, _, _ in INITIAL_REGISTERS}
