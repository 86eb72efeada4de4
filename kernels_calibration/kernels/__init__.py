"""One module per kernel: the ``@triton.jit`` kernel, a wrapper that checks shapes and allocates,
a PyTorch ``*_ref`` and the FLOP/byte formula used to turn a time into TFLOP/s and GB/s."""
