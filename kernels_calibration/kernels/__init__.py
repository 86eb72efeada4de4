"""The kernel families (DESIGN.md): each has one entry point that takes a LaunchConfig (launch.py),
a float64 PyTorch ``*_ref`` beside it, and the FLOP/byte formula that turns a time into TFLOP/s and
GB/s.  dispatch.py chooses which kernel runs a quantized decode step.

  HACK decode             hack_attn_decode.hack_attn_decode, decode_step    (HackDecodeConfig)
  dequantize-then-attend  dequant_attn_decode.dequant_attn_decode           (DequantDecodeConfig)
  FP16 / FP8 decode       attn_decode.fp_attn_decode                        (FpDecodeConfig)
  prefill                 hack_attn_prefill.hack_attn_prefill; attn_prefill.fa_attn_prefill (PrefillConfig)
  quantize                kv_cache.build_cache, append_token; quantize.quantize_k, quantize_v (QuantizeConfig)
  scoring                 pq_score.pq_score, qk_score.qk_score              (ScoreConfig)

The kernels themselves live in gluon_decode.py, hack_decode_rp.py and head_major.py (decode),
hack_core.py (the Triton building blocks they share) and split_k.py (flash-decoding's split combine).
"""
