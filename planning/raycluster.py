"""Ray for sweeps and plans: a local Ray on 127.0.0.1, or an existing cluster joined by address.

Each thing a real cluster needs, and how it is met here:

- **Token authentication.** Ray turns token auth on for `ray start` whenever a token exists
  (`~/.ray/auth_token`) and for `address="auto"`, but not for a driver given an explicit
  address, which then fails with `InvalidAuthToken` for 20 s. So when `RAY_AUTH_MODE` is unset and a
  token is available here (`RAY_AUTH_TOKEN`, the file at `RAY_AUTH_TOKEN_PATH`, or
  `~/.ray/auth_token`), `import_ray` sets `RAY_AUTH_MODE=token` before Ray reads it; a cluster
  without authentication ignores the token.
- **A bounded connect.** Ray retries an unreachable or wrong address for minutes. Before
  `ray.init`, `probe` opens a TCP connection to HOST:PORT and checks that it answers the HTTP/2
  preface with a SETTINGS frame (gRPC, as Ray's GCS and client server speak), each within the
  timeout; Ray's own retries are capped at the same timeout (`RAY_gcs_server_port_wait_time_s`).
  What Ray prints meanwhile is captured and turned into one line that says what to check.
- **Only the project's code travels.** `stage_worker_code` copies the packages a worker imports
  (`WORKER_PACKAGES`: their `.py` files and the packaged catalog and calibration data, nothing
  else) into a temporary folder, which becomes the job's `runtime_env` `working_dir`. Shipping the
  folder above the packages instead would, for a pip install, upload all of site-packages. The
  workers need hacksim's dependencies installed (`pip install hacksim` on every node does it).
- **Loopback only, locally.** A local Ray binds 127.0.0.1. Ray replaces 127.0.0.1 by the machine's
  address unless `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, which Ray reads when it is first imported,
  so `import_ray` sets it before that import when the Ray wanted is on this machine.
- **A local Ray of its own.** `ray.init()` without an address joins a cluster it finds (`RAY_ADDRESS`,
  or one `ray start` left in /tmp/ray) and then refuses `num_cpus` ("When connecting to an existing
  cluster, num_cpus and num_gpus must not be provided"); `start_local` passes `address="local"`, which
  always starts a new one (`canonicalize_bootstrap_address` in ray/_private/services.py, Ray 2.60).
- **Stdout is the result's.** Ray's driver prints the error messages the cluster publishes (a worker
  or a whole node lost, with its crash report) on stdout, from a thread of its own
  (`listen_error_messages` in ray/_private/worker.py, Ray 2.60, with `is_err: False`), whatever
  `log_to_driver` says. `RayOutput` sends the process's stdout to stderr, file descriptor and
  `sys.stdout` both, from before `ray.init` until after `ray.shutdown`; the commands print their result
  once Ray is shut down, so `--json` output stays valid.
- **Our SIGTERM handler.** `ray.init` installs its own (`sys.exit(signum)`), which would skip the
  "interrupted: run the same command to resume" path; `_keep_sigterm` puts the caller's back.
- **A head that stops answering.** Ray's driver gives up on a lost GCS after
  `gcs_rpc_server_reconnect_timeout_s` (60 s) by exiting with status 1 from C++, saying nothing of
  the run. `HeadWatch` opens a TCP connection to the head's GCS every second; when none succeeds for
  `--ray-timeout` seconds it says what happened, how many points are cached and the command that
  resumes, and ends the process (EXIT_CLUSTER_LOST); Ray's own limit is raised above ours for that.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
import os
import re
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from . import ROOT, PlanningError

RAY_EXTRA_HINT = "pip install 'hacksim[ray]'"
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# What a worker imports: simulate_point (planning.executor) and what it runs, with the packaged data.
WORKER_PACKAGES = {
    "catalog": ("**/*.py", "data/*.yaml", "data/*.csv"),
    "costmodel": ("**/*.py",),
    "kernels_calibration": ("__init__.py", "profiles/*/*.json", "profiles/*/*.csv"),
    "planning": ("**/*.py",),
    "simulator": ("**/*.py",),
}
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + empty SETTINGS
_H2_SETTINGS = 4


def is_loopback(address: str | None) -> bool:
    """True for a Ray on this machine: None (start one) or an address whose host is loopback."""
    if address is None:
        return True
    if address == "auto":
        return False
    host = split_address(address)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def import_ray(address: str | None):
    """Import Ray with the environment it reads at import: loopback for a Ray on this machine, token
    auth for a cluster when a token is here and RAY_AUTH_MODE is unset."""
    loopback = is_loopback(address)
    fresh = "ray" not in sys.modules
    if fresh and loopback:
        os.environ.setdefault(LOOPBACK_ENV, "0")
    token = address is not None and "RAY_AUTH_MODE" not in os.environ and token_available()
    if token:
        os.environ["RAY_AUTH_MODE"] = "token"
    try:
        import ray
    except ImportError:
        raise PlanningError(f"--ray needs Ray, which is not installed: {RAY_EXTRA_HINT}") from None
    if ray.is_initialized():
        return ray  # a Ray the caller started and configured
    if loopback and os.environ.get(LOOPBACK_ENV) != "0":
        raise PlanningError(
            f"Ray was imported before hacksim could keep it on 127.0.0.1: set {LOOPBACK_ENV}=0 before importing ray"
        )
    if token and not fresh:
        # Ray read RAY_AUTH_MODE at import; this is how Ray itself re-reads it. Config lives in a compiled
        # module that declares no names to a type checker.
        from ray._raylet import Config  # pyright: ignore[reportAttributeAccessIssue]

        Config.initialize("")
    return ray


def split_address(address: str) -> tuple[str, int]:
    m = re.fullmatch(r"(?:ray://)?(\[[0-9a-fA-F:]+\]|[^:/\s]+):(\d{1,5})/?", address)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise PlanningError(
            f"--ray-address {address!r}: expected HOST:PORT (the head's GCS, "
            "`ray start --head --port=PORT`), ray://HOST:PORT (Ray Client) or auto"
        )
    return m.group(1).strip("[]"), int(m.group(2))


def probe(address: str, timeout_s: float) -> None:
    """Refuse, within `timeout_s`, an address where nothing listens or something other than gRPC does."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            s.sendall(_H2_PREFACE)
            head = _read(s, 9)
    except TimeoutError:
        raise PlanningError(
            f"--ray-address {address}: no answer within {timeout_s:g} s: check the host name, that "
            "the head node runs `ray start --head`, and that a firewall lets this machine reach the "
            "port (--ray-timeout sets the wait)"
        ) from None
    except OSError as e:
        raise PlanningError(
            f"--ray-address {address}: cannot connect ({e.strerror or e}): check the host name and "
            "that the head node runs `ray start --head --port=PORT` with this port"
        ) from None
    if len(head) < 9 or head[3] != _H2_SETTINGS:
        raise PlanningError(
            f"--ray-address {address}: something answers there but it is not Ray (no gRPC): give the "
            "head's GCS port (`ray start --head --port`, default 6379), or ray://HOST:10001 for "
            "Ray Client, not the dashboard's"
        )


def _read(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def token_available() -> bool:
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return Path(path).expanduser().is_file() if path else (Path.home() / ".ray" / "auth_token").is_file()


def stage_worker_code(dest: Path, root: Path = ROOT) -> Path:
    """Copy WORKER_PACKAGES' files from `root` into `dest` (the Ray job's working_dir); returns `dest`."""
    for package, patterns in WORKER_PACKAGES.items():
        for pattern in patterns:
            for src in sorted((root / package).glob(pattern)):
                if src.is_file() and "__pycache__" not in src.parts:
                    target = dest / src.relative_to(root)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, target)
    return dest


def connect(ray, address: str, timeout_s: float) -> None:
    """ray.init against an existing cluster, shipping only the project's code; one-line PlanningError on failure."""
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise PlanningError(f"--ray-timeout must be > 0 seconds and finite, got {timeout_s}")
    if address != "auto":
        probe(address, timeout_s)
    with (
        tempfile.TemporaryDirectory(prefix="hacksim-ray-") as tmp,
        _captured_stderr() as captured,
        _keep_sigterm(),
        _env_default("RAY_gcs_server_port_wait_time_s", str(max(1, math.ceil(timeout_s)))),
        _env_default("RAY_gcs_rpc_server_reconnect_timeout_s", str(ray_gives_up_s(timeout_s))),
    ):
        env = {"working_dir": str(stage_worker_code(Path(tmp)))}
        try:
            ray.init(address=address, runtime_env=env, logging_level=logging.WARNING, log_to_driver=False)
        except Exception as e:  # noqa: BLE001 - ConnectionError, RuntimeError, AuthenticationError, ...
            raise PlanningError(explain(address, e, captured.read())) from None


def explain(address: str, error: Exception, ray_output: str) -> str:
    """One line for a failed connect, from Ray's exception and what it printed."""
    text = f"{error} {error.__cause__ or ''} {ray_output}"
    if "InvalidAuthToken" in text or "Unauthenticated" in text or type(error).__name__ == "AuthenticationError":
        return (
            f"--ray-address {address}: the cluster uses token authentication and refused this machine's token: "
            "copy the head node's ~/.ray/auth_token here (or set RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH)"
        )
    if "ersion mismatch" in text:
        return (
            f"--ray-address {address}: Ray or Python versions differ between this machine and the cluster: "
            "install the same versions on both"
        )
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    return f"--ray-address {address}: cannot connect: {first}"


def start_local(ray, jobs: int, timeout_s: float = 30.0) -> None:
    """A new Ray on this machine, of its own whatever else runs here, bound to 127.0.0.1, with the
    checkout on the workers' path."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with (
        _captured_stderr(),  # Ray's notes about the token it generates for a new local cluster
        _keep_sigterm(),
        _env_default("RAY_gcs_rpc_server_reconnect_timeout_s", str(ray_gives_up_s(timeout_s))),
    ):
        try:
            ray.init(
                address="local",
                num_cpus=jobs,
                runtime_env={"env_vars": {"PYTHONPATH": path}},
                include_dashboard=False,
                logging_level=logging.WARNING,
                log_to_driver=False,
                _node_ip_address="127.0.0.1",
            )
        except Exception as e:  # noqa: BLE001 - whatever stops Ray from starting, said in one line
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise PlanningError(f"--ray: cannot start a local Ray: {first}") from None


def ray_gives_up_s(timeout_s: float) -> int:
    """Ray's own wait for a lost GCS, kept above HeadWatch's so that ours speaks first."""
    return max(60, math.ceil(timeout_s) + 30)


@contextlib.contextmanager
def _keep_sigterm():
    """Put back the SIGTERM handler `ray.init` replaces (in the main thread, where handlers live)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


class RayOutput:
    """While Ray runs in this process, what it prints to stdout goes to stderr: file descriptor 1 points
    at descriptor 2 and `sys.stdout` is `sys.stderr`; `restore()` puts both back."""

    def __init__(self):
        sys.stdout.flush()
        self._fd = os.dup(1)
        self._stdout = sys.stdout
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def write_result(self, text: str) -> None:
        """Write to the real stdout (the result, while Ray's output goes to stderr)."""
        if self._fd is not None:
            os.write(self._fd, text.encode())

    def restore(self) -> None:
        if self._fd is None:
            return
        sys.stdout.flush()
        os.dup2(self._fd, 1)
        os.close(self._fd)
        sys.stdout = self._stdout
        self._fd = None


def gcs_address(ray, given: str | None) -> str | None:
    """HOST:PORT of the cluster's GCS, as Ray knows it (else the address given, less any ray://)."""
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # noqa: BLE001 - Ray Client, or an older Ray: fall back on what was given
        if given and given != "auto":
            host, port = split_address(given)
            return f"{host}:{port}"
        return None


def reachable(address: str, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to HOST:PORT opens within `timeout_s`."""
    host, port = split_address(address)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


class HeadWatch:
    """Calls `on_lost(seconds)` once no connection to the head's GCS has opened for `timeout_s` seconds,
    probing every `interval_s` in a daemon thread (`start`/`stop`), or on each `check()` (tests drive
    that with their own `probe` and `clock`)."""

    def __init__(
        self,
        address: str,
        timeout_s: float,
        on_lost,
        probe=reachable,
        clock=None,
        interval_s: float = 1.0,
    ):
        import threading
        import time

        self.address, self.timeout_s, self.on_lost = address, timeout_s, on_lost
        self.probe, self.clock, self.interval_s = probe, clock or time.monotonic, interval_s
        self.last_ok = self.clock()
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> bool:
        """One probe; True once the head has been unreachable for `timeout_s` (and `on_lost` was called)."""
        if self.lost:
            return True
        now = self.clock()
        if self.probe(self.address):
            self.last_ok = now
        elif now - self.last_ok >= self.timeout_s:
            self.lost = True
            self.on_lost(now - self.last_ok)
        return self.lost

    def settle(self, limit_s: float) -> None:
        """After Ray raised: return at once if the head answers; else wait (at most `limit_s`) for the watch
        to find it lost, which ends the process."""
        import time

        if self.probe(self.address):
            return
        end = time.monotonic() + limit_s
        while not self.lost and time.monotonic() < end:
            time.sleep(0.2)

    def start(self) -> None:
        import threading

        def loop():
            while not self._stop.wait(self.interval_s):
                if self.check():
                    return

        self._thread = threading.Thread(target=loop, name="hacksim-ray-head-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


@contextlib.contextmanager
def _env_default(name: str, value: str):
    """Set an environment variable for the block unless the user set it."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


class _Captured:
    def __init__(self, file):
        self.file = file

    def read(self) -> str:
        self.file.seek(0)
        return self.file.read().decode(errors="replace")


@contextlib.contextmanager
def _captured_stderr():
    """Send file descriptor 2 (Ray's C++ and Python logging) to a temporary file for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield _Captured(f)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
