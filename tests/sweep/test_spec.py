"""Sweep specs: grid / zip / list expansion, nested fields, filters, ids, and bad specs."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rdu_cluster.cli import main
from rdu_cluster.sweep import expand, load_spec
from tests.sweep.helpers import write  # also registers the fake runner
from workloads.errors import ConfigError

SPEC = """
[sweep]
kind = "fake"
[base]
y = 2
[[axes]]
type = "grid"
x = [1, 2, 3]
cluster = ["a", "b"]
[[axes]]
type = "zip"
model = ["m1", "m2"]
chip.tiers.hbm.bandwidth_bytes_per_s = [1.6e12, 2e12]
[[axes]]
type = "list"
points = [{ options.turbo = true }, { "options.turbo" = false, y = 5 }]
"""


def test_grid_zip_list_product_in_fixed_order(tmp_path):
    spec = load_spec(write(tmp_path, SPEC))
    exp = expand(spec)
    assert spec.grid_size == 6 * 2 * 2 == len(exp.points)
    first = exp.points[0].fields
    assert first["x"] == 1 and first["cluster"] == "a" and first["model"] == "m1"
    assert first["chip.tiers.hbm.bandwidth_bytes_per_s"] == 1.6e12
    assert first["options.turbo"] is True and first["y"] == 2
    assert exp.points[1].fields["y"] == 5  # the list axis varies fastest
    zipped = {
        (p.fields["model"], p.fields["chip.tiers.hbm.bandwidth_bytes_per_s"]) for p in exp.points
    }
    assert zipped == {("m1", 1.6e12), ("m2", 2e12)}
    assert len({p.id for p in exp.points}) == len(exp.points)


def test_ids_and_hash_ignore_spelling(tmp_path):
    a = load_spec(write(tmp_path, SPEC, "a.toml"))
    respelled = SPEC.replace("1.6e12", "1600000000000.0").replace("[sweep]", "# note\n[sweep]")
    b = load_spec(write(tmp_path, respelled, "b.toml"))
    assert a.hash == b.hash
    assert [p.id for p in expand(a).points] == [p.id for p in expand(b).points]
    c = load_spec(write(tmp_path, SPEC.replace("x = [1, 2, 3]", "x = [1, 2, 4]"), "c.toml"))
    assert c.hash != a.hash


def test_filters_keep_and_drop(tmp_path):
    body = (
        SPEC
        + """
[filters]
keep = ["x * y <= 6"]
drop = ["cluster == 'b' and options.turbo"]
"""
    )
    exp = expand(load_spec(write(tmp_path, body)))
    for p in exp.points:
        f = p.fields
        assert f["x"] * f["y"] <= 6
        assert not (f["cluster"] == "b" and f["options.turbo"])
    assert exp.filtered_out == 24 - len(exp.points) > 0


@pytest.mark.parametrize(
    "change, fragment",
    [
        (("x = [1, 2, 3]", "xx = [1, 2, 3]"), "axes[0].xx: unknown field"),
        (("x = [1, 2, 3]", "x = [1, 'two', 3]"), "axes[0].x[1]: expected a positive integer"),
        (("x = [1, 2, 3]", "x = []"), "axes[0].x: empty axis"),
        (("y = 2", "y = 2.5"), "base.y: expected a positive integer"),
        (("y = 2", "y = [2, 3]"), "base.y: a list belongs in an axis"),
        (('model = ["m1", "m2"]', 'model = ["m1"]'), "zip lists differ in length"),
        (('type = "grid"', 'type = "mesh"'), "axes[0].type: 'mesh'"),
        (("options.turbo = true", "options.warp = true"), "options.warp: unknown field"),
        (('kind = "fake"', 'kind = "fake"\nseeds = 1'), "sweep.seeds: unknown field"),
        (('kind = "fake"', 'kind = "nope"'), "sweep.kind: unknown kind 'nope'"),
        (("[base]", "[filters]\nkeep = ['import os']\n[base]"), "filters.keep[0]"),
        (("[base]", "[filters]\nkeep = ['z > 1']\n[base]"), "z: unknown field"),
        (("[base]", "[filters]\nkeep = ['x.__class__ > 1']\n[base]"), "x.__class__: unknown"),
        (("[base]", "[filters]\nkeep = ['open(1)']\n[base]"), "only min, max, abs, round"),
        (('cluster = ["a", "b"]', 'cluster = ["a", "b"]\ny = [1]'), "already an axis"),
    ],
)
def test_bad_spec_is_one_line_naming_the_field(tmp_path, change, fragment):
    old, new = change
    assert old in SPEC
    path = write(tmp_path, SPEC.replace(old, new, 1))
    with pytest.raises(ConfigError) as e:
        expand(load_spec(path))
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_cli_bad_spec_exit_2_nothing_written(tmp_path):
    path = write(tmp_path, SPEC.replace("x = [1, 2, 3]", "x = []"))
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["sweep", str(path), "--out", str(out)])
    assert r.exit_code == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "empty axis" in r.stderr
    assert not out.exists()


def test_cli_address_only_with_ray(tmp_path):
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["sweep", str(write(tmp_path, SPEC)), "--out", str(out),
                                  "--address", "127.0.0.1:1"])
    assert r.exit_code == 2 and r.stderr.strip() == "error: --address: only with --backend ray"
    assert not out.exists()


def test_max_points_refused_before_expansion(tmp_path):
    many = lambda n: "[" + ", ".join(str(i) for i in range(1, n + 1)) + "]"
    big = f"""
[sweep]
kind = "fake"
[[axes]]
type = "grid"
x = {many(2000)}
y = {many(4000)}
"""
    path = write(tmp_path, big)
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["sweep", str(path), "--out", str(out)])
    assert r.exit_code == 2 and "exceed --max-points 1,000,000" in r.stderr
    assert "8,000,000 points" in r.stderr and not out.exists()
    r = CliRunner().invoke(main, ["sweep", str(path), "--dry-run", "--max-points", "100"])
    assert r.exit_code == 2 and "--max-points 100" in r.stderr


def test_dry_run_prints_count_and_first_points(tmp_path):
    r = CliRunner().invoke(main, ["sweep", str(write(tmp_path, SPEC)), "--dry-run", "--show", "3"])
    assert r.exit_code == 0, r.stderr
    assert "24 points" in r.output and "first 3:" in r.output
    assert "chip.tiers.hbm.bandwidth_bytes_per_s" in r.output
    assert not any(tmp_path.glob("*/"))
