"""Cache control: buffer_wbl2 (write back the L2) and buffer_inv (invalidate caches).

Values never go stale in the emulator (every load reads memory as it is), so these change
no data. They count against vmcnt like other MUBUF operations (LLVM's release sequence
waits for the writeback with s_waitcnt vmcnt(0)). What they order between workgroups is
the concurrent schedule's memory model (concurrent.FlagOrdering, reached through the
launch's race record); under the other schedules nothing uses it. Forms whose scope is
not settled are refused (concurrent.check_cache_control).
"""
from __future__ import annotations

from ..concurrent import check_cache_control
from ..errors import UnsupportedInstruction
from ..registry import handles


def _check(inst) -> None:
    if inst.ops:
        raise UnsupportedInstruction(f"`{inst.text}`: operands are not modelled")
    check_cache_control(inst)


@handles("buffer_wbl2", "buffer_inv", klass="vmem", check=_check)
def cache_control(ex, inst, w):
    _check(inst)
    sync = ex.accesses.sync if ex.accesses is not None else None
    land = None
    if sync is not None and inst.mods.get("sc1"):
        if inst.name == "buffer_wbl2":
            land = sync.write_back(ex, w)
        else:
            sync.invalidate(ex, w)
    ex.issue(w, "vm", land or (lambda rows: None))
