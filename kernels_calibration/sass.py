"""Offline sm_90 compile of the HACK attention kernels on a machine without a GPU: SASS instruction
counts of the main loop, per source line, and the register/spill budget.

    python -m kernels_calibration.sass [--kernel rp|head_major|prefill|gluon_dequant|gluon_hack] [--pi 64]
                                       [--warps 2] [--stages 3] [--maxnreg 128] [--no-se] [--append]
                                       [--dequant] [--block-m 64] [--lines 25] [--json]

For prefill the count is normalized to 128 token columns of a 64-row query tile.

Uses Triton's own ptxas, nvdisasm and cuobjdump (shipped with the triton wheel) and the divisibility
hints a real launch gets, so the code is what the H200 runs.  The loop is the largest backward
branch; per-line counts come from nvdisasm's line info.  Every kernel change was compiled here first
and only the promising ones were timed (DESIGN.md): e.g. the row-packed kernel issues 2,946
warp-instructions per 128 tokens at PI 64 against the head-major kernel's 4,530.  --json also lists
the loop's opcodes and whether every table lookup sits in a tensor-core operand layout.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

_ARGS_FP16 = ("Q", "KMN", "KSC", "VMN", "VSC", "VT", "O", "KN", "VN", "OUT")
_ARGS_U8 = ("KC", "VC", "KSM", "VSM")
_ARGS_SCALAR = {
    "LENS": "*i32",
    "OP": "*fp32",
    "LSEP": "*fp32",
    "qk_scale": "fp32",
    "HKV": "i32",
    "LMAX": "i32",
    "NBLK": "i32",
    "TPS": "i32",
    "NSPLIT": "i32",
    "HQ": "i32",
    "L": "i32",
    "LENS_OUT": "*i32",
    "seed": "i32",
}
_DIV16 = ("Q", "KC", "KMN", "KSC", "KSM", "VC", "VMN", "VSC", "VSM", "VT", "LENS", "OP", "LSEP", "LMAX", "TPS", "O")


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_sm90(fn, consts: dict, num_warps: int, num_stages: int, maxnreg: int | None = None, gluon: bool = False):
    """triton.compile for sm_90 with the decode kernels' signature (pointer dtypes, 16-divisible args);
    gluon: fn is a @gluon.jit kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource  # noqa: N814

    sig = {**{n: "*fp16" for n in _ARGS_FP16}, **{n: "*u8" for n in _ARGS_U8}, **_ARGS_SCALAR}
    names = fn.arg_names
    signature = {n: ("constexpr" if n in consts else sig[n]) for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in _DIV16 if n in names}
    opts = dict(num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    return triton.compile(ASTSource(fn, signature, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)


def _cubin_file(kernel) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
        return f.name


def resources(kernel) -> dict:
    """REG, STACK, SHARED, LOCAL from cuobjdump --dump-resource-usage."""
    out = subprocess.run(
        [_tool("cuobjdump"), "--dump-resource-usage", _cubin_file(kernel)], capture_output=True, text=True, check=True
    ).stdout
    return {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", out)}


def loop_profile(kernel) -> tuple[collections.Counter, dict]:
    """(instructions per 'file:line' in the largest loop, opcode counts per line)."""
    text = subprocess.run(
        [_tool("nvdisasm"), "-c", "-gi", _cubin_file(kernel)], capture_output=True, text=True, check=True
    ).stdout
    labels, instr, pending = {}, [], None
    for line in text.splitlines():
        m = re.match(r"\s*\.L_x_(\d+):", line)
        if m:
            pending = m.group(1)
            continue
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s*(.*?);", line)
        if m:
            addr = int(m.group(1), 16)
            if pending is not None:
                labels[pending], pending = addr, None
            instr.append((addr, m.group(2).strip()))
    loops = [
        (labels[m.group(1)], a)
        for a, i in instr
        if (m := re.search(r"BRA.*\.L_x_(\d+)", i)) and m.group(1) in labels and labels[m.group(1)] < a
    ]
    lo, hi = max(loops, key=lambda x: x[1] - x[0])
    cnt: collections.Counter = collections.Counter()
    ops: dict = collections.defaultdict(collections.Counter)
    cur = "?"
    for line in text.splitlines():
        m = re.search(r'//## File "([^"]+)", line (\d+)', line)
        if m:
            cur = f"{os.path.basename(m.group(1))}:{m.group(2)}"
            continue
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s*(.*?);", line)
        if m and lo <= int(m.group(1), 16) <= hi:
            ins = m.group(2).split()
            op = (ins[1] if ins[0].startswith("@") else ins[0]).split(".")[0]
            cnt[cur] += 1
            ops[cur][op] += 1
    return cnt, ops


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--kernel",
        choices=("rp", "head_major", "prefill", "gluon_dequant", "gluon_hack"),
        default="rp",
        help="gluon_dequant / gluon_hack: the one-warp mma.sync kernels of gluon_decode.py (the main "
        "loop; gluon_dequant compiled without the FP16 tail)",
    )
    ap.add_argument("--block-m", type=int, default=64, help="prefill: query rows per program")
    ap.add_argument("--pi", type=int, default=64)
    ap.add_argument("--warps", type=int, default=2)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--maxnreg", type=int, default=None)
    ap.add_argument("--no-se", action="store_true")
    ap.add_argument("--dequant", action="store_true", help="head_major: mode dequant (fused dequantize-then-attend)")
    ap.add_argument("--append", action="store_true", help="rp: the fused decode step (append + attention)")
    ap.add_argument("--lines", type=int, default=25, help="source lines to list (most instructions first)")
    ap.add_argument("--json", action="store_true", help="one JSON line: resources and warp-instructions per 128 tokens")
    a = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        ap.error("compiling needs TRITON_INTERPRET unset (the interpreter's kernels cannot be compiled)")
    if a.kernel == "rp":
        from .kernels.hack_decode_rp import _rp_decode_kernel as fn

        consts = dict(
            G=8,
            RP=16,
            R=2,
            D=128,
            PI=a.pi,
            USE_SE=not a.no_se,
            HAS_TAIL=True,
            USE_ASM=True,
            APPEND=a.append,
            STOCHASTIC=True,
        )
        tokens = 2 * a.pi
    elif a.kernel == "prefill":
        from .kernels.hack_attn_prefill import _hack_prefill_kernel as fn

        consts = dict(G=8, D=128, PI=a.pi, BM=a.block_m, USE_SE=not a.no_se, USE_ASM=True)
        tokens = a.pi * a.block_m / 64  # a tile is block_m rows x PI tokens: normalized to 64 rows
    elif a.kernel == "gluon_dequant":  # one warp, mma.sync, 64-token tiles (the tail loop left out)
        from .kernels.gluon_decode import _dequant_mma_kernel as fn

        consts = dict(G=8, D=128, PI=a.pi, HAS_TAIL=False)
        a.warps = 1
        tokens = 64
    elif a.kernel == "gluon_hack":  # HACK, one warp, INT8 mma.sync, 64-token tiles (PI 64)
        from .kernels.gluon_decode import _hack_mma_kernel as fn

        consts = dict(G=8, D=128, PI=a.pi, HAS_TAIL=True, USE_SE=not a.no_se)
        a.warps = 1
        tokens = 64
    else:
        from .kernels.head_major import _quant_decode_kernel as fn

        bn = max(a.pi, 128)
        consts = dict(
            G=8,
            G_PAD=16,
            D=128,
            PI=a.pi,
            USE_SE=not a.no_se,
            HAS_TAIL=True,
            MODE=int(a.dequant),
            USE_ASM=True,
            SUMROW=8,
            BN=bn,
        )
        tokens = bn
    k = compile_sm90(fn, consts, a.warps, a.stages, a.maxnreg, gluon=a.kernel.startswith("gluon"))
    cnt, ops = loop_profile(k)
    total = sum(cnt.values())
    if a.json:
        import json

        lut = [ln for ln in k.asm["ttgir"].splitlines() if "elementwise_inline_asm" in ln and "mad.lo.u32" in ln]
        print(
            json.dumps(
                {
                    **resources(k),
                    "loop_instructions": total,
                    "warp_instructions_per_128_tokens": total * a.warps * 128 / tokens,
                    "loop_opcodes": dict(sum(ops.values(), collections.Counter())),
                    # table-lookup dequantization needs its four codes per register to share a
                    # table, true in the tensor-core operand layouts (common.dequant_lut)
                    "lut_ops": len(lut),
                    "lut_ops_not_in_operand_layout": sum("dot_op" not in ln.split("->")[-1] for ln in lut),
                }
            )
        )
        return 0
    print(f"{a.kernel} PI {a.pi}, {a.warps} warps, {a.stages} stages, maxnreg {a.maxnreg}: {resources(k)}")
    unit = "128 tokens" if a.kernel != "prefill" else "64 query rows x 128 tokens"
    print(
        f"loop: {total} instructions per warp per tile = {total * a.warps * 128 / tokens:.0f} "
        f"warp-instructions per {unit}"
    )
    for key, n in cnt.most_common(a.lines):
        print(f"  {n:5d}  {key:28s} {dict(ops[key].most_common(4))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
