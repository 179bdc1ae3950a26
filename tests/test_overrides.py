"""One override mechanism: --set KEY=VALUE and --sockets on the commands, sweep override fields,
`extends` between chip and cluster files; optional fields may be set; errors are one line."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

import cluster_configs
from rdu_cluster.cli import main
from rdu_cluster.config import cli_overrides, load_chip, load_cluster, parse_assignment
from rdu_cluster.sweep.runners import cached_cluster, cluster_overrides
from rdu_cluster.validation import calibration
from workloads.errors import ConfigError


def one_line(fn, *args) -> str:
    with pytest.raises(ConfigError) as e:
        fn(*args)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("text, key, value", [
    ("chip.tiers.hbm.bandwidth_bytes_per_s=3.6e12", "chip.tiers.hbm.bandwidth_bytes_per_s",
     3.6e12),
    ("sockets = 32", "sockets", 32),
    ("topology.kind=switch", "topology.kind", "switch"),
    ("topology.torus_shape=[4, 4]", "topology.torus_shape", [4, 4]),
    ("cost.socket_hour_usd=2", "cost.socket_hour_usd", 2),
])
def test_assignments_typed_as_toml(text, key, value):
    assert parse_assignment(text) == (key, value)


@pytest.mark.parametrize("text, fragment", [
    ("chip.tiers.hbm", "expected KEY=VALUE"),
    ("=3", "expected KEY=VALUE"),
    ("foo=1", ("unknown key 'foo'; accepted: chip.<field>, topology.<field>, cost.<field>, "
               "sockets, sockets_per_node")),
    ("chip.=1", "unknown key 'chip.'"),
])
def test_bad_assignments(text, fragment):
    assert fragment in one_line(parse_assignment, text)


def test_later_set_wins_and_sockets_conflict():
    assert cli_overrides(("sockets=8", "sockets=4")) == {"sockets": 4}
    assert "give one" in one_line(cli_overrides, ("sockets=8",), 16)


def test_sweep_fields_and_set_build_the_same_cluster():
    fields = {"model": "llama-3.1-8b", "cluster": "sn40l-16", "batch": 4,
              "chip.tiers.hbm.bandwidth_bytes_per_s": 3.6e12, "topology.link_latency_s": 2e-6}
    via_sweep = cached_cluster("sn40l-16", cluster_overrides(fields), "none")
    via_set = load_cluster("sn40l-16", cli_overrides((
        "chip.tiers.hbm.bandwidth_bytes_per_s=3.6e12", "topology.link_latency_s=2e-6")))
    assert via_sweep == via_set and via_set.chip.hbm.bandwidth_bytes_per_s == 3.6e12


def test_override_sets_optional_fields_the_file_leaves_out(tmp_path):
    assert load_cluster("sn40l-16").topology.links_per_pair == 1
    c = load_cluster("sn40l-16", {"topology.links_per_pair": 2,
                                  "topology.inter_node_bandwidth_bytes_per_s": 25e9,
                                  "sockets": 32})
    assert c.topology.links_per_pair == 2 and (c.sockets, c.nodes) == (32, 2)
    chip = load_chip("sn40l", {"peak_flops.fp8": 1.2e15})
    assert chip.flops("fp8") == 1.2e15
    # A table the file lacks is created, and then checked whole.
    text = cluster_configs.bundled("chips")["h100-sxm"].read_text()
    (tmp_path / "bare.toml").write_text(text[: text.index("[power]")])
    assert load_chip(tmp_path / "bare.toml").power == {}
    msg = one_line(load_chip, tmp_path / "bare.toml", {"power.idle_w": 100})
    assert "bare.toml: power" in msg and "missing field" in msg


def test_override_errors_are_the_loaders():
    assert "links_per_pair: expected a positive integer" in one_line(
        load_cluster, "sn40l-16", {"topology.links_per_pair": 0})
    assert "unknown field; accepted: " in one_line(load_cluster, "sn40l-16", {"topology.foo": 1})
    assert "'name' is a value, not a table" in one_line(load_chip, "sn40l", {"name.x": 1})
    assert "unknown key 'options.fused'" in one_line(load_cluster, "sn40l-16",
                                                     {"options.fused": True})


@pytest.mark.parametrize("key", ["chip.power.peak_w", "chip.power.idle_w"])
def test_power_figures_are_bounded(key):
    # 1.7e308 W made joules_per_token infinite (invalid JSON) and serve fail internally.
    msg = one_line(load_cluster, "sn40l-8", {key: 1.7e308})
    assert f"{key[5:]}: expected a finite number in [0, 100000], got 1.7e+308" in msg
    assert load_cluster("sn40l-8", {"chip.power.peak_w": 1e5}).chip.power["peak_w"] == 1e5


def test_tile_array_counts_and_prefetch_fraction_are_checked():
    msg = one_line(load_cluster, "sn40l-8", {"chip.execution.pmus": 0.5})
    assert msg == ("sn40l.toml: execution.pmus: 0.5; accepted: a whole number of units, 1 to "
                   "1,048,576")
    msg = one_line(load_cluster, "sn40l-8", {"chip.execution.prefetch_fraction": 2})
    assert msg == ("sn40l.toml: execution.prefetch_fraction: expected a fraction in (0, 1], got "
                   "2.0")
    assert load_cluster("sn40l-8", {"chip.execution.pcus": 520}).chip.execution["pcus"] == 520
    # The prefetch is a share of the free SRAM, so any SRAM size runs with any fraction.
    small = {"chip.tiers.sram.capacity_bytes": 1e7}
    with calibration.use(calibration.load("default")):
        assert load_cluster("sn40l-8", small).chip.tier("sram").capacity_bytes == 1e7


def test_peak_flops_dtype_keys_are_spelled_as_read():
    # BF16 was accepted beside bf16 and never read (ChipSpec.flops looks up "bf16").
    msg = one_line(load_cluster, "dgx-h100", {"chip.peak_flops.BF16": 1e13})
    assert msg == "h100-sxm.toml: peak_flops.BF16: write the dtype as 'bf16' (lower case)"
    assert "unknown dtype 'bf17'" in one_line(load_chip, "sn40l", {"peak_flops.bf17": 1e13})


def test_links_per_pair_only_on_a_full_mesh():
    msg = one_line(load_cluster, "dgx-h100", {"topology.links_per_pair": 4})
    assert msg == ("dgx-h100.toml: topology.links_per_pair: only a full_mesh has parallel "
                   "links; kind is 'switch'")
    assert "kind is 'ring'" in one_line(load_cluster, "sn40l-16",
                                        {"topology.kind": "ring", "topology.links_per_pair": 2})


def test_sockets_scale_by_whole_nodes_or_shrink_one():
    grown = load_cluster("dgx-h100", {"sockets": 16})
    two = load_cluster("dgx-h100-2node")
    assert (grown.sockets, grown.nodes, grown.topology) == (16, 2, two.topology)
    small = load_cluster("sn40l-16", {"sockets": 8})
    assert (small.sockets, small.sockets_per_node) == (8, 8)
    assert "multiple of sockets_per_node (8)" in one_line(load_cluster, "dgx-h100",
                                                           {"sockets": 12})
    msg = one_line(load_cluster, "sn40l-16", {"sockets": 32})
    assert "topology.inter_node_bandwidth_bytes_per_s: 2 nodes of 16" in msg


def test_extends_overrides_single_figures(tmp_path):
    (tmp_path / "sn50.toml").write_text(
        'extends = "sn40l"\nname = "sn50"\n[tiers.hbm]\nbandwidth_bytes_per_s = 3.6e12\n')
    chip = load_chip(tmp_path / "sn50.toml")
    base = load_chip("sn40l")
    assert chip.name == "sn50" and chip.hbm.bandwidth_bytes_per_s == 3.6e12
    assert chip.hbm.capacity_bytes == base.hbm.capacity_bytes and chip.hbm.source
    assert chip.peak_flops == base.peak_flops
    (tmp_path / "big.toml").write_text(
        'extends = "sn40l-16"\nchip = "sn50.toml"\nname = "sn50-16"\n'
        "[topology]\nlink_bandwidth_bytes_per_s = 100e9\n")
    c = load_cluster(tmp_path / "big.toml", {"topology.link_latency_s": 5e-7})
    assert (c.name, c.chip.name, c.sockets) == ("sn50-16", "sn50", 16)
    assert c.topology.link_bandwidth_bytes_per_s == 100e9 and c.topology.link_latency_s == 5e-7
    assert c.topology.kind == "full_mesh"  # inherited


def test_extends_errors(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    assert "(a cycle)" in one_line(load_chip, tmp_path / "a.toml")
    (tmp_path / "c.toml").write_text("extends = 3\n")
    assert "c.toml: extends: expected a chip name or path, got 3" in one_line(
        load_chip, tmp_path / "c.toml")
    (tmp_path / "d.toml").write_text('extends = "sn99"\n')
    assert "unknown chip 'sn99'; bundled:" in one_line(load_chip, tmp_path / "d.toml")


def test_extends_chain_depth_is_bounded(tmp_path):
    # 1000 files deep overflowed Python's stack; the bound stops it at the 33rd file.
    for i in range(40):
        (tmp_path / f"c{i}.toml").write_text(f'extends = "c{i + 1}.toml"\n')
    (tmp_path / "c40.toml").write_text('extends = "sn40l-8"\n')
    assert one_line(load_cluster, tmp_path / "c0.toml") == (
        "c0.toml: extends: a chain of more than 32 files (reaching c32.toml); at most 32 "
        "accepted")
    assert load_cluster(tmp_path / "c10.toml").name == "sn40l-8"  # 31 files and the bundled one


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _tpot(output: str) -> float:
    return float(re.search(r"time per output token ms\s+([\d.]+)", output).group(1))


def test_simulate_and_plan_take_set_and_sockets():
    base = run("simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-16", "--tp", 16)
    fast = run("simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-16", "--tp", 16,
               "--set", "chip.tiers.hbm.bandwidth_bytes_per_s=3.6e12")
    assert base.exit_code == fast.exit_code == 0, fast.output
    assert _tpot(fast.output) < _tpot(base.output)
    assert fast.output.startswith("overrides: chip.tiers.hbm.bandwidth_bytes_per_s=3600000000000.0")
    r = run("plan", "--model", "llama-3.1-8b", "--cluster", "dgx-h100", "--sockets", 16,
            "--objective", "throughput", "--json")
    assert r.exit_code == 0, r.output
    assert max(int(x) for x in re.findall(r'"sockets": (\d+)', r.output)) == 16
    bad = run("simulate", "--cluster", "sn40l-16", "--set", "chip.tiers.hbm.speed=1")
    assert bad.exit_code == 2 and bad.output.count("\n") == 1
    assert "tiers.hbm.speed: unknown field; accepted:" in bad.output


def test_serve_takes_set(tmp_path):
    args = ["serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-16", "--requests", 8,
            "--rate", "inf", "--output-len", 8, "--prompt-len", 128]
    r = run(*args, "--out", tmp_path / "a", "--set", "topology.link_latency_s=2e-6",
            "--sockets", 8, "--plan", "tp8")
    assert r.exit_code == 0, r.output
    bad = run(*args, "--out", tmp_path / "b", "--set", "sockets=x")
    assert bad.exit_code == 2 and "sockets: expected a positive integer, got 'x'" in bad.output
