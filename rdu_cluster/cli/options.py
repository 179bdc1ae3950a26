"""Options several commands share. `hardware_options` gives a command `--set KEY=VALUE`
(repeatable) and `--sockets N`, and hands it one `overrides` dict for `load_cluster`: the same
dotted paths and checks as a sweep's override fields (rdu_cluster.config). `calibration_option`
gives it `--calibration PROFILE|none` (rdu_cluster/validation/calibration.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from rdu_cluster.config import cli_overrides
from rdu_cluster.validation import calibration

SET_HELP = (
    "Override one figure of the cluster or its chip, e.g. "
    "chip.tiers.hbm.bandwidth_bytes_per_s=3.6e12, chip.peak_flops.bf16=1.2e15, "
    "topology.link_latency_s=2e-6, cost.socket_hour_usd=3; any field the TOML format accepts, "
    "optional ones included. Repeatable."
)
SOCKETS_HELP = (
    "Scale the cluster to N sockets: fewer than a node shrinks the node; more adds whole nodes "
    "joined through the inter-node fabric (topology.inter_node_*)."
)


def hardware_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add --set and --sockets to a click command; it receives `overrides` (a dict) instead and
    passes it to `load_cluster(ref, overrides)`. Apply it under `@click.command()`, like an
    option:

        @click.command()
        @click.option("--cluster", ...)
        @hardware_options
        def capacity(cluster, ..., overrides): ...
    """

    @click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
    @click.option("--sockets", "sockets", default=None, type=click.IntRange(min=1),
                  metavar="N", help=SOCKETS_HELP)
    @functools.wraps(command)
    def wrapper(*args: Any, assignments: tuple[str, ...], sockets: int | None,
                **kwargs: Any) -> Any:
        return command(*args, overrides=cli_overrides(assignments, sockets), **kwargs)

    return wrapper


def _activate(ctx: click.Context, param: click.Parameter, value: str) -> str:
    calibration.activate(calibration.load(value))
    return value


def calibration_options(default: str = calibration.DEFAULT):
    """--calibration: the profile `load_cluster` applies for the rest of the command."""
    return click.option(
        "--calibration",
        default=default,
        show_default=True,
        expose_value=False,
        is_eager=True,
        callback=_activate,
        help="Calibration profile (cluster_configs/calibration/NAME.toml or a path) applied to the "
        "chips' fitted parameters, or 'none' for first-principles values only.",
    )


calibration_option = calibration_options()
