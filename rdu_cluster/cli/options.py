"""Options several commands share. `hardware_options` gives a command `--set KEY=VALUE`
(repeatable) and `--sockets N`, and hands it one `overrides` dict for `load_cluster`: the same
dotted paths and checks as a sweep's override fields (rdu_cluster.config). `calibration_option`
gives it `--calibration PROFILE|none` (rdu_cluster/validation/calibration.py).

Typed command-line values, checked by click before a command runs: integers within a stated
bound and finite floats. A bad value is click's one-line usage error naming the option, the value
and the accepted range (exit 2)."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable
from typing import Any, cast

import click

from chip import serving_stacks
from rdu_cluster.config import MAX_SOCKETS, cli_overrides
from rdu_cluster.validation import calibration
from workloads import sessions
from workloads.checks import MAX_BATCH, show
from workloads.errors import ConfigError
from workloads.speculative import MAX_SPEC_K
from workloads.traces import MAX_LENGTH, MAX_REQUESTS

# Bounds (each stated in the error click prints). CoE deployments publish 150 experts
# ([MICRO24]); 2^16 leaves room for "thousands" while keeping per-expert tables small.
MAX_EXPERTS = 2**16
MAX_SEED = 2**63 - 1

SEED = click.IntRange(0, MAX_SEED)
LENGTH = click.IntRange(1, MAX_LENGTH)
BATCH = click.IntRange(1, MAX_BATCH)
REQUESTS = click.IntRange(1, MAX_REQUESTS)
EXPERTS = click.IntRange(1, MAX_EXPERTS)
SOCKETS = click.IntRange(1, MAX_SOCKETS)
SPEC_K = click.IntRange(1, MAX_SPEC_K)
TOKENS = click.IntRange(1, MAX_BATCH * 64)  # a token budget: a batch of 64-token chunks
TOP = click.IntRange(0, 10**6)
# Closed-loop clients: capacity sends 2 requests per user by default, so half the requests bound.
MAX_CONCURRENCY = MAX_REQUESTS // 2


def given(ctx: click.Context, *names: str) -> list[str]:
    """The flags of the parameters `names` given on the command line (not left at their
    defaults): an option that would have no effect is refused only when the user asked for it."""
    flags = {p.name: p.opts[0] for p in ctx.command.params}
    return [flags[n] for n in names
            if ctx.get_parameter_source(n) != click.core.ParameterSource.DEFAULT]


def check_not_inputs(path: str | None, what: str, inputs: Iterable[tuple[str, str | None]],
                     why: str = " (it would be overwritten); give another file name") -> None:
    """Refuse an output `path` that is one of the command's input files ((flag, path) pairs; a
    catalog name that names no file is skipped): writing it would replace the input."""
    if path is None or not os.path.exists(path):
        return
    for flag, ref in inputs:
        if ref is not None and os.path.isfile(ref) and os.path.samefile(path, ref):
            raise ConfigError(f"{what} {show(path)}: is the {flag} file{why}")


class Finite(click.ParamType):
    """A float in [lo, hi] ((lo, hi] with lo_open); NaN never, infinity only with allow_inf."""

    name = "number"

    def __init__(self, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
                 allow_inf: bool = False):
        self.lo, self.hi, self.lo_open, self.allow_inf = lo, hi, lo_open, allow_inf

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            x = value
        else:
            try:
                x = float(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r} is not a number", param, ctx)
        inf_ok = self.allow_inf and x == math.inf
        low = self.lo is None or x > self.lo or (x == self.lo and not self.lo_open)
        if not inf_ok and not (math.isfinite(x) and low and (self.hi is None or x <= self.hi)):
            self.fail(f"{value!r}: expected {self._accepted()}", param, ctx)
        return x

    def _accepted(self) -> str:
        """The range in words; no interval closed at inf (a finite number never reaches it)."""
        extra = " or inf" if self.allow_inf else ""
        if self.hi is not None:
            lo = "-inf" if self.lo is None else f"{self.lo:g}"
            return f"a finite number in {'(' if self.lo_open else '['}{lo}, {self.hi:g}]{extra}"
        if self.lo is None:
            return f"a finite number{extra}"
        if self.lo == 0:
            return f"a {'positive' if self.lo_open else 'non-negative'} finite number{extra}"
        return f"a finite number {'>' if self.lo_open else '>='} {self.lo:g}{extra}"


POSITIVE = Finite(0.0, lo_open=True)
FRACTION = Finite(0.0, 1.0, lo_open=True)


SET_HELP = (
    "Override one figure of the cluster or its chip, e.g. "
    "chip.tiers.hbm.bandwidth_bytes_per_s=3.6e12, chip.peak_flops.bf16=1.2e15, "
    "topology.link_latency_s=2e-6, cost.socket_hour_usd=3; any field the TOML format accepts, "
    "optional ones included. Repeatable; a KEY given twice takes the later value."
)
SOCKETS_HELP = (
    "Scale the cluster to N sockets: fewer than a node shrinks the node; more adds whole nodes "
    "joined through the inter-node fabric (topology.inter_node_*)."
)


class SpreadValues(click.Command):
    """A command whose options in `spread` take several values as vLLM's argparse options of
    nargs="+" do: `--goodput ttft:500 tpot:50` as `vllm bench serve` takes it (click's option
    takes one value: the second was an "unexpected extra argument"). The words after such an
    option's value, up to the next option, are more values of it; the command itself takes no
    argument, so no word of its own is taken."""

    spread: tuple[str, ...] = ("--goodput",)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, spread_values(args, self.spread))


def spread_values(args: list[str], names: tuple[str, ...]) -> list[str]:
    """`args` with each word after a value of an option in `names` (up to the next word that
    starts with "-", or "--") given that option again: ["--goodput", "ttft:500", "tpot:50"] ->
    ["--goodput", "ttft:500", "--goodput", "tpot:50"]."""
    out: list[str] = []
    name, state = None, 0  # the option being spread; 1: its value next, 2: its values given
    for i, a in enumerate(args):
        if a == "--":
            return out + args[i:]
        if state == 2 and not a.startswith("-"):
            out += [cast(str, name), a]
            continue
        if state == 1:
            out.append(a)
            state = 2
            continue
        out.append(a)
        key = a.split("=", 1)[0]
        name, state = (key, 2 if "=" in a else 1) if key in names else (None, 0)
    return out


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
    @click.option("--sockets", "sockets", default=None, type=click.IntRange(1, MAX_SOCKETS),
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
    "LLM inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens); a BurstGPT CSV (Timestamp "
    "s, Request tokens, Response tokens: failed requests left out, its Model not read); a "
    "Mooncake .jsonl (timestamp ms, input_length, output_length, hash_ids)."
)

# The dtypes a model is costed at (workloads.spec.with_dtypes), as simulate, serve and
# sensitivity take them.
dtype_options = _stack(
    click.option("--weights", "weights_dtype", default=None,
                 help="Weight dtype (bf16, fp8, int4, mxfp4) [default: the model's]."),
    click.option("--kv-dtype", default=None, help="KV-cache dtype [default: the model's]."),
)

# A GPU cluster's serving stack, as plan, serve and sensitivity take it (simulate's, for
# several clusters, and capacity's, repeatable, say more).
stack_option = click.option(
    "--stack", "stack_name", default=None,
    help=f"GPU clusters: the serving stack ({', '.join(serving_stacks.STACKS)}) [default: "
         f"{serving_stacks.DEFAULT_STACK}]; an RDU cluster takes none.")

# The multi-turn workload (workloads/sessions.py), as serve and capacity take it.
session_options = _stack(
    click.option("--sessions", "n_sessions", default=None, type=REQUESTS,
                 help="Multi-turn workload: N sessions (closed loop per session; --prompt-len is "
                 "each turn's user message, --output-len its answer)."),
    click.option("--turns", default=None, type=click.IntRange(1, 10**4), help="With --sessions: turns per session."),
    click.option("--system-prompt", default=sessions.SYSTEM_TOKENS, show_default=True,
                 type=click.IntRange(0, MAX_LENGTH),
                 help="With --sessions: tokens of the system prompt every session shares."),
    click.option("--think-time", default=sessions.THINK_TIME, show_default=True,
                 help="With --sessions: seconds between a turn's end and the next turn: S, "
                 "exponential:MEAN or uniform:LO:HI."),
)


def speculative_options(placements: tuple[str, ...]):
    """--draft/--spec-k/--tree/--acceptance/--draft-placement/--draft-sockets (speculative
    decoding, parsed by cli/workload.py's `speculation`)."""
    return _stack(
        click.option("--draft", default=None,
                     help="Speculative decoding: draft model (catalog name or config.json)."),
        click.option("--spec-k", default=None, type=SPEC_K,
                     help="With --draft: draft tokens a step (tree: its depth) [default: the "
                     "fastest in 1..16]."),
        click.option("--tree", default=None,
                     help="With --draft: tree speculation, candidates kept per depth (4,2,1)."),
        click.option("--draft-placement", "--placement", "placement", default="shared",
                     show_default=True, type=click.Choice(placements),
                     help="With --draft: on the target's sockets, or on --draft-sockets of its "
                     "own."),
        click.option("--draft-sockets", default=1, show_default=True, type=SOCKETS,
                     help="With --draft-placement separate: the draft's sockets in each "
                     "replica."),
        click.option("--acceptance", default=None,
                     help="With --draft: a rate (0.8), per-position conditional rates "
                     "(0.9,0.8,0.7) or beta:MEAN[:CONCENTRATION[:SEED]] [default: the pair's "
                     "published basis]."),
    )
