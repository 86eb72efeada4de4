"""Ray: a sweep on a token-authenticated cluster started here (bound to 127.0.0.1) equals the process
pool's; a local `--ray` does too; a wrong token, a closed port or a port that is not Ray each end in
one line, within the timeout; workers receive the project's packages and nothing else.

Every Ray here runs in a child process (the cluster's head, each CLI driver) with its own HOME, so no
test touches the user's ~/.ray, and this pytest process never imports Ray.
"""

from __future__ import annotations

import contextlib
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


def home_with_token(folder: Path) -> Path:
    (folder / ".ray").mkdir(parents=True)
    (folder / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    return folder


def clean_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return {**env, "HOME": str(home), "PYTHONPATH": str(ROOT)}


@contextlib.contextmanager
def ray_head(home: Path, num_cpus: int = 2):
    """`ray start --head --block` on 127.0.0.1 in a temp dir of its own, on a port Ray picks (`--port=0`: no
    "free" port that someone else may take first), with a token in its HOME (so token auth is on, as Ray
    does by default). Yields {"address", "port", "proc"}; stopped through its own process handle, which stops
    the GCS and raylet it started. Nothing here depends on another Ray running on the machine, or on time:
    a head that never starts is killed by a guard after 10 minutes, and the test fails with its output."""
    temp_dir = tempfile.mkdtemp(prefix="hsray", dir="/tmp")  # Ray's socket paths must stay short
    proc = subprocess.Popen(
        [
            str(RAY_CLI),
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            "--port=0",
            f"--num-cpus={num_cpus}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
        ],
        env={**clean_env(home), LOOPBACK_ENV: "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    guard = threading.Timer(600, proc.kill)
    guard.start()
    try:
        lines = []
        for line in proc.stdout:  # `ray start` writes the address it chose, then says it will block
            lines.append(line)
            if "will now block forever" in line:
                break
        assert lines and "will now block forever" in lines[-1], "".join(lines)[-3000:]
        guard.cancel()
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its pipe drained
        address = (Path(temp_dir) / "ray_current_cluster").read_text().strip()  # the GCS address Ray chose
        yield {"address": address, "port": int(address.rsplit(":", 1)[1]), "proc": proc}
    finally:
        guard.cancel()
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    if not RAY_CLI.exists():
        pytest.skip("ray is not installed")
    home = home_with_token(tmp_path_factory.mktemp("head_home"))
    with ray_head(home) as h:
        yield {**h, "home": home}


def cli(args: list, home: Path, timeout_s: float = 600) -> subprocess.CompletedProcess:
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
def test_a_wrong_token_is_one_line(head, pool_table, tmp_path):
    r = cli(
        ["sweep", pool_table[0], "--out", tmp_path / "o", "--ray-address", head["address"], "--ray-timeout", "4"],
        home_with_token(tmp_path / "home"),
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-3000:]
    assert r.stderr.startswith("error: --ray-address") and "token" in r.stderr and "auth_token" in r.stderr
    assert not (tmp_path / "o" / "results.csv").exists()


@needs_ray
def test_local_ray_is_its_own_beside_another_cluster(head, pool_table, tmp_path):
    """--ray starts a Ray of its own even where another runs and RAY_ADDRESS names it: joining that one failed
    with "When connecting to an existing cluster, num_cpus and num_gpus must not be provided"."""
    env = {**clean_env(tmp_path), "RAY_ADDRESS": head["address"]}
    r = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "sweep", str(pool_table[0]), "--out", str(tmp_path / "o")]
        + ["--no-report", "--ray", "--jobs", "2"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr == "" and "4 points simulated" in r.stdout and "2 ray worker" in r.stdout
    pd.testing.assert_frame_equal(pool_table[1], pd.read_csv(tmp_path / "o" / "results.csv"))


def test_nothing_listening_is_refused():
    with socket.socket() as held:  # bound, never listening: the port refuses connections and stays ours
        held.bind(("127.0.0.1", 0))
        with pytest.raises(PlanningError, match=r"127\.0\.0\.1:\d+: cannot connect"):
            probe(f"127.0.0.1:{held.getsockname()[1]}", 5.0)


class _Reply(socketserver.BaseRequestHandler):
    reply = b""
    done = threading.Event()

    def handle(self):
        self.request.recv(64)
        if self.reply:
            self.request.sendall(self.reply)
        else:
            self.done.wait(60)  # never answers while the test looks


@pytest.mark.parametrize(
    "reply, message",
    [
        (b"HTTP/1.0 400 Bad Request\r\n\r\n", "not Ray"),
        (b"", "no answer within 0.5 s"),
    ],
)
def test_a_port_that_is_not_ray(reply, message):
    handler = type("Handler", (_Reply,), {"reply": reply, "done": threading.Event()})
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(PlanningError, match=message):
            probe(f"127.0.0.1:{server.server_address[1]}", 0.5)
    finally:
        handler.done.set()
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


# ---- stdout is the result's; a local Ray of its own; a lost head (issue 30) ------------------------------
RAY_OUTPUT_PROBE = """
import os, sys
from planning.raycluster import RayOutput
out = RayOutput()
print("ray says", flush=True)        # Ray's error thread prints with print(..., file=sys.stdout)
os.write(1, b"raylet says\\n")        # and C++ writes to descriptor 1
out.write_result('{"result": 1}\\n')
out.restore()
print("after", flush=True)
"""


def test_while_ray_runs_its_stdout_goes_to_stderr():
    r = subprocess.run([sys.executable, "-c", RAY_OUTPUT_PROBE], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout == '{"result": 1}\nafter\n'
    assert r.stderr == "ray says\nraylet says\n"


class _FakeRay:
    def __init__(self):
        self.kwargs = None

    def init(self, **kwargs):
        self.kwargs = kwargs


def test_a_local_ray_is_started_not_joined():
    """Without address="local", ray.init joins the cluster named by RAY_ADDRESS or left by `ray start` in
    /tmp/ray (ray/_private/services.py canonicalize_bootstrap_address)."""
    from planning.raycluster import start_local

    fake = _FakeRay()
    start_local(fake, 3, 30.0)
    assert fake.kwargs is not None and fake.kwargs["address"] == "local" and fake.kwargs["num_cpus"] == 3


def test_head_watch_speaks_after_the_timeout_without_an_answer():
    from planning.raycluster import HeadWatch

    now, answers, lost = [0.0], [True, True, False, False, False, True], []
    watch = HeadWatch("h:1", 30.0, lost.append, probe=lambda _a: answers.pop(0), clock=lambda: now[0])
    for t in (1.0, 2.0, 3.0, 20.0):  # answers at 1 and 2, silent from 3
        now[0] = t
        assert not watch.check()
    now[0] = 32.0  # 30 s since the last answer, at 2
    assert watch.check() and lost == [30.0]
    now[0] = 40.0
    assert watch.check() and lost == [30.0]  # said once


CRASH_ONCE = """
import os, sys
import planning.executor as executor
real = executor.simulate_point

def crash_once(scenario_json):
    marker = os.environ["HACKSIM_TEST_CRASH_MARKER"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)  # the worker dies: Ray's driver prints "A worker died ..." and retries the task
    return real(scenario_json)

executor.simulate_point = crash_once
sys.argv = ["cli.py", *sys.argv[1:]]
import cli
cli.app()
"""


@needs_ray
def test_a_lost_worker_leaves_stdout_valid_json(pool_table, tmp_path):
    env = {**clean_env(tmp_path), "HACKSIM_TEST_CRASH_MARKER": str(tmp_path / "crashed")}
    r = subprocess.run(
        [sys.executable, "-c", CRASH_ONCE, "sweep", str(pool_table[0]), "--out", str(tmp_path / "o")]
        + ["--no-report", "--ray", "--jobs", "1", "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "crashed").exists() and "A worker died" in r.stderr
    assert json.loads(r.stdout)["rows"] == 8


@needs_ray
def test_a_lost_head_says_so_and_how_to_resume(tmp_path):
    """Ray's driver gave up on a lost GCS after 60 s with exit 1 and no word of the run."""
    import yaml

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "base": str(ROOT / "scenarios" / "a10g_10gbps.yaml"),
                "set": {"methods": ["baseline"]},
                "axes": {"workload.requests": [20, 2_000_000]},  # one quick point, one that outlives the head
            }
        )
    )
    home = home_with_token(tmp_path / "home")
    out = tmp_path / "o"
    with ray_head(home, num_cpus=2) as h:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "cli.py"), "sweep", str(sweep), "--out", str(out), "--no-report"]
            + ["--ray-address", h["address"], "--ray-timeout", "5", "--json"],
            env=clean_env(home),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            while not list((out / ".cache").glob("*/*.json")) and proc.poll() is None:
                time.sleep(0.2)  # the quick point finishes; no deadline: the sweep ends or caches it
            assert proc.poll() is None, proc.communicate()
            h["proc"].terminate()  # the head goes, with its GCS and raylet
            stdout, stderr = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 3, stderr[-3000:]
    message = stderr.strip().splitlines()[-1]
    assert message.startswith(f"error: the Ray head at {h['address']} has not answered for ")
    assert f"the 1 point(s) finished in this run are cached in {out / '.cache'}" in message
    assert "run the same command to resume: python " in message
    assert json.loads(stdout) == {"error": message.removeprefix("error: ")}
    assert len(list((out / ".cache").glob("*/*.json"))) == 1
