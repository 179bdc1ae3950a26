"""Chip and cluster configs: bundled files load, figures carry sources, bad input is one line."""

from __future__ import annotations

import pytest

import cluster_configs
from rdu_cluster.config import load_chip, load_cluster
from workloads.errors import ConfigError

CLUSTERS = cluster_configs.bundled("clusters")  # every bundled cluster, a new one too


@pytest.mark.parametrize("name", CLUSTERS)
def test_bundled_clusters_load(name):
    c = load_cluster(name)
    assert c.sockets >= 1
    assert c.sockets % c.sockets_per_node == 0
    assert all(t.source for t in c.chip.tiers)
    assert c.topology.source


def test_reference_figures():
    # ../shared/REFERENCE.md: SN40L 638 TFLOP/s, 64 GB HBM at 1.8 TB/s, 1.5 TB DDR at 200 GB/s
    sn = load_chip("sn40l")
    assert sn.flops("bf16") == 638e12
    assert sn.hbm.bandwidth_bytes_per_s == 1.8e12
    assert sn.tier("ddr").capacity_bytes == 1.5e12
    assert sn.tier("sram").capacity_bytes == 520 * 2**20
    h100 = load_chip("h100-sxm")
    assert h100.hbm.bandwidth_bytes_per_s == 3.35e12
    assert h100.flops("fp8") == pytest.approx(2 * h100.flops("bf16"), rel=1e-4)
    # A100 has no FP8 path: FP8 math runs at the BF16 rate.
    assert load_chip("a100-sxm-80gb").flops("fp8") == 312e12


def test_two_node_clusters():
    c = load_cluster("dgx-h100-2node")
    assert (c.sockets, c.nodes) == (16, 2)
    assert c.node_of(7) == 0 and c.node_of(8) == 1


def test_overrides_nested_fields():
    c = load_cluster(
        "sn40l-16",
        {"chip.tiers.hbm.bandwidth_bytes_per_s": 1.6e12, "topology.link_latency_s": 2e-6},
    )
    assert c.chip.hbm.bandwidth_bytes_per_s == 1.6e12
    assert c.topology.link_latency_s == 2e-6


def test_cluster_file_names_chip_file_and_overrides(tmp_path):
    chip = cluster_configs.bundled("chips")["sn40l"]
    (tmp_path / "mine.toml").write_text(
        f'name = "mine"\ndescription = "x"\nchip = "{chip}"\nsockets = 4\n'
        'sockets_per_node = 4\nsource = "test"\n'
        '[topology]\nkind = "ring"\nlink_bandwidth_bytes_per_s = 1e10\n'
        'link_latency_s = 1e-6\nsource = "test"\n'
        "[chip_overrides.tiers.hbm]\nbandwidth_bytes_per_s = 1.6e12\n"
    )
    c = load_cluster(tmp_path / "mine.toml")
    assert c.sockets == 4 and c.chip.hbm.bandwidth_bytes_per_s == 1.6e12


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("name = 'x'\n[[[", "malformed TOML"),
        ("name = 'x'", "missing field"),
        ("bogus = 1\nname='x'", "bogus: unknown field"),
    ],
)
def test_bad_cluster_files(tmp_path, text, fragment):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_cluster(p)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_empty_top_level_source_refused(tmp_path):
    # [cost] and [topology] already refused an empty source; the cluster's own was accepted.
    text = cluster_configs.bundled("clusters")["sn40l-8"].read_text()
    p = tmp_path / "c.toml"
    p.write_text(text.replace('source = "[MICRO24] section IV, VII"', 'source = ""', 1))
    with pytest.raises(ConfigError, match=r"^c.toml.source: expected a non-empty string naming "
                       "the basis$"):
        load_cluster(p)


@pytest.mark.parametrize("line, where", [
    ('source = "[MICRO24] Table II"', r"chip.toml.source"),
    ('source = "[MICRO24] Table II (alternative 1.6 TB/s in [HC24])"', r"tiers.hbm.source"),
])
def test_empty_chip_sources_refused(tmp_path, line, where):
    # the cluster's were refused, the chip's own and its tiers' were accepted
    text = cluster_configs.bundled("chips")["sn40l"].read_text()
    assert line in text
    chip = tmp_path / "chip.toml"
    chip.write_text(text.replace(line, 'source = ""', 1))
    with pytest.raises(ConfigError, match=where + ": expected a non-empty string"):
        load_chip(chip)


def test_unknown_names_list_what_exists():
    with pytest.raises(ConfigError, match="bundled: .*sn40l-16"):
        load_cluster("sn50")
    with pytest.raises(ConfigError, match="tiers.hbm.speed: unknown field; accepted: "
                       "bandwidth_bytes_per_s, capacity_bytes, source"):
        load_cluster("sn40l-16", {"chip.tiers.hbm.speed": 1})


def test_negative_figure_rejected(tmp_path):
    chip = cluster_configs.bundled("chips")["h100-sxm"].read_text()
    p = tmp_path / "neg.toml"
    p.write_text(chip.replace("bandwidth_bytes_per_s = 3.35e12", "bandwidth_bytes_per_s = -1"))
    with pytest.raises(ConfigError,
                       match=r"tiers.hbm.bandwidth_bytes_per_s: expected a finite number in \[1e\+06"):
        load_chip(p)


def test_dataflow_model_needs_an_sram_tier(tmp_path):
    # A gpu-kind chip has no SRAM tier, which the dataflow model reads (a KeyError mid-run).
    text = cluster_configs.bundled("chips")["sn40l"].read_text()
    ddr, execution = text.index("[tiers.ddr]"), text.index("[execution]")
    text = (text[:ddr] + text[execution:]).replace('kind = "rdu"', 'kind = "gpu"')
    (tmp_path / "gpu.toml").write_text(text.replace("[tiers.sram]", "[tiers.host]"))
    with pytest.raises(ConfigError, match=r"^gpu.toml: execution: the dataflow model needs an sram "
                       "tier"):
        load_chip(tmp_path / "gpu.toml")


def test_a_config_file_edited_at_once_is_read_anew_and_a_callers_changes_stay_its_own(tmp_path):
    """read_toml caches parsed files by their text: a file rewritten with text of the same
    length within the same clock tick is parsed again, and a caller that changes its dict
    (config.py pops `extends`) does not change what the next reader gets."""
    from workloads.files import read_toml

    f = tmp_path / "c.toml"
    f.write_text('a = 1\n[t]\nb = "x"\n')
    first = read_toml(f)
    first["t"]["b"] = "changed"
    first.pop("a")
    assert read_toml(f) == {"a": 1, "t": {"b": "x"}}
    f.write_text('a = 2\n[t]\nb = "x"\n')  # same size, at once
    assert read_toml(f)["a"] == 2
