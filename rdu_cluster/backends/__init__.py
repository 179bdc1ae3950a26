"""Backends hold the sockets: `local` as plain objects, `ray` as one Ray actor per socket.

Both answer the same calls with the same values, bit for bit:
- start(setups): create the sockets ({index: SocketSetup});
- run(seq, ops, spans, loads, sockets): one command to each socket of a replica; `loads` maps a
  socket to its per-step expert loads (None: all 1). Returns {socket: (rows, moves, occupancy)};
  `occupancy` is a mapping tier -> bytes that may be filled in only by the next `sync()`;
- sync(): wait for every reply still owed (the run's time includes it);
- reprogram(index, setup): a socket gets a new program (a plan routed around a failure);
- set_fault(index, degradation, comm_degradation, failed); close().
A backend's `run_sockets` (None: its own) is the sockets of the whole run where several
backends hold them (a disaggregated run: one a pool), for a backend that shares out a machine.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from chip.cost_tables import CommTime, Spans
from chip.program import Program
from chip.spec import ChipSpec
from workloads.errors import ConfigError

BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class SocketSetup:
    chip: ChipSpec
    program: Program
    comm_time: CommTime
    node: int = 0
    weights: tuple = ()  # region ops that load the weights at start: ["alloc", ...]
    kv_scale: float = 1.0  # the socket's KV bytes per byte of the replica's KV ops (Socket)


class Backend(Protocol):
    """The calls every backend answers (above): local.LocalBackend, ray_backend.RayBackend."""

    run_sockets: int | None

    def start(self, setups: dict[int, SocketSetup]) -> None: ...

    def run(self, seq: int, ops: list, spans: Spans, loads: dict | None, sockets) -> dict: ...

    def sync(self) -> None: ...

    def reprogram(self, index: int, setup: SocketSetup) -> None: ...

    def set_fault(self, index: int, degradation: float, comm: float, failed: bool) -> None: ...

    def close(self) -> None: ...


def probe_address(address: str | None, timeout_s: float = 2.0, named: str | None = None) -> None:
    """Fail fast on an explicit `host:port` (or `ray://host:port`) address that nothing listens
    on: ray.init would wait for its connect timeout (over a minute) first. 'auto', 'local' and
    None are left to Ray. One TCP connect, closed at once."""
    import socket

    if not address or address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return  # not host:port: Ray reports what it makes of it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ConfigError(f"{named or f'--address {address}'}: no Ray cluster reachable there "
                          f"({reason})") from None


AUTH_HINT = ("the Ray cluster requires token authentication and this process has no valid "
             "token: set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token) to the "
             "cluster's token (`ray get-auth-token` on its head) and RAY_AUTH_MODE=token")


@contextlib.contextmanager
def _own_sigterm() -> Iterator[None]:
    """ray.init sets a SIGTERM handler of its own (the driver's sys.exit(15), an embedded
    head's shutdown): a SIGTERM then ended a Ray run with no "aborted" and none of the CLI's
    clean-up. The handler that was there (the CLI's: as Ctrl-C) is put back; the backend's
    close stops the embedded instance on the way out."""
    held = signal.getsignal(signal.SIGTERM)
    try:
        yield
    except SystemExit:  # raised by Ray's handler, a SIGTERM while ray.init ran: as Ctrl-C
        raise KeyboardInterrupt from None
    finally:
        if held is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, held)


def join_ray(address: str | None, from_env: bool = False, **init_kwargs) -> None:
    """ray.init(address) for both Ray backends, every failure one ConfigError naming what to
    fix: nothing listening (probe_address), a cluster that needs Ray's auth token (Ray >= 2.52,
    RAY_AUTH_MODE=token; checked before ray.init, which would otherwise retry for ~10 s and end
    in a bare ConnectionError), or whatever else Ray reports. An address from $RAY_ADDRESS
    (`from_env`: no --address given) is named as RAY_ADDRESS=..., not as an option."""
    import ray

    named = f"RAY_ADDRESS={address}" if from_env else f"--address {address}"
    probe_address(address, named=named)
    _check_token(address, named)
    try:
        with _own_sigterm():
            ray.init(address=address, **init_kwargs)
    except KeyboardInterrupt:
        ray.shutdown()  # stop what it started, rather than leave it to the interpreter's exit
        raise
    except Exception as e:
        if type(e).__name__ == "AuthenticationError":  # ray.exceptions (Ray >= 2.52)
            raise ConfigError(f"{named}: {AUTH_HINT}") from None
        if not isinstance(e, (ConnectionError, ValueError, RuntimeError)):
            raise
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{named}: cannot join Ray ({reason})") from None


def _check_token(address: str | None, named: str) -> None:
    """Ask the cluster's GCS once, quietly, whether it accepts this process: Ray's client
    raises AuthenticationError at once where ray.init would retry. Skipped where Ray has no
    token authentication or the address is not a cluster's (None, "local")."""
    if address in (None, "local"):
        return
    try:
        from ray._private.authentication.authentication_token_setup import (
            ensure_token_if_auth_enabled,
        )
        from ray._private.services import canonicalize_bootstrap_address
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # not in its .pyi
        from ray.exceptions import AuthenticationError
    except ImportError:  # a Ray without token authentication: nothing to check
        return
    try:  # RAY_AUTH_MODE=token without a token: Ray's C++ client would abort the process
        ensure_token_if_auth_enabled(create_token_if_missing=False)
    except AuthenticationError:
        raise ConfigError(f"{named}: {AUTH_HINT}") from None
    try:
        target = canonicalize_bootstrap_address(address)
    except (ValueError, ConnectionError, OSError, RuntimeError):
        return  # ray.init reports a bad or missing address in its own words
    if target is None:
        return
    try:
        with _quiet_stderr():  # Ray's C++ client logs a warning line per failed attempt
            GcsClient(address=target)
    except AuthenticationError:
        raise ConfigError(f"{named}: {AUTH_HINT}") from None
    except (ConnectionError, OSError, RuntimeError, ValueError):
        return  # anything else: ray.init says it


class _quiet_stderr:
    """Send file descriptor 2 to /dev/null for a moment (C++ logging bypasses sys.stderr)."""

    def __enter__(self):
        import os
        import sys

        sys.stderr.flush()
        self.saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)

    def __exit__(self, *exc):
        import os

        os.dup2(self.saved, 2)
        os.close(self.saved)


def make(name: str, **kwargs):
    if name == "local":
        from rdu_cluster.backends.local import LocalBackend

        return LocalBackend()
    if name == "ray":
        from rdu_cluster.backends.ray_backend import RayBackend

        return RayBackend(**kwargs)
    raise ConfigError(f"--backend: unknown {name!r}; accepted: {', '.join(BACKENDS)}")
