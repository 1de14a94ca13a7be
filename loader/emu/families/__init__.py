"""Instruction families; importing this package registers every handler."""
from . import cache, cvt, ds, mem, mfma, modes, permute, smem, smfmac, sop, vop, vop3p  # noqa: F401
