"""Instruction families; importing this package registers every handler."""
from . import ds, mem, mfma, smem, sop, vop  # noqa: F401
