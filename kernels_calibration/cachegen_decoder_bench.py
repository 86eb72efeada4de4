"""CacheGen's GPU arithmetic decoder, measured: build the public kernel, encode KV codes, decode, time.

The decoder is the one CacheGen's artifact ships and its LMCache integration calls on every KV chunk it
loads (github: UChi-JCL/CacheGen, LMCache/third_party/torchac_cuda; Apache-2.0, copied unmodified under
kernels_calibration/third_party/torchac_cuda with its LICENSE).  Its layout, as LMCache's
cachegen_encoder/cachegen_decoder use it:

* KV is coded in chunks of at most 256 tokens (CACHEGEN_GPU_MAX_TOKENS_PER_CHUNK); a chunk's symbols are
  an int8 tensor [2 x layers (K then V), tokens, channels] with channels = kv_heads x head_dim;
* each (layer, channel) has its own CDF over the chunk's tokens (upstream's ``calculate_cdf``: int16
  [2L, C, Lp], a 16-bit count scale; here computed in PyTorch by cdf_reference) and its own bitstream: one GPU thread range-codes the chunk's symbols of one
  (layer, channel) (``encode_fast_new``), and the streams are concatenated (``collect_bytes``);
* decoding (``decode_chunk``) takes the prefix sum of the stream lengths and launches
  ``decode_fast_prefsum``: grid (2L, C / 128), 128 threads, each thread decoding its stream bit by bit
  into the chunk's uint8 output [2L, tokens, C].  A prompt of N tokens is ceil(N / 256) launches.

What is measured: that decode path (prefix sum + kernel per chunk, one chunk after another, as
``decode_function_gpu`` runs it) over whole prompts of 1K-32K tokens at Llama-3.1-8B's and 70B's KV shapes
(32 / 80 layers, 8 KV heads, head_dim 128), CUDA events around the whole prompt, warm-up first, the
median of ``--reps``; ``kernel_time_s`` is the same with the prefix sums made beforehand (kernel launches
only).  Every prompt's decoded symbols are compared with the encoded ones first (exact round trip).

The codes are the simulator's: 2-bit min/max codes (nearest rounding onto 4 levels) of Gaussian KV in
groups of 64 values of a token's head (costmodel/methods/cachegen.gaussian_code_entropy_bits gives their
entropy, the wire size the simulator assumes); CacheGen's own per-layer bin counts on its quantiser
(LMCache's torch_quant_vectorized: 32 / 16 bins by layer, per-token absmax over the channels, KV with
per-channel scales) are timed beside them (``decode_cachegen_bins``) and not fitted.  One GPU's share of the
70B KV under tensor parallelism 2, 4 and 8 (4, 2, 1 KV heads: ``decode_tp_shard``) is timed too: the fit's
``gpu_fill`` gives, per channel count on one GPU, how much slower per symbol its share decodes than the whole
model's KV (fewer thread blocks), which the simulator applies to a tensor-parallel pool's share.

Fit (the simulator prices ``entropy_decode.kv`` per layer): units = K and V symbols of one layer
(tokens x kv_heads x head_dim x 2), time_s = the prompt's decode time / layers (one launch decodes all
layers of a chunk), then ``time_s = overhead_s + s_per_unit x units`` by relative least squares
(kernels_calibration/impl_bench.fit).

``python -m kernels_calibration.cachegen_decoder_bench --out FILE.json --build-dir DIR`` (CUDA GPU, nvcc,
ninja); ``--smoke`` runs the pure-PyTorch parts (codes, CDF layout, stream collection, fit) on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

THIRD_PARTY = Path(__file__).resolve().parent / "third_party" / "torchac_cuda"
# the encoder and decoder of upstream's setup.py, their header and licence (copied unmodified); the binding is
# ours: upstream's main.cpp also binds calculate_cdf (cal_cdf.cu, written against PyTorch's packed_accessor,
# which current PyTorch no longer has), whose CDF cdf_reference computes instead
SOURCES = ("torchac_kernel_enc_new.cu", "torchac_kernel_dec_new.cu")
COPIED = SOURCES + ("torchac_kernel.cuh", "LICENSE")
BINDING = """// hacksim: binds the upstream encoder and decoder (torchac_kernel_enc_new.cu, torchac_kernel_dec_new.cu)
// under the names LMCache calls them by.
#include <torch/extension.h>
#include "torchac_kernel.cuh"
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("encode_fast_new", &encode_cuda_new);
    m.def("decode_fast_new", &decode_cuda_new);
    m.def("decode_fast_prefsum", &decode_cuda_prefsum);
}
"""
UPSTREAM = "github: UChi-JCL/CacheGen @ 6bed34ca9d495289955ed754cf2ad0c43346ee48, LMCache/third_party/torchac_cuda"

CHUNK_TOKENS = 256  # LMCache: CACHEGEN_GPU_MAX_TOKENS_PER_CHUNK, the kernel's MAX_TOKENS_PER_THREAD
STREAM_BUFFER_BYTES = 256  # LMCache's per-(layer, channel) encoder output buffer
MODELS = {"llama-3.1-8b": (32, 8, 128), "llama-3.1-70b": (80, 8, 128)}  # layers, kv_heads, head_dim
TOKENS = (1024, 2048, 4096, 8192, 16384, 32768)
BITS, PARTITION = 2, 64
# LMCache's CacheGenConfig for the 7B family (key 32/16/16 bins by layer, value 32/16)
CACHEGEN_KEY_BINS = ((10, 32), (20, 16), (None, 16))
CACHEGEN_VALUE_BINS = ((2, 32), (None, 16))
SENSITIVITY_TOKENS = (4096, 16384)
# one GPU's share of Llama-3.1-70B's KV under tensor parallelism (8 KV heads over 2, 4, 8 GPUs): fewer
# channels, fewer thread blocks per launch; timed beside the whole-model rows, their slowdown is the fit's gpu_fill
SHARDS = {"llama-3.1-70b/tp2": (80, 4, 128), "llama-3.1-70b/tp4": (80, 2, 128), "llama-3.1-70b/tp8": (80, 1, 128)}


# ---- the codes ------------------------------------------------------------------------------------
def gaussian_codes(
    layers2: int, tokens: int, channels: int, gen: torch.Generator, device, bits: int = BITS, partition: int = PARTITION
) -> torch.Tensor:
    """int8 [layers2, tokens, channels]: b-bit min/max codes of Gaussian values, nearest-rounded, in
    groups of `partition` consecutive channels of a token (the simulator's CacheGen codes)."""
    x = torch.randn((layers2, tokens, channels // partition, partition), generator=gen, device=device)
    lo = x.amin(-1, keepdim=True)
    hi = x.amax(-1, keepdim=True)
    levels = 2**bits
    q = torch.round((x - lo) / (hi - lo) * (levels - 1)).clamp_(0, levels - 1)
    return q.reshape(layers2, tokens, channels).to(torch.int8)


def _layer_bins(spec, layers: int) -> list[int]:
    out = []
    for upto, bins in spec:
        end = layers if upto is None else min(upto, layers)
        out += [bins] * (end - len(out))
    return out


def cachegen_codes(layers: int, tokens: int, channels: int, gen: torch.Generator, device) -> tuple[torch.Tensor, int]:
    """int8 [2 x layers, tokens, channels] as LMCache's torch_quant_vectorized makes them: round(x x MAX /
    absmax + MAX), MAX = bins // 2 - 1 by layer, absmax per token over the channels; KV Gaussian with a
    log-normal scale per channel (a few large channels, as real keys have).  Returns (codes, max bins)."""
    bins = torch.tensor(
        _layer_bins(CACHEGEN_KEY_BINS, layers) + _layer_bins(CACHEGEN_VALUE_BINS, layers),
        dtype=torch.float32,
        device=device,
    )
    scale = torch.exp(torch.randn((2 * layers, 1, channels), generator=gen, device=device) * 0.5)
    x = torch.randn((2 * layers, tokens, channels), generator=gen, device=device) * scale
    mx = (bins // 2 - 1)[:, None, None]
    absmax = x.abs().amax(-1, keepdim=True)
    return torch.round(x * (mx / absmax) + mx).to(torch.int8), int(bins.max())


def entropy_bits(codes: torch.Tensor, levels: int) -> float:
    """Empirical entropy (bits/symbol) of the codes' overall distribution."""
    counts = torch.bincount(codes.flatten().to(torch.int64), minlength=levels).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * torch.log2(p)).sum())


def cdf_reference(codes: torch.Tensor, max_bins: int) -> torch.Tensor:
    """What the kernel's calculate_cdf returns, in PyTorch: int16 [layers2, channels, max_bins + 1], the
    per-(layer, channel) counts over the tokens cumulated, scaled to 0xFFFF - max_bins and offset by the
    bin index (every symbol keeps a non-empty range)."""
    layers2, _, channels = codes.shape
    one_hot = torch.zeros((layers2, channels, max_bins), dtype=torch.int64, device=codes.device)
    one_hot.scatter_add_(
        2, codes.transpose(1, 2).to(torch.int64), torch.ones_like(codes.transpose(1, 2), dtype=torch.int64)
    )
    cum = torch.cat([torch.zeros_like(one_hot[..., :1]), one_hot.cumsum(-1)], -1)
    total = cum[..., -1:]
    scaled = (0xFFFF - max_bins) * cum // total + torch.arange(max_bins + 1, device=codes.device)
    # calculate_cdf accumulates in uint16 and casts the scaled value to uint16 before the offset
    return scaled.to(torch.int32).to(torch.int16)


def collect_bytes(buffer: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The encoder's per-(layer, channel) buffers [L, C, B] cut to their lengths [L, C] and concatenated in
    (layer, channel) order: the chunk's bytestream (LMCache's collect_bytes)."""
    keep = torch.arange(buffer.shape[-1], device=buffer.device) < lengths[..., None].to(torch.int64)
    return buffer[keep]


def stream_starts(lengths: torch.Tensor) -> torch.Tensor:
    """The inclusive prefix sum of the stream lengths, int64 [L, C] (LMCache's decode_chunk)."""
    return lengths.flatten().cumsum(0).reshape(lengths.shape)


# ---- the public kernel ----------------------------------------------------------------------------
def build(build_dir: Path, verbose: bool = False):
    """Copy the upstream sources (with their licence) and the binding into build_dir/src and build them
    for sm_90 with torch.utils.cpp_extension.load (upstream's setup.py flags: none beyond PyTorch's)."""
    from torch.utils.cpp_extension import load

    src = build_dir / "src"
    obj = build_dir / "obj"
    src.mkdir(parents=True, exist_ok=True)
    obj.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        shutil.copyfile(THIRD_PARTY / name, src / name)
    (src / "binding.cpp").write_text(BINDING)
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    return load(
        name="torchac_cuda",
        sources=[str(src / s) for s in ("binding.cpp",) + SOURCES],
        extra_include_paths=[str(src)],
        build_directory=str(obj),
        verbose=verbose,
    )


class Prompt:
    """One prompt's KV encoded chunk by chunk with the public encoder, ready to decode."""

    def __init__(self, ext, codes_fn, layers2: int, tokens: int, channels: int, device):
        self.ext, self.layers2, self.tokens, self.channels = ext, layers2, tokens, channels
        self.chunks = []  # (cdf, bytestream, lengths, stream_starts, start, end, codes)
        self.bitstream_bytes = 0
        buffer = torch.zeros((layers2, channels, STREAM_BUFFER_BYTES), dtype=torch.uint8, device=device)
        lengths = torch.zeros((layers2, channels), dtype=torch.int32, device=device)
        for start in range(0, tokens, CHUNK_TOKENS):
            end = min(start + CHUNK_TOKENS, tokens)
            codes, max_bins = codes_fn(end - start)
            cdf = cdf_reference(codes, max_bins)
            ext.encode_fast_new(cdf, codes, buffer, lengths)
            if int(lengths.max()) >= STREAM_BUFFER_BYTES:
                raise RuntimeError("a stream filled the encoder's 256-byte buffer")
            stream = collect_bytes(buffer, lengths)
            self.bitstream_bytes += stream.numel()
            self.chunks.append((cdf, stream, lengths.clone(), stream_starts(lengths), start, end, codes))
        # one uint8 output per chunk, [2L, chunk tokens, C], as LMCache decodes each chunk into its own buffer
        # (the kernel indexes with 32-bit accessors: one tensor for a whole long prompt would overflow them)
        self.outs = [
            torch.zeros((layers2, c[5] - c[4], channels), dtype=torch.uint8, device=device) for c in self.chunks
        ]

    def decode(self) -> None:
        """LMCache's decode_function_gpu: decode_chunk (prefix sum, kernel) chunk after chunk."""
        for (cdf, stream, lengths, *_), out in zip(self.chunks, self.outs):
            self.ext.decode_fast_prefsum(cdf, stream, stream_starts(lengths), out)

    def decode_kernels(self) -> None:
        """The kernel launches alone (prefix sums made beforehand)."""
        for (cdf, stream, _, starts, *_), out in zip(self.chunks, self.outs):
            self.ext.decode_fast_prefsum(cdf, stream, starts, out)

    def check(self) -> None:
        for out in self.outs:
            out.fill_(0xFF)
        self.decode()
        torch.cuda.synchronize()
        for (*_, start, end, codes), out in zip(self.chunks, self.outs):
            if not torch.equal(out, codes.to(torch.uint8)):
                bad = int((out != codes.to(torch.uint8)).sum())
                raise RuntimeError(f"round trip failed: {bad} symbols of tokens {start}-{end} differ")

    def drop_codes(self) -> None:
        self.chunks = [(*c[:-1], None) for c in self.chunks]


def bench(
    ext, device, models=MODELS, tokens_list=TOKENS, shards=SHARDS, reps: int = 7, log=print, on_row=None
) -> list[dict]:
    from .measure import time_events_s

    rows = []
    gen = torch.Generator(device=device)
    shapes = {**models, **shards}
    plans = [(m, t, "gaussian_2bit") for m in models for t in tokens_list]
    plans += [(m, t, "gaussian_2bit") for m in shards for t in SENSITIVITY_TOKENS]
    plans += [("llama-3.1-8b", t, "cachegen_bins") for t in SENSITIVITY_TOKENS if "llama-3.1-8b" in models]
    for model, tokens, symbols in plans:
        layers, kv_heads, head_dim = shapes[model]
        channels = kv_heads * head_dim
        gen.manual_seed(1000 + tokens)
        if symbols == "gaussian_2bit":

            def codes_fn(n, L=layers, C=channels):
                return gaussian_codes(2 * L, n, C, gen, device), 2**BITS
        else:

            def codes_fn(n, L=layers, C=channels):
                return cachegen_codes(L, n, C, gen, device)

        p = Prompt(ext, codes_fn, 2 * layers, tokens, channels, device)
        p.check()
        levels = max(int(c[0].shape[-1]) - 1 for c in p.chunks)
        ent = entropy_bits(p.chunks[0][-1], levels)
        p.drop_codes()
        t = time_events_s(p.decode, reps)
        tk = time_events_s(p.decode_kernels, reps)
        n_sym = 2 * layers * tokens * channels
        rows.append(
            {
                "implementation": "cachegen_reference_decoder",
                "kernel": (
                    "decode_cachegen_bins"
                    if symbols != "gaussian_2bit"
                    else "decode_tp_shard"
                    if model in shards
                    else "decode"
                ),
                "model": model,
                "symbols_kind": symbols,
                "layers": layers,
                "kv_heads": kv_heads,
                "head_dim": head_dim,
                "tokens": tokens,
                "chunks": len(p.chunks),
                "symbols": n_sym,
                "bitstream_bytes": p.bitstream_bytes,
                "coded_bits_per_symbol": 8 * p.bitstream_bytes / n_sym,
                "entropy_bits_per_symbol": ent,
                "prompt_time_s": t,
                "kernel_time_s": tk,
                "symbols_per_s": n_sym / t,
                # the simulator's unit: one layer's K and V symbols, and the prompt's time per layer
                "units": tokens * kv_heads * head_dim * 2,
                "time_s": t / layers,
            }
        )
        r = rows[-1]
        log(
            f"{model} {tokens} tokens ({symbols}): {t * 1e3:.3f} ms ({tk * 1e3:.3f} ms kernels), "
            f"{r['symbols_per_s'] / 1e9:.2f} G symbols/s, {r['coded_bits_per_symbol']:.3f} bits/symbol "
            f"(entropy {ent:.3f}); round trip exact"
        )
        if on_row is not None:
            on_row(rows)
        del p
        torch.cuda.empty_cache()
    return rows


def gpu_fill(rows: list[dict]) -> dict:
    """How much slower per symbol the decoder runs on one GPU's tensor-parallel share of the KV: for each
    channel count per GPU (kv_heads x head_dim) of the decode_tp_shard rows, the median over their prompt
    lengths of (the shard's seconds per symbol / the whole model's at the same length); 1 at the whole
    model's channels.  Fewer channels launch fewer thread blocks (grid 2L x C/128), and each thread decodes
    its stream serially, so a GPU given a small share is not filled."""
    full = {(r["model"], r["tokens"]): r["prompt_time_s"] / r["symbols"] for r in rows if r["kernel"] == "decode"}
    ratios: dict[int, list[float]] = {}
    whole: set[int] = set()
    for r in rows:
        if r["kernel"] != "decode_tp_shard":
            continue
        model = r["model"].split("/")[0]
        ref = full.get((model, r["tokens"]))
        if ref is None:
            continue
        ratios.setdefault(r["kv_heads"] * r["head_dim"], []).append(r["prompt_time_s"] / r["symbols"] / ref)
        whole |= {f["kv_heads"] * f["head_dim"] for f in rows if f["kernel"] == "decode" and f["model"] == model}
    table = {c: statistics.median(v) for c, v in ratios.items()}
    table.update({c: 1.0 for c in whole})
    channels = sorted(table)
    return {"channels_per_gpu": channels, "time_factor": [table[c] for c in channels]}


def fit(rows: list[dict]) -> dict:
    """impl_bench's fit (relative least squares, both terms >= 0) of the fitted rows (the 2-bit codes of whole
    models), with the GPU-fill factors of the tensor-parallel shards (gpu_fill) where rows give them."""
    from .impl_bench import fit as ls_fit

    out = ls_fit([r for r in rows if r["kernel"] == "decode"])
    for f in out.get("cachegen_reference_decoder", {}).values():
        f["unit"] = "K and V symbols of one layer (tokens x kv_heads x head_dim x 2); time per layer"
        fill = gpu_fill(rows)
        if len(fill["channels_per_gpu"]) > 1:
            f["gpu_fill"] = fill
    return out


def provenance(argv) -> dict:
    from .measure import provenance as base

    info = {
        "gpu_name": "cpu",
        "driver": "",
        **base(),
        "command": "python -m kernels_calibration.cachegen_decoder_bench " + " ".join(argv),
        "kernel_source": UPSTREAM,
    }
    info["cuda"] = torch.version.cuda or ""
    try:
        import subprocess

        info["nvcc"] = (
            subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=20, check=False)
            .stdout.strip()
            .splitlines()[-1]
        )
    except (OSError, IndexError, subprocess.SubprocessError):
        info["nvcc"] = "unknown"
    return info


def smoke() -> int:
    """The pure-PyTorch parts on the CPU: codes, the CDF layout, stream collection, the fit."""
    gen = torch.Generator().manual_seed(0)
    codes = gaussian_codes(4, 256, 128, gen, "cpu")
    assert codes.shape == (4, 256, 128) and int(codes.min()) == 0 and int(codes.max()) == 3
    cdf = cdf_reference(codes, 4)
    u16 = cdf.to(torch.int32) & 0xFFFF  # the kernels read the int16 CDF as uint16
    assert (
        cdf.shape == (4, 128, 5) and bool((u16[..., 1:] > u16[..., :-1]).all()) and bool((u16[..., -1] == 0xFFFF).all())
    )
    cg, mb = cachegen_codes(32, 256, 1024, gen, "cpu")
    assert mb == 32 and int(cg.min()) >= 0 and int(cg.max()) <= 30
    buf = torch.arange(2 * 3 * 8, dtype=torch.uint8).reshape(2, 3, 8)
    lens = torch.tensor([[1, 0, 2], [3, 1, 0]], dtype=torch.int32)
    assert collect_bytes(buf, lens).tolist() == [0, 16, 17, 24, 25, 26, 32]
    assert stream_starts(lens).tolist() == [[1, 1, 3], [6, 7, 7]]
    print(f"smoke: codes {entropy_bits(codes, 4):.3f} bits/symbol, CDF and stream layout as the kernel's")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        prog="python -m kernels_calibration.cachegen_decoder_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument("--build-dir", type=Path, help="where the sources are copied and built (default: a temp dir)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--smoke", action="store_true", help="the pure-PyTorch parts on the CPU, no kernel")
    a = ap.parse_args(argv)
    if a.smoke:
        return smoke()
    if a.out is None:
        print("--out: required (a JSON file to write)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("cachegen_decoder_bench needs a CUDA GPU, nvcc and ninja (or --smoke)", file=sys.stderr)
        return 2
    build_dir = a.build_dir or Path(tempfile.mkdtemp(prefix="torchac_cuda_"))
    ext = build(build_dir)
    print(f"built {UPSTREAM} in {build_dir}", flush=True)
    prov = provenance(argv)

    def write(doc: dict) -> None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = a.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(a.out)

    # the rows so far, marked partial, after each prompt (a later failure keeps them)
    rows = bench(
        ext,
        torch.device("cuda"),
        reps=a.reps,
        log=lambda s: print(s, flush=True),
        on_row=lambda rs: write({"provenance": prov, "partial": True, "rows": rs}),
    )
    doc = {"provenance": prov, "fits": fit(rows), "rows": rows}
    write(doc)
    for impl, kerns in doc["fits"].items():
        for k, f in kerns.items():
            print(
                f"{impl}.{k}: {f['overhead_s'] * 1e6:.2f} us + {f['s_per_unit'] * 1e12:.3f} ps/unit "
                f"(max error {f['max_abs_error_pct']:.1f} %, {f['n']} shapes); "
                f"{1 / f['s_per_unit'] / 1e9:.2f} G symbols/s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
