"""`rdu-cluster serve --backend ray --address HOST:PORT` joins a cluster started with
`ray start --head` and gives the tables of a local run; without the head's auth token it fails
at once. (An address nothing listens on: tests/test_cli_surface.py.)

The head runs in its own process group and temp dir and is stopped by killing that group, never
with `ray stop` (which stops every Ray instance on the machine, this session's included)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRY = "from rdu_cluster.cli import main; main()"
# Two sockets: each is an actor, a Ray worker process on the head (about a second of CPU).
RUN = ["--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--sockets", "2", "--requests", "20",
       "--rate", "10"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env["RAY_AUTH_MODE"] = "disabled"  # token auth is on by default in recent Ray
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _serve(*args: str, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ENTRY, "serve", *RUN, *args], check=False,
                          cwd=ROOT, env={**_env(), **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


@contextlib.contextmanager
def _head(**env_extra: str):
    """`ray start --head` in its own process group and temp dir; yields its address."""
    ray_bin = Path(sys.executable).with_name("ray")
    if not ray_bin.exists():
        pytest.skip("no ray script beside the interpreter")
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's socket paths have a limit
    cmd = [str(ray_bin), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
           "--include-dashboard=false", f"--dashboard-agent-listen-port={_free_port()}",
           f"--temp-dir={temp}",
           "--disable-usage-stats"]
    head = subprocess.Popen(cmd, env={**_env(), **env_extra}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if head.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"ray start --head did not come up (exit {head.poll()})")
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 5)):  # then SIGKILL: nothing to save
            try:
                os.killpg(head.pid, sig)
            except ProcessLookupError:
                break
            try:
                head.wait(timeout=wait)
                time.sleep(1)  # let the group's other processes exit too
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(head.pid, signal.SIGKILL)  # whatever of the group is left
        except ProcessLookupError:
            pass
        shutil.rmtree(temp, ignore_errors=True)




TOKEN = "rdu-test-token-0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def token_head():
    """One head for the module, with RAY_AUTH_MODE=token (Ray >= 2.52): a run given the token
    joins it; one without is refused. One head, not two: each start and stop costs seconds."""
    ray = pytest.importorskip("ray")
    if not hasattr(ray.exceptions, "AuthenticationError"):
        pytest.skip(f"Ray {ray.__version__} has no token authentication")
    with _head(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN) as address:
        yield address


@pytest.mark.slow
def test_serve_joins_a_ray_head_by_address_with_the_tables_of_a_local_run(token_head, tmp_path):
    import pyarrow.parquet as pq

    remote = _serve("--backend", "ray", "--address", token_head, "--out", str(tmp_path / "ray"),
                    env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN})
    assert remote.returncode == 0, remote.stderr[-2000:]
    assert "(ray backend)" in remote.stdout
    local = _serve("--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr[-2000:]
    for name in ("requests", "steps", "sockets", "links"):
        a = pq.read_table(tmp_path / "local" / f"{name}.parquet")
        b = pq.read_table(tmp_path / "ray" / f"{name}.parquet")
        assert a.to_pylist() == b.to_pylist(), name


@pytest.mark.slow
def test_a_cluster_that_needs_the_auth_token_is_one_line_naming_it(token_head, tmp_path):
    """Joining a head started with RAY_AUTH_MODE=token without its token is one line that
    names RAY_AUTH_TOKEN, at once (ray.init alone retries ~10 s, then raises a bare
    ConnectionError), from serve and from sweep. (An unreachable address: test_cli_surface.)"""
    spec = ROOT / "examples" / "sweeps" / "serve-small.toml"
    no_token = {"HOME": str(tmp_path)}  # no ~/.ray/auth_token either
    for env in ({"RAY_AUTH_MODE": "disabled"}, {"RAY_AUTH_MODE": "token"}):
        for args in (["serve", *RUN, "--backend", "ray", "--out", str(tmp_path / "o")],
                     ["sweep", str(spec), "--backend", "ray", "--out", str(tmp_path / "s")]):
            start = time.monotonic()
            out = subprocess.run([sys.executable, "-c", ENTRY, *args, "--address", token_head],
                                 cwd=ROOT, env={**_env(), **no_token, **env},
                                 capture_output=True, text=True, timeout=120, check=False)
            assert out.returncode == 2, out.stderr[-2000:]
            lines = out.stderr.strip().splitlines()
            assert len(lines) == 1 and "RAY_AUTH_TOKEN" in lines[0], out.stderr[-2000:]
            assert "token authentication" in lines[0]
            assert time.monotonic() - start < 30


def test_joining_ray_keeps_the_cli_sigterm_handler(monkeypatch):
    """ray.init installs its own SIGTERM handler (sys.exit(15)): a SIGTERM then ended a Ray
    sweep or serve with no "aborted" and none of the CLI's clean-up (seen: status -15)."""
    import types

    from rdu_cluster.backends import join_ray

    def init(**kwargs):  # as ray.init does
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(init=init))

    def cli(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, cli)
    try:
        join_ray("local", num_cpus=1)
        assert signal.getsignal(signal.SIGTERM) is cli
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_while_ray_starts_is_ctrl_c_and_stops_it(monkeypatch):
    """Ray's own handler, still in place while ray.init runs, raised SystemExit(15): the run
    ended with status 15 and nothing said. It is Ctrl-C's KeyboardInterrupt, and what ray.init
    had started is shut down."""
    import types

    from rdu_cluster.backends import join_ray

    calls = []

    def init(**kwargs):
        sys.exit(signal.SIGTERM)

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(
        init=init, shutdown=lambda: calls.append("shutdown")))
    with pytest.raises(KeyboardInterrupt):
        join_ray("local")
    assert calls == ["shutdown"]
