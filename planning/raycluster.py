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
    if not timeout_s > 0:
        raise PlanningError(f"--ray-timeout must be > 0, got {timeout_s}")
    if address != "auto":
        probe(address, timeout_s)
    with (
        tempfile.TemporaryDirectory(prefix="hacksim-ray-") as tmp,
        _captured_stderr() as captured,
        _env_default("RAY_gcs_server_port_wait_time_s", str(max(1, math.ceil(timeout_s)))),
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


def start_local(ray, jobs: int) -> None:
    """A Ray on this machine, bound to 127.0.0.1, with the checkout on the workers' path."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with _captured_stderr():  # Ray's notes about the token it generates for a new local cluster
        try:
            ray.init(
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
