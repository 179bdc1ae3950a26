"""Load chip and cluster TOML files into specs, checking exact key sets and value ranges.

A name is looked up among the bundled files of `cluster_configs`; anything with a path
separator or a .toml suffix is read as a path. A file may `extends = "other"` (a name or a path
relative to it) and then holds only what differs: tables merge, values replace.

Overrides (sweep fields and `--set KEY=VALUE` alike) are dotted paths into the cluster file:
`chip.<path>` into its chip, `topology.<path>`, `cost.<path>`, `sockets`, `sockets_per_node`.
They may set any field the file format accepts, optional ones included; the loader's own checks
then judge them. Every problem is a ConfigError whose message names the file and the dotted field.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cluster_configs
from chip import execution
from chip.power import parse_power
from chip.spec import ChipSpec, TierSpec
from interconnect.topology import TopologySpec, check_node
from partitioning.cluster import ClusterSpec
from rdu_cluster.scenarios.economics import parse_cost
from workloads import checks
from workloads.dtypes import DType
from workloads.errors import ConfigError
from workloads.files import read_toml

CHIP_KEYS = {"name", "kind", "description", "source", "execution_model", "peak_flops", "tiers"}
CHIP_OPTIONAL = {"execution", "power"}
TIER_KEYS = {"capacity_bytes", "bandwidth_bytes_per_s", "source"}
TIER_NAMES = {"rdu": ("sram", "hbm", "ddr"), "gpu": ("hbm", "host")}
CLUSTER_KEYS = {"name", "description", "chip", "sockets", "sockets_per_node", "source", "topology"}
CLUSTER_OPTIONAL = {"chip_overrides", "cost"}
# The override paths a sweep point or --set may give: these names, or a path under these tables.
OVERRIDE_SCALARS = ("sockets", "sockets_per_node")
OVERRIDE_PREFIXES = ("chip.", "topology.", "cost.")


def is_override(key: str) -> bool:
    return key in OVERRIDE_SCALARS or (key.startswith(OVERRIDE_PREFIXES) and not key.endswith("."))


def check_override(key: str, where: str = "--set") -> None:
    if not is_override(key):
        accepted = ", ".join([f"{p}<field>" for p in OVERRIDE_PREFIXES] + list(OVERRIDE_SCALARS))
        raise ConfigError(f"{where}: unknown key {key!r}; accepted: {accepted}")


def parse_assignment(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` of --set: the value as TOML reads it (3.6e12, 16, true, [4, 4]), a bare word
    as a string (switch)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. "
                          "chip.tiers.hbm.bandwidth_bytes_per_s=3.6e12")
    check_override(key, f"--set {text}")
    try:
        return key, tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return key, value.strip()


def cli_overrides(assignments: tuple[str, ...], sockets: int | None = None) -> dict[str, Any]:
    """The overrides of repeated --set KEY=VALUE (a later one wins) and --sockets N."""
    out = dict(parse_assignment(a) for a in assignments)
    if sockets is not None:
        if out.get("sockets", sockets) != sockets:
            raise ConfigError(f"--sockets {sockets} and --set sockets={out['sockets']}: give one")
        out["sockets"] = sockets
    return out


# A cluster larger than any that serves one model: Llama 3.1 405B was trained on 16,384 H100s
# (the largest published run of one model), and the SN40L and H100 serving deployments are some
# thousands of sockets. `plan` of 405B on 16,384 H100s takes ~20 s and 0.8 GB on 2 cores, on
# 65,536 a minute and 3 GB. Stated in the message.
MAX_SOCKETS = 16384


# Plausibility ranges of a socket's figures. A finite figure past them is no machine (a peak of
# 1e308 FLOP/s simulated as fast as anything) and is refused, naming the range and its basis. The
# upper bounds sit about ten times above the largest published single-chip figures, so a
# what-if a generation or two ahead still runs; the lower ones are checks.MIN_RATE and > 0.
PLAUSIBLE = {
    "peak_flops": (checks.MIN_RATE, 1e18, ("FLOP/s; the largest chip, Cerebras WSE-3 (a whole "
                   "wafer), peaks at 1.25e17 FP16 with sparsity (Cerebras, March 2024)")),
    "bandwidth_bytes_per_s": (checks.MIN_RATE, 2e17, ("bytes/s; WSE-3's on-wafer SRAM gives "
                              "2.1e16, HBM3e parts 8e12 (B200)")),
    "capacity_bytes": (1.0, 1e16, ("bytes; the largest memory behind one chip, a CS-3's MemoryX "
                       "weight store, is 1.2e15; the largest HBM, 2.9e11 (B300)")),
}


def plausible(value: float, key: str, where: str) -> float:
    """`value` of a chip figure `key` (PLAUSIBLE) within its plausible range."""
    lo, hi, basis = PLAUSIBLE[key]
    if not lo <= value <= hi:
        raise ConfigError(f"{where}: {checks.show(value)} is outside the plausible range "
                          f"{lo:g} to {hi:g} {basis}")
    return value


def load_chip(name_or_path: str | Path, overrides: Mapping[str, Any] | None = None) -> ChipSpec:
    path = _resolve("chips", name_or_path)
    raw = _apply_overrides(_read_extended("chips", path), overrides or {}, path.name)
    chip = dataclasses.replace(parse_chip(raw, path.name), family=_family(path))
    return _calibrated(chip, overrides or {}, path.name)


def load_cluster(
    name_or_path: str | Path, overrides: Mapping[str, Any] | None = None
) -> ClusterSpec:
    """Load a cluster. `overrides` maps dotted paths to values, e.g.
    {"chip.tiers.hbm.bandwidth_bytes_per_s": 1.6e12, "topology.link_latency_s": 2e-6}."""
    path = _resolve("clusters", name_or_path)
    where = path.name
    overrides = dict(overrides or {})
    for key in overrides:
        check_override(key, f"{where}: override")
    raw = _read_extended("clusters", path)
    chip_over = {k[5:]: v for k, v in overrides.items() if k.startswith("chip.")}
    rest = _scaled({k: v for k, v in overrides.items() if not k.startswith("chip.")}, raw)
    raw = _apply_overrides(raw, rest, where)
    _check_keys(raw, CLUSTER_KEYS, CLUSTER_OPTIONAL, where)
    chip_ref = _typed(raw, "chip", str, where)
    chip_path = _resolve("chips", chip_ref, relative_to=path.parent)
    chip_raw = _merge(_read_extended("chips", chip_path), _table(raw, "chip_overrides", where, {}))
    chip = parse_chip(_apply_overrides(chip_raw, chip_over, chip_path.name), chip_path.name)
    chip = dataclasses.replace(chip, family=_family(chip_path))
    sockets = checks.integer(raw.get("sockets"), f"{where}: sockets", 1, MAX_SOCKETS)
    per_node = checks.integer(raw.get("sockets_per_node"), f"{where}: sockets_per_node", 1,
                              MAX_SOCKETS)
    if sockets % per_node:
        raise ConfigError(f"{where}: sockets ({sockets}) must be a multiple of sockets_per_node "
                          f"({per_node})")
    topology = TopologySpec.from_dict(_table(raw, "topology", where), f"{where}: topology")
    check_node(topology, per_node, f"{where}: topology")
    shape = topology.torus_shape
    if topology.kind == "torus2d" and math.prod(shape) != per_node:
        raise ConfigError(f"{where}: topology.torus_shape: {list(shape)} holds "
                          f"{math.prod(shape)} sockets; a node has {per_node}")
    if sockets > per_node and topology.inter_node_bandwidth_bytes_per_s <= 0:
        raise ConfigError(
            f"{where}: topology.inter_node_bandwidth_bytes_per_s: {sockets // per_node} nodes of "
            f"{per_node} sockets need the inter-node fabric's figure (none given; e.g. --set "
            "topology.inter_node_bandwidth_bytes_per_s=50e9)")
    return ClusterSpec(
        name=_name(raw, where),
        chip=_calibrated(chip, {**chip_over, **_dotted(raw.get("chip_overrides", {}))},
                         chip_path.name),
        sockets=sockets,
        sockets_per_node=per_node,
        topology=topology,
        description=_typed(raw, "description", str, where),
        source=checks.source(raw, where),
        cost=parse_cost(_table(raw, "cost", where, {}), f"{where}: cost"),
    )


def _calibrated(chip: ChipSpec, overrides: Mapping[str, Any], where: str) -> ChipSpec:
    """The active calibration profile's fitted values (rdu_cluster/validation/calibration.py);
    an [execution] value the user overrides explicitly keeps the user's value. The values a run
    uses are then checked against the chip (the prefetch buffer against its SRAM)."""
    from rdu_cluster.validation import calibration

    keep = {k.split(".", 1)[1] for k in overrides if k.startswith("execution.")}
    out = calibration.apply_chip(chip, keep=keep)
    execution.check_chip(out, f"{where}: execution")
    return out


def _dotted(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        if isinstance(v, Mapping):
            out.update(_dotted(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@dataclass(frozen=True)
class FabricSpec:
    """An inter-node fabric (cluster_configs/fabrics/): one port per socket into a non-blocking
    switch; bandwidth per port each way, latency of one NIC -> switch -> NIC traversal."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    description: str = ""
    source: str = ""


DEFAULT_FABRIC = "ib-ndr"  # the fabric between nodes unless a run names one (fabrics/ib-ndr.toml)


def load_fabric(name_or_path: str | Path) -> FabricSpec:
    path = _resolve("fabrics", name_or_path)
    where = path.name
    raw = _read(path)
    _check_keys(raw, {"name", "bandwidth_bytes_per_s", "latency_s", "source"}, {"description"},
                where)
    checks.source(raw, where)
    latency = checks.latency(raw, "latency_s", where)
    return FabricSpec(_typed(raw, "name", str, where), checks.rate(raw, "bandwidth_bytes_per_s",
                      where), latency, str(raw.get("description", "")), str(raw["source"]))


def parse_chip(raw: Mapping[str, Any], where: str) -> ChipSpec:
    _check_keys(raw, CHIP_KEYS, CHIP_OPTIONAL, where)
    kind = _typed(raw, "kind", str, where)
    if kind not in TIER_NAMES:
        raise ConfigError(f"{where}: kind: {kind!r} unknown; accepted: rdu, gpu")
    peak = _table(raw, "peak_flops", where)
    if "bf16" not in peak:
        raise ConfigError(f"{where}: peak_flops.bf16: missing field")
    for dtype in peak:
        # ChipSpec.flops reads a peak by the dtype's own name: another spelling (BF16) would be
        # a second entry that nothing reads, so it is refused rather than silently ignored.
        canonical = DType.parse(dtype, f"{where}: peak_flops").value
        if dtype != canonical:
            raise ConfigError(f"{where}: peak_flops.{dtype}: write the dtype as {canonical!r} "
                              "(lower case)")
        plausible(checks.rate(peak, dtype, f"{where}: peak_flops"), "peak_flops",
                  f"{where}: peak_flops.{dtype}")
    tiers = _parse_tiers(_table(raw, "tiers", where), TIER_NAMES[kind], where)
    model = _typed(raw, "execution_model", str, where)
    table = _table(raw, "execution", where, {})
    execution.check_params(model, table, f"{where}: execution")
    return ChipSpec(
        name=_name(raw, where),
        kind=kind,
        peak_flops={k: float(v) for k, v in peak.items()},
        tiers=tiers,
        execution_model=model,
        execution=dict(table),
        power=parse_power(_table(raw, "power", where, {}), f"{where}: power"),
        description=_typed(raw, "description", str, where),
        source=checks.source(raw, where),
    )


def _parse_tiers(table: Mapping[str, Any], names: tuple[str, ...], where: str) -> tuple:
    if set(table) != set(names):
        raise ConfigError(f"{where}: tiers: expected exactly {', '.join(names)}")
    tiers = []
    for name in names:
        t = _table(table, name, f"{where}: tiers")
        w = f"{where}: tiers.{name}"
        _check_keys(t, TIER_KEYS, set(), w)
        tiers.append(
            TierSpec(
                name=name,
                capacity_bytes=plausible(_positive(t, "capacity_bytes", w), "capacity_bytes",
                                         f"{w}.capacity_bytes"),
                bandwidth_bytes_per_s=plausible(checks.rate(t, "bandwidth_bytes_per_s", w),
                                                "bandwidth_bytes_per_s",
                                                f"{w}.bandwidth_bytes_per_s"),
                source=checks.source(t, w),
            )
        )
    return tuple(tiers)


def _resolve(kind: str, ref: str | Path, relative_to: Path | None = None) -> Path:
    text = str(ref)
    if text.endswith(".toml") or "/" in text:
        path = Path(text)
        if not path.is_absolute() and relative_to is not None and not path.exists():
            path = relative_to / path
        if not path.is_file():
            raise ConfigError(f"{kind[:-1]} file {text}: not found")
        return path
    found = cluster_configs.bundled(kind)
    if text not in found:
        raise ConfigError(
            f"unknown {kind[:-1]} {text!r}; bundled: {', '.join(found)} (or a path to a .toml)"
        )
    return found[text]


def _scaled(overrides: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """A `sockets` override below one node shrinks the node to it (a part of a system); above,
    the cluster grows by whole nodes joined through the inter-node fabric."""
    sockets, per_node = overrides.get("sockets"), raw.get("sockets_per_node")
    if ("sockets_per_node" not in overrides and isinstance(sockets, int)
            and isinstance(per_node, int) and 0 < sockets < per_node):
        return overrides | {"sockets_per_node": sockets}
    return overrides


# The longest `extends` chain: the bundled files use one level, a hand-made variant family a few;
# 32 leaves room for any of them and keeps the recursion far from Python's stack limit.
MAX_EXTENDS = 32


def _read_extended(kind: str, path: Path) -> dict[str, Any]:
    """A chip or cluster file with its `extends` chain merged in (the file's own values win)."""
    return _extended(kind, path)[0]


def cluster_files(ref: str | Path) -> list[Path]:
    """The files load_cluster(ref) reads: the cluster's, its `extends` chain, its chip's and
    that one's chain (what must not change under a resumed sweep)."""
    path = _resolve("clusters", ref)
    raw, chain = _extended("clusters", path)
    chip_ref = raw.get("chip")
    if not isinstance(chip_ref, str):  # load_cluster names what is wrong
        return chain
    return chain + _extended("chips", _resolve("chips", chip_ref, relative_to=path.parent))[1]


def _extended(kind: str, path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict, list[Path]]:
    """_read_extended's values, and the files they came from (the file's own first)."""
    if len(seen) >= MAX_EXTENDS:
        raise ConfigError(f"{seen[0].name}: extends: a chain of more than {MAX_EXTENDS} files "
                          f"(reaching {path.name}); at most {MAX_EXTENDS} accepted")
    raw = _read(path)
    parent = raw.pop("extends", None)
    if parent is None:
        return raw, [path]
    if not isinstance(parent, str):
        raise ConfigError(f"{path.name}: extends: expected a {kind[:-1]} name or path, "
                          f"got {parent!r}")
    parent_path = _resolve(kind, parent, relative_to=path.parent)
    chain = (*seen, path.resolve())
    if parent_path.resolve() in chain:
        raise ConfigError(f"{path.name}: extends: {parent!r} leads back to {path.name} (a cycle)")
    base, files = _extended(kind, parent_path, chain)
    return _merge(base, raw), [path, *files]


def _family(path: Path) -> tuple[tuple[str, frozenset[str]], ...]:
    """A chip file's family for calibration: its name and each `extends` ancestor's, nearest
    first, with the [execution] keys each file sets itself."""
    out = []
    for f in _extended("chips", path)[1]:
        raw = _read(f)
        execution = raw.get("execution", {})
        out.append((str(raw.get("name", f.stem)),
                    frozenset(execution) if isinstance(execution, dict) else frozenset()))
    return tuple(out)


def _read(path: Path) -> dict[str, Any]:
    raw = read_toml(path)
    return raw


def _apply_overrides(raw: dict, overrides: Mapping[str, Any], where: str) -> dict:
    """Set each dotted path, creating the tables and fields the file leaves out; what the file
    format does not accept is reported by its parser, naming the accepted fields."""
    out = copy.deepcopy(raw)
    for dotted, value in overrides.items():
        node = out
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{where}: override {dotted}: {key!r} is a value, not a table")
        node[leaf] = value
    return out


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict:
    """`base` with `extra` laid over it: tables merge key by key, anything else replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _check_keys(raw: Mapping[str, Any], required: set, optional: set, where: str) -> None:
    checks.exact_keys(raw, required, where, optional)


def _table(raw: Mapping[str, Any], key: str, where: str, default: Any = None) -> Mapping[str, Any]:
    value = raw.get(key, default)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {key}: expected a table, got {value!r:.60}")
    return value


def _name(raw: Mapping[str, Any], where: str) -> str:
    """A chip's or cluster's name: one line of text (it heads tables and keys results)."""
    name = _typed(raw, "name", str, where)
    if not name.strip() or not name.isprintable():
        raise ConfigError(f"{where}: name: expected a non-empty name on one line, got "
                          f"{checks.show(name)}")
    return name


def _typed(raw: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = raw.get(key)
    if not isinstance(value, kind):
        raise ConfigError(f"{where}: {key}: expected a {kind.__name__}, got {value!r}")
    return value


def _positive(raw: Mapping[str, Any], key: str, where: str) -> float:
    return checks.positive(raw, key, where)
