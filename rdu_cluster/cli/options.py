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


def _stack(*options: Callable[[Callable[..., Any]], Callable[..., Any]]):
    def apply(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


TRACE_HELP = (
    "Trace file (.csv, .parquet, .arrow): arrival_s, prompt_len, output_len[, model]; the Azure "
    "LLM inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens); a Mooncake .jsonl "
    "(timestamp ms, input_length, output_length, hash_ids)."
)

# The multi-turn workload (workloads/sessions.py), as serve and capacity take it.
session_options = _stack(
    click.option("--sessions", "n_sessions", default=None, type=int,
                 help="Multi-turn workload: N sessions (closed loop per session; --prompt-len is "
                 "each turn's user message, --output-len its answer)."),
    click.option("--turns", default=None, type=int, help="With --sessions: turns per session."),
    click.option("--system-prompt", default=1024, show_default=True, type=int,
                 help="With --sessions: tokens of the system prompt every session shares."),
    click.option("--think-time", default="5", show_default=True,
                 help="With --sessions: seconds between a turn's end and the next turn: S, "
                 "exponential:MEAN or uniform:LO:HI."),
)


def speculative_options(placements: tuple[str, ...]):
    """--draft/--spec-k/--tree/--acceptance/--draft-placement/--draft-sockets (speculative
    decoding, parsed by cli/workload.py's `speculation`)."""
    return _stack(
        click.option("--draft", default=None,
                     help="Speculative decoding: draft model (catalog name or config.json)."),
        click.option("--spec-k", default=None, type=int,
                     help="With --draft: draft tokens a step (tree: its depth) [default: the "
                     "fastest in 1..16]."),
        click.option("--tree", default=None,
                     help="With --draft: tree speculation, candidates kept per depth (4,2,1)."),
        click.option("--draft-placement", "--placement", "placement", default="shared",
                     show_default=True, type=click.Choice(placements),
                     help="With --draft: on the target's sockets, or on --draft-sockets of its "
                     "own."),
        click.option("--draft-sockets", default=1, show_default=True, type=int,
                     help="With --draft-placement separate: the draft's sockets in each "
                     "replica."),
        click.option("--acceptance", default=None,
                     help="With --draft: a rate (0.8), per-position conditional rates "
                     "(0.9,0.8,0.7) or beta:MEAN[:CONCENTRATION[:SEED]] [default: the pair's "
                     "published basis]."),
    )
