"""The offline sm_90 compile (python -m kernels_calibration.sass, run in a subprocess because the
kernel tests import the kernels under the Triton interpreter): the row-packed decode kernel's loop
issues fewer instructions per token than the head-major kernel it replaced (NOTES.md, session 3),
and the register cap the launcher uses above 2K tokens holds without local-memory arrays."""
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
    out = subprocess.run([sys.executable, "-m", "kernels_calibration.sass", "--json", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_row_packed_loop_is_shorter_than_head_major():
    rp = _sass("--kernel", "rp", "--pi", "64", "--warps", "2")
    hm = _sass("--kernel", "head_major", "--pi", "64", "--warps", "2")
    assert rp["warp_instructions_per_128_tokens"] < 0.75 * hm["warp_instructions_per_128_tokens"], (rp, hm)
    capped = _sass("--kernel", "rp", "--pi", "64", "--warps", "2", "--maxnreg", "128")
    assert capped["REG"] <= 128 and capped["LOCAL"] == 0, capped


def test_row_scaled_prefill_loop_is_shorter():
    old = _sass("--kernel", "prefill", "--pi", "64", "--block-m", "64", "--warps", "4", "--stages", "2")
    new = _sass("--kernel", "prefill_rs", "--pi", "64", "--block-m", "64", "--warps", "4", "--stages", "2")
    assert new["warp_instructions_per_128_tokens"] < 0.9 * old["warp_instructions_per_128_tokens"], (new, old)


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
    tm = _sass("--kernel", "token_major", "--dequant", "--pi", "64", "--warps", "4")
    assert tm["lut_ops"] > 0 and tm["lut_ops_not_in_operand_layout"] == 0, tm


def test_gluon_kernels_compile_and_their_loops_are_shorter_than_the_triton_kernels():
    """The Gluon kernels (no interpreter: this compile is their CI check) keep their operands in
    registers (no local memory), use the tensor cores in the loop, and issue fewer instructions per
    token than the Triton kernels they replace or race (NOTES.md, session 5)."""
    for pi in (64, 128):
        r = _sass("--kernel", "gluon_dequant_wgmma", "--pi", str(pi))
        assert r["STACK"] == 0 and r["LOCAL"] == 0, r
        assert r["loop_opcodes"].get("HGMMA", 0) > 0 and r["loop_opcodes"].get("I2F", 0) == 0, r
    dq = _sass("--kernel", "gluon_dequant", "--pi", "64")
    tri = _sass("--kernel", "head_major", "--dequant", "--pi", "64", "--warps", "2", "--maxnreg", "168")
    assert dq["LOCAL"] == 0 and dq["loop_opcodes"].get("HMMA", 0) > 0, dq
    assert dq["warp_instructions_per_128_tokens"] < 0.8 * tri["warp_instructions_per_128_tokens"], (dq, tri)
    hk = _sass("--kernel", "gluon_hack", "--pi", "64")
    rp = _sass("--kernel", "rp", "--pi", "64", "--warps", "2", "--maxnreg", "128")
    assert hk["LOCAL"] == 0 and hk["loop_opcodes"].get("IMMA", 0) > 0, hk   # (56 bytes of spill slots with the tail)
    assert hk["warp_instructions_per_128_tokens"] < 0.85 * rp["warp_instructions_per_128_tokens"], (hk, rp)
    # the K code bytes through the shared-memory ring (ring=3, run 55): cp.async into shared memory and ldmatrix
    # out of it in the loop, no local memory, and no more loop instructions than the plain kernel
    ring = _sass("--kernel", "gluon_hack", "--pi", "64", "--ring", "3", "--prefetch", "1", "--maxnreg", "168")
    plain = _sass("--kernel", "gluon_hack", "--pi", "64", "--prefetch", "1", "--maxnreg", "168")
    assert ring["LOCAL"] == 0 and ring["loop_opcodes"].get("LDGSTS", 0) > 0 and ring["loop_opcodes"].get("LDSM", 0) > 0
    assert "LDGSTS" not in plain["loop_opcodes"], plain
    assert ring["loop_instructions"] <= plain["loop_instructions"], (ring, plain)
    # the launch default's V path (run 57): planes 1-2 unshifted (no SHF) and the metadata by channel pairs
    # (fewer loads): fewer loop instructions, still no local memory
    v = _sass("--kernel", "gluon_hack", "--pi", "64", "--prefetch", "1", "--maxnreg", "168", "--vun", "--vpair")
    assert v["LOCAL"] == 0 and v["loop_instructions"] < plain["loop_instructions"] - 30, (v, plain)
    assert v["loop_opcodes"]["LDG"] < plain["loop_opcodes"]["LDG"] and v["loop_opcodes"]["SHF"] < plain["loop_opcodes"]["SHF"]
