"""User-facing ops: validation, kernel launch, references."""
from .fmha import fmha_fwd

__all__ = ["fmha_fwd"]
