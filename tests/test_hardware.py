"""Hardware a user brings (issue 30): a GPU given by its short spec is completed by the stated rules and says so,
a pool priced by roofline or by another GPU's profile is warned about, and a pool may name its host."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel.phases import CPU_FLOPS_PER_VCPU
from costmodel.specs import GIB
from helpers import scenario
from simulator.config import ScenarioError
from simulator.resolve import resolve
from simulator.run import run_scenario

ROOT = Path(__file__).resolve().parent.parent
A10G_PROFILE = ROOT / "kernels_calibration" / "profiles" / "a10g" / "profile.json"
# an RTX 3090 as its owner would give it: nvidia-smi / torch memory, and the datasheet's four figures
SHORT = {
    "memory_gib": 23.59,
    "memory_bandwidth_gb_per_s": 936,
    "fp16_tensor_tflops": 71,
    "sms": 82,
    "boost_clock_ghz": 1.695,
}


def test_a_short_gpu_spec_is_completed_by_the_stated_rules():
    s = scenario(**{"decode.gpu": dict(SHORT, name="rtx3090")})
    pool = resolve(s, "test").decode
    g = pool.gpu
    assert g.key == "rtx3090" and g.memory_bytes == 23.59 * GIB
    assert g.fp32_tflops == pytest.approx(2 * 82 * 128 * 1.695e9 / 1e12, rel=1e-12)  # 35.58: 2 x SMs x 128 x clock
    assert g.int8_tensor_tops == 142.0  # 2 x FP16
    assert g.fp8_tensor_tflops is None  # compute capability taken as 8.0: no FP8 tensor cores
    assert (g.warp_schedulers_per_sm, g.sfu_ops_per_clock_per_sm, g.pcie_gb_per_s) == (4, 16, 24.0)
    assert g.compute_capability == "8.0" and g.pcie_peer_access is False
    derived = {k: v for k, v, _ in pool.gpu_derived}
    assert set(derived) == {
        "arch",
        "compute_capability",
        "fp32_tflops",
        "int8_tensor_tops",
        "fp8_tensor_tflops",
        "warp_schedulers_per_sm",
        "sfu_ops_per_clock_per_sm",
        "pcie_gb_per_s",
        "pcie_peer_access",
    }
    assert any("derived" in w and "fp32_tflops=35.58144" in w for w in pool.warnings)
    # what a user states is kept, an explicit null included; compute capability 8.9 brings FP8 at 2 x FP16
    s = scenario(**{"decode.gpu": dict(SHORT, compute_capability="8.9", int8_tensor_tops=None, pcie_peer_access=True)})
    g = resolve(s, "test").decode.gpu
    assert g.fp8_tensor_tflops == 142.0 and g.int8_tensor_tops is None and g.pcie_peer_access is True


def test_a_catalog_gpu_derives_nothing_and_an_override_of_its_memory_replaces_it():
    pool = resolve(scenario(**{"decode.gpu": "rtx4090"}), "test").decode
    assert pool.gpu_derived == () and pool.gpu.memory_bytes == 25_386_352_640  # deviceQuery of an RTX 4090
    g = resolve(scenario(**{"decode.gpu": {"preset": "rtx4090", "memory_gib": 20}}), "test").decode.gpu
    assert g.memory_bytes == 20 * GIB and g.fp16_tensor_tflops == 165.2


@pytest.mark.parametrize(
    "gpu, match",
    [
        ({k: v for k, v in SHORT.items() if k != "sms"}, "decode.gpu.sms"),
        (dict(SHORT, memory_bytes=2.5e10), "memory_bytes or memory_gib"),
        ({k: v for k, v in SHORT.items() if k != "memory_gib"}, "memory_bytes or memory_gib"),
        (dict(SHORT, compute_capability="nine"), "decode.gpu.compute_capability"),
    ],
)
def test_an_incomplete_or_contradictory_gpu_spec_is_one_line(gpu, match):
    with pytest.raises(ScenarioError, match=match):
        scenario(**{"decode.gpu": gpu})


def test_roofline_pricing_is_warned_about_and_recorded():
    """A GPU without a profile falls back to the roofline: said on the pool and in profiles.json; a catalog GPU
    under auto takes its committed (derived) profile and is not warned about."""
    s = scenario(methods=["baseline"], **{"decode.gpu": SHORT, "calibration.decode_profile": "auto"})
    result = run_scenario(s, source="test")
    warnings = result.profiles()["warnings"]
    assert any(w.startswith("decode pool (custom) is priced by roofline (no profile for custom") for w in warnings)
    assert "calibrate --derive GPU.yaml (its fields) --out DIR" in " ".join(warnings)
    assert result.profiles()["decode"]["gpu_derived"]["fp32_tflops"]["rule"].startswith("2 x sms x 128")
    s = scenario(methods=["baseline"], **{"decode.gpu": "rtx4090", "calibration.decode_profile": "auto"})
    assert not any(w.startswith("decode pool") for w in resolve(s, "test").warnings)
    assert resolve(s, "test").decode.profile.source == "derived"
    # asked for by name: still said (the helper's scenarios price both pools by roofline)
    assert any("calibration.prefill_profile is roofline" in w for w in resolve(scenario(), "test").warnings)


def test_a_profile_for_another_gpu_is_warned_about():
    """The README's --profile example priced an A100 decode pool with the A10G profile (TPOT 17.6 -> 42.4 ms)
    without a word."""
    s = scenario(methods=["baseline"], **{"calibration.decode_profile": str(A10G_PROFILE)})
    (w,) = [w for w in resolve(s, "test").warnings if w.startswith("decode pool")]
    assert "runs a100_80gb but its profile" in w and "is for a10g" in w
    assert w in run_scenario(s, source="test").profiles()["warnings"]
    same = scenario(methods=["baseline"], **{"decode.gpu": "a10g", "calibration.decode_profile": str(A10G_PROFILE)})
    assert not [w for w in resolve(same, "test").warnings if w.startswith("decode pool")]


def test_simulate_prints_the_warnings_on_stderr(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "simulate", "scenarios/a10g_10gbps.yaml", "--requests", "5",
         "--methods", "baseline", "--profile", str(A10G_PROFILE), "--out", str(tmp_path / "o"), "--no-report"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "warning: decode pool runs a100_80gb but its profile" in r.stderr and "warning" not in r.stdout
    profiles = json.loads((tmp_path / "o" / "profiles.json").read_text())
    assert any("is for a10g" in w for w in profiles["warnings"])


def test_a_pool_names_its_host():
    """host: CPU threads for PQCache's K-Means, memory for offloaded KV, and each GPU's link to host memory:
    min(GPU PCIe 24, slots 50, 40 GB/s of DRAM shared by the 4 GPUs of one host = 10)."""
    host = {"vcpus": 8, "memory_gib": 100, "memory_bandwidth_gb_per_s": 40, "pcie_gb_per_s": 50}
    s = scenario(**{"decode.tensor_parallel": 4, "decode.host": host, "prefill.host": {"vcpus": 12}})
    res = resolve(s, "test")
    assert res.decode.host_vcpus == 8 and res.decode.host_memory_bytes == 100 * GIB
    assert res.decode.gpu.pcie_gb_per_s == 10.0
    assert res.prefill.host_vcpus == 12 and res.prefill.gpu.pcie_gb_per_s == 24  # the A100's own link
    pre, _ = res.costs(s.methods[0])
    from costmodel.methods import PQCache

    pq = PQCache()
    pre, _ = res.costs(pq)
    assert pre.kmeans_iteration_s(1000) == pytest.approx(
        1000 * pq.kmeans_flops_per_token_iteration(res.model) / (12 * CPU_FLOPS_PER_VCPU), rel=1e-12
    )
    with pytest.raises(ScenarioError, match="host.memory_gib or host_memory_gib"):
        scenario(**{"decode.host": {"memory_gib": 10}, "decode.host_memory_gib": 10})


def test_pqcache_runs_on_a_named_host_without_an_instance():
    s = scenario(methods=["pqcache"], **{"prefill.host": {"vcpus": 16}})
    assert run_scenario(s, source="test").summary["methods"]["pqcache"]["completed"] == 1
    with pytest.raises(ScenarioError, match="prefill.host.vcpus"):
        run_scenario(scenario(methods=["pqcache"]), source="test")


def _cli(*args):
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *map(str, args)], capture_output=True, text=True, cwd=ROOT
    )


def test_calibrate_derives_a_profile_for_any_gpu(tmp_path):
    """--derive takes a catalog key or a YAML file with a GPU's (short) spec; the profile is derive.py's, and a
    short spec's derived fields are printed and recorded in it."""
    from kernels_calibration.derive import HERE, derive

    src = json.loads((HERE / "h200" / "profile.json").read_text())
    r = _cli("calibrate", "--derive", "rtx4090", "--out", tmp_path / "rtx4090")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "rtx4090" / "profile.json").read_text()) == json.loads(
        json.dumps(derive(src, "rtx4090"))
    )
    assert "measured profile" not in r.stderr
    # a GPU with a measured profile (the H100) still derives, and says which profile its pools use
    r = _cli("calibrate", "--derive", "h100", "--out", tmp_path / "h100")
    assert r.returncode == 0, r.stderr
    assert "note: h100 has a measured profile (kernels_calibration/profiles/h100/profile.json)" in r.stderr
    assert json.loads((tmp_path / "h100" / "profile.json").read_text()) == json.loads(json.dumps(derive(src, "h100")))
    spec = tmp_path / "rtx3090.yaml"
    spec.write_text(json.dumps(dict(SHORT, name="rtx3090")))
    r = _cli("calibrate", "--derive", spec, "--out", tmp_path / "mine")
    assert r.returncode == 0, r.stderr
    assert "derived fp32_tflops = 35.58144 (2 x sms x 128 FP32 lanes x boost_clock_ghz)" in r.stderr
    prof = json.loads((tmp_path / "mine" / "profile.json").read_text())
    assert prof["gpu"] == "rtx3090" and prof["source"] == "derived" and "int8_tensor_tops" in prof["gpu_derived"]
    # a scenario prices its pool with it, and no warning remains for that pool
    s = scenario(methods=["baseline"], **{"decode.gpu": dict(SHORT, name="rtx3090", int8_tensor_tops=142.0),
                                          "calibration.decode_profile": str(tmp_path / "mine" / "profile.json")})  # fmt: skip
    assert not [w for w in resolve(s, "test").warnings if w.startswith("decode pool") and "derived" not in w]


@pytest.mark.parametrize(
    "args, match",
    [
        (("--derive", "rtx9999", "--out", "x"), "not a catalog GPU"),
        (("--derive", "rtx4090"), "--out DIR"),
        (("--derive", "h200", "--out", "x"), "measured, not derived"),
        (("--derive", "rtx4090", "--traces", "i.csv", "--out", "x"), "separate jobs"),
    ],
)
def test_calibrate_derive_refuses_bad_input_in_one_line(args, match, tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "cli.py"), "calibrate", *args], capture_output=True, text=True,
                       cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2 and match in r.stderr and "Traceback" not in r.stderr
