"""The offline sm_90 compile (python -m kernels_calibration.sass, run in a subprocess because the
kernel tests import the kernels under the Triton interpreter): the row-packed decode kernel's loop
issues fewer instructions per token than the head-major kernel (DESIGN.md), the register caps the
launchers use hold without local-memory arrays, and the Gluon kernels (no interpreter) compile."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tools_present() -> bool:
    try:
        import triton
    except ImportError:
        return False
    b = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return all((b / t).exists() for t in ("ptxas", "nvdisasm", "cuobjdump"))


pytestmark = pytest.mark.skipif(not _tools_present(), reason="Triton's NVIDIA tools are not installed")


def _sass(*args) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-m", "kernels_calibration.sass", "--json", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_row_packed_loop_is_shorter_than_head_major():
    rp = _sass("--kernel", "rp", "--pi", "64", "--warps", "2")
    hm = _sass("--kernel", "head_major", "--pi", "64", "--warps", "2")
    assert rp["warp_instructions_per_128_tokens"] < 0.75 * hm["warp_instructions_per_128_tokens"], (rp, hm)
    capped = _sass("--kernel", "rp", "--pi", "64", "--warps", "2", "--maxnreg", "128")
    assert capped["REG"] <= 128 and capped["LOCAL"] == 0, capped


def test_prefill_kernel_compiles_without_local_memory():
    """The prefill kernel (the row-packed tile on 64 or 128 query rows) at its launch defaults: INT8
    tensor-core products in the loop (wgmma or mma.sync, the compiler's choice) and no local memory,
    also at PI 128 with 128 rows and 8 warps."""
    for pi, bm, warps in (("64", "64", "4"), ("128", "128", "8")):
        r = _sass("--kernel", "prefill", "--pi", pi, "--block-m", bm, "--warps", warps, "--stages", "2")
        assert r["LOCAL"] == 0 and r["STACK"] == 0, (pi, r)
        assert any(op in r["loop_opcodes"] for op in ("IMMA", "IGMMA")), (pi, r["loop_opcodes"])


def test_fused_dequant_converts_codes_without_i2f_and_looks_up_in_operand_layouts():
    """Fused dequant turns 2-bit codes into FP16 without integer-to-float conversions (an eighth of the
    FMA rate on sm_90), and its table lookups (common.dequant_lut: four codes of a register share one
    table) run only where the compiler placed them in tensor-core operand layouts, where that holds."""
    hm = _sass("--kernel", "head_major", "--dequant", "--pi", "64", "--warps", "2", "--maxnreg", "168")
    assert hm["loop_opcodes"].get("I2F", 0) == 0, hm["loop_opcodes"]
    assert hm["lut_ops"] > 0 and hm["lut_ops_not_in_operand_layout"] == 0, hm
    for pi, warps in (("32", "2"), ("128", "4")):
        d = _sass("--kernel", "head_major", "--dequant", "--pi", pi, "--warps", warps)
        assert d["lut_ops"] > 0 and d["lut_ops_not_in_operand_layout"] == 0, (pi, d)


def test_gluon_kernels_compile_and_their_loops_are_shorter_than_the_triton_kernels():
    """The Gluon kernels (no interpreter: this compile is their CI check) keep their operands in
    registers (no local memory), use the tensor cores in the loop, and issue fewer instructions per
    token than the Triton kernels they race (DESIGN.md)."""
    dq = _sass("--kernel", "gluon_dequant", "--pi", "64")
    tri = _sass("--kernel", "head_major", "--dequant", "--pi", "64", "--warps", "2", "--maxnreg", "168")
    assert dq["LOCAL"] == 0 and dq["loop_opcodes"].get("HMMA", 0) > 0, dq
    assert dq["warp_instructions_per_128_tokens"] < 0.8 * tri["warp_instructions_per_128_tokens"], (dq, tri)
    hk = _sass("--kernel", "gluon_hack", "--pi", "64", "--maxnreg", "168")  # the launch default's cap
    rp = _sass("--kernel", "rp", "--pi", "64", "--warps", "2", "--maxnreg", "128")
    assert hk["REG"] <= 168 and hk["LOCAL"] == 0 and hk["loop_opcodes"].get("IMMA", 0) > 0, hk
    assert hk["warp_instructions_per_128_tokens"] < 0.85 * rp["warp_instructions_per_128_tokens"], (hk, rp)
    # no longer than the loop DESIGN.md accounts for (1,112 instructions per 64-token tile), with the L1
    # prefetch of the next tile's code bytes (CCTL) in it
    assert hk["loop_instructions"] <= 1112 and hk["loop_opcodes"].get("CCTL", 0) > 0, hk
