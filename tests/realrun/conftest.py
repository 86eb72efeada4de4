"""realrun tests run on the CPU (Triton interpreter for the kernels) unless a CUDA GPU is present.
TRITON_INTERPRET must be set before triton is first imported."""

import os

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
