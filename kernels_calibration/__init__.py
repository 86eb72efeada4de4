"""Triton kernels for HACK and its baselines, their profiling harness and the calibration profiles.

Imports only torch, triton, numpy and the standard library, so it runs on a bare GPU machine.
The cost model (``costmodel/calibration.py``) reads the JSON profiles written here; nothing here
imports the cost model.
"""
