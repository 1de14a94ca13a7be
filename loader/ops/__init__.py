"""User-facing ops: validation, kernel launch, references, and their torch.library ops
(gfxasm::<op>, see library.py). Importing this package registers every op and its
`gfxasm run` cases. The functions are exported by the package itself (gfxasm.fmha_fwd,
...), not here, so that no module of this package is shadowed by the function it defines."""
from . import batch_prefill  # noqa: F401
from . import decode_attention  # noqa: F401
from . import fmha  # noqa: F401
from . import fp8_query  # noqa: F401
from . import mxfp8_gemm  # noqa: F401
from . import mxfp8_moe_gemm  # noqa: F401
from . import moe_align  # noqa: F401
from . import moe_layer  # noqa: F401
from . import moe_cases  # noqa: F401
from . import swiglu_quant  # noqa: F401
