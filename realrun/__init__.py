"""Real disaggregated-inference runs on one GPU (random-weight Llama shapes, FP16 / KVQuant-style /
HACK KV, emulated link) that write traces the simulator is validated against.  See harness.py for
what shares what, trace.py for the files."""
