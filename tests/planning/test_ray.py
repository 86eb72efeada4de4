"""Ray: a sweep on a token-authenticated cluster started here (bound to 127.0.0.1) equals the process
pool's; a local `--ray` does too; a wrong token, a closed port or a port that is not Ray each end in
one line, within the timeout; workers receive the project's packages and nothing else.

Every Ray here runs in a child process (the cluster's head, each CLI driver) with its own HOME, so no
test touches the user's ~/.ray, and this pytest process never imports Ray.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import typer
from planning_helpers import write_sweep
from typer.testing import CliRunner

from planning.commands import register_commands
from planning.executor import ROOT, PlanningError
from planning.raycluster import LOOPBACK_ENV, WORKER_PACKAGES, is_loopback, probe, split_address, stage_worker_code

RAY_CLI = Path(sys.executable).parent / "ray"
needs_ray = pytest.mark.skipif(not RAY_CLI.exists(), reason="ray is not installed (pip install 'hacksim[ray]')")
SPEC = {
    "axes": {"network.bandwidth_gbps": [10, 40], "workload.arrival.rate_rps": [0.5, 2.0]},
    "set": {"workload.requests": 20},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def home_with_token(folder: Path) -> Path:
    (folder / ".ray").mkdir(parents=True)
    (folder / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    return folder


def clean_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return {**env, "HOME": str(home), "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """`ray start --head --block` on 127.0.0.1 with a token in its HOME (so token auth is on, as Ray does by
    default); stopped through its own process handle, which stops the GCS and raylet it started."""
    if not RAY_CLI.exists():
        pytest.skip("ray is not installed")
    home = home_with_token(tmp_path_factory.mktemp("head_home"))
    temp_dir = tempfile.mkdtemp(prefix="hsray", dir="/tmp")  # Ray's socket paths must stay short
    port = free_port()
    proc = subprocess.Popen(
        [
            str(RAY_CLI),
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
        ],
        env={**clean_env(home), LOOPBACK_ENV: "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "Ray runtime started" in line or not line:
                break
        assert "Ray runtime started" in lines[-1], "".join(lines)[-3000:]
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its pipe drained
        yield {"address": f"127.0.0.1:{port}", "home": home, "port": port}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def cli(args: list, home: Path, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *map(str, args)],
        env=clean_env(home),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.fixture(scope="module")
def pool_table(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pool")
    import yaml
    from planning_helpers import TINY_BASE

    (folder / "base.yaml").write_text(yaml.safe_dump(TINY_BASE, sort_keys=False))
    sweep = write_sweep(folder, SPEC)
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register_commands(app)
    r = CliRunner().invoke(app, ["sweep", str(sweep), "--out", str(folder / "out"), "--jobs", "1", "--no-report"])
    assert r.exit_code == 0, r.output
    return sweep, pd.read_csv(folder / "out" / "results.csv")


def network_address() -> str | None:
    """This machine's address on its default route (no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        here = s.getsockname()[0]
    return None if here.startswith("127.") else here


@needs_ray
def test_the_cluster_listens_on_loopback_only(head):
    here = network_address()
    if here is None:
        pytest.skip("this machine has no network address besides loopback")
    with pytest.raises(OSError):
        socket.create_connection((here, head["port"]), timeout=2).close()


WORKER_PROBE = """
import json, sys
from planning import raycluster
ray = raycluster.import_ray(sys.argv[1])
raycluster.connect(ray, sys.argv[1], 30)
@ray.remote
def where():
    import catalog, costmodel, kernels_calibration, planning.executor, simulator.run
    return [m.__file__ for m in (catalog, costmodel, kernels_calibration, planning.executor, simulator.run)]
print(json.dumps(ray.get(where.remote())))
ray.shutdown()
"""


@needs_ray
def test_workers_import_the_shipped_packages(head):
    r = subprocess.run(
        [sys.executable, "-c", WORKER_PROBE, head["address"]],
        env=clean_env(head["home"]),
        cwd="/",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    files = json.loads(r.stdout.splitlines()[-1])
    assert all("/working_dir_files/" in f and not f.startswith(str(ROOT)) for f in files), files


@needs_ray
def test_sweep_on_a_token_cluster_equals_the_pool(head, pool_table, tmp_path):
    sweep, expected = pool_table
    r = cli(["sweep", sweep, "--out", tmp_path / "o", "--no-report", "--ray-address", head["address"]], head["home"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "InvalidAuthToken" not in r.stderr and "4 points simulated" in r.stdout and "ray worker" in r.stdout
    pd.testing.assert_frame_equal(expected, pd.read_csv(tmp_path / "o" / "results.csv"))


@needs_ray
def test_a_wrong_token_is_one_line_within_the_timeout(head, pool_table, tmp_path):
    t0 = time.monotonic()
    r = cli(
        ["sweep", pool_table[0], "--out", tmp_path / "o", "--ray-address", head["address"], "--ray-timeout", "4"],
        home_with_token(tmp_path / "home"),
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-3000:]
    assert r.stderr.startswith("error: --ray-address") and "token" in r.stderr and "auth_token" in r.stderr
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "o" / "results.csv").exists()


@needs_ray
def test_local_ray_equals_the_pool(pool_table, tmp_path):
    r = cli(["sweep", pool_table[0], "--out", tmp_path / "o", "--no-report", "--ray", "--jobs", "2"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr == "" and "4 points simulated" in r.stdout
    pd.testing.assert_frame_equal(pool_table[1], pd.read_csv(tmp_path / "o" / "results.csv"))


def test_nothing_listening_is_refused_at_once():
    t0 = time.monotonic()
    with pytest.raises(PlanningError, match=r"127\.0\.0\.1:\d+: cannot connect"):
        probe(f"127.0.0.1:{free_port()}", 5.0)
    assert time.monotonic() - t0 < 5


class _Reply(socketserver.BaseRequestHandler):
    reply = b""

    def handle(self):
        self.request.recv(64)
        if self.reply:
            self.request.sendall(self.reply)
        else:
            time.sleep(1.5)


@pytest.mark.parametrize(
    "reply, message",
    [
        (b"HTTP/1.0 400 Bad Request\r\n\r\n", "not Ray"),
        (b"", "no answer within 0.5 s"),
    ],
)
def test_a_port_that_is_not_ray(reply, message):
    handler = type("Handler", (_Reply,), {"reply": reply})
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(PlanningError, match=message):
            probe(f"127.0.0.1:{server.server_address[1]}", 0.5)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "address, host, port, loopback",
    [
        ("10.0.0.5:6379", "10.0.0.5", 6379, False),
        ("ray://head.example:10001", "head.example", 10001, False),
        ("localhost:6379", "localhost", 6379, True),
        ("[::1]:6379", "::1", 6379, True),
        ("127.0.0.2:1", "127.0.0.2", 1, True),
    ],
)
def test_addresses(address, host, port, loopback):
    assert split_address(address) == (host, port) and is_loopback(address) is loopback


@pytest.mark.parametrize("address", ["head", "head:0", "head:99999", "http://head:8265", "a b:1"])
def test_a_malformed_address_is_refused(address):
    with pytest.raises(PlanningError, match="expected HOST:PORT"):
        split_address(address)


def test_workers_receive_the_project_packages_only(tmp_path):
    """Installed with pip, the packages sit in site-packages beside every other library: none of those travel."""
    site = tmp_path / "site-packages"
    for package in WORKER_PACKAGES:
        shutil.copytree(ROOT / package, site / package)
    for extra in (
        "numpy/core/big.so",
        "ray/__init__.py",
        "reports/html.py",
        "cli.py",
        "costmodel/__pycache__/phases.cpython-311.pyc",
        "kernels_calibration/profiles/h200/runs/r1/log.txt",
        "kernels_calibration/kernels/hack_decode.py",
    ):
        (site / extra).parent.mkdir(parents=True, exist_ok=True)
        (site / extra).write_bytes(b"x" * 1000)
    staged = stage_worker_code(tmp_path / "staged", root=site)
    files = [p.relative_to(staged) for p in staged.rglob("*") if p.is_file()]
    assert {p.parts[0] for p in files} == set(WORKER_PACKAGES)
    assert all(p.suffix in (".py", ".json", ".csv", ".yaml") and "__pycache__" not in p.parts for p in files)
    assert not any("runs" in p.parts or "kernels" in p.parts for p in files)
    for needed in (
        "simulator/run.py",
        "planning/executor.py",
        "catalog/data/models.yaml",
        "kernels_calibration/profiles/h200/profile.json",
        "kernels_calibration/__init__.py",
    ):
        assert Path(needed) in files, needed
    assert sum((staged / p).stat().st_size for p in files) < 4 * 2**20
