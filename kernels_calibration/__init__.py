"""Triton kernels for HACK and its baselines, their profiling harness and the calibration profiles.

Imports torch, triton, numpy and the standard library, and the method registry
(``costmodel.methods``, pure Python and pydantic) for the kernel keys the cost model prices and the
method defaults the kernels are profiled at. The cost model (``costmodel/calibration.py``) reads
the JSON profiles written here.
"""
