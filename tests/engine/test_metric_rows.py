"""The compact recorders (engine/metrics.py): socket rows as typed arrays, an occupancy read
once the backend fills it in, and step arrays joined in chunks with the same values."""

import numpy as np
import pytest

from rdu_cluster.backends.ray_backend import PendingOccupancy
from rdu_cluster.engine import metrics


def _window(rec: metrics.SocketRows, w: int, occ: list, energy=None) -> None:
    rec.add_window({"socket": [0, 1], "replica": 0, "node": [0, 0], "window": w,
                    "time_s": 1.0 + w, "window_s": 1.0, "busy_s": np.array([0.5, 0.25]),
                    "busy_fraction": np.array([0.5, 0.25]), "sent_bytes": np.zeros(2),
                    "switches": 0, "switch_s": [0.0, 0.0], "energy_j": energy,
                    "cost_usd": None}, occ)


def test_socket_rows_read_occupancy_once_filled_and_keep_nulls():
    rows = metrics.SocketRows()
    late = [PendingOccupancy(), PendingOccupancy()]
    _window(rows, 0, late, energy=np.array([2.0, 3.0]))
    _window(rows, 1, [{"hbm": 5.0}, {"hbm": 6.0, "ddr": 1.0}])
    assert len(rows.pending) == 4  # the second window waits behind the first, in order
    for i, p in enumerate(late):
        p.fill({"hbm": float(i)})
    cols = rows.columns()
    assert not rows.pending
    assert cols["hbm_used_bytes"].to_pylist() == [0.0, 1.0, 5.0, 6.0]
    assert cols["ddr_used_bytes"].to_pylist() == [None, None, None, 1.0]
    assert cols["energy_j"].to_pylist() == [2.0, 3.0, None, None]
    assert cols["cost_usd"].null_count == 4
    assert cols["window"].to_pylist() == [0, 0, 1, 1]
    assert cols["busy_s"].to_pylist() == [0.5, 0.25, 0.5, 0.25]


def test_unfilled_occupancy_is_an_error_at_table_time():
    rows = metrics.SocketRows()
    _window(rows, 0, [PendingOccupancy(), PendingOccupancy()])
    with pytest.raises(RuntimeError, match="sync"):
        rows.columns()


def test_joined_step_chunks_hold_the_same_rows():
    rec = metrics.Recorder()
    rng = np.random.default_rng(0)
    windows = []
    for w in range(2 * metrics.COMPACT_EVERY + 5):
        n = int(rng.integers(1, 6))
        cols = {f.name: rng.random(n) for f in metrics.STEPS}
        cols["step"] = np.arange(n) + 10 * w
        cols["phase"] = np.array(["decode"] * n)
        rec.add_steps(0, cols)
        windows.append(cols)
    assert len(rec.steps) == 2 + 5  # two joined chunks, five windows not joined yet
    joined = metrics.steps_columns(rec)
    for f in metrics.STEPS:
        assert np.array_equal(joined[f.name], np.concatenate([c[f.name] for c in windows]))
    starts, _, first = rec.step_times(0)
    assert first == 0 and np.array_equal(starts, np.concatenate([c["start_s"] for c in windows]))


def test_step_times_dropped_before_a_step_keep_their_indices():
    """A replica's step times before the steps its requests in flight read are dropped, once
    they are half the buffer; the rest keep their step numbers (view index + first)."""
    g = metrics.Growing()
    values = np.arange(1000.0)
    for part in np.array_split(values, 37):
        g.extend(part)
        g.drop_before(len(g) - 10)  # a run that reads its last ten steps only
    assert len(g) == 1000 and 10 <= g.n <= len(g.buf) and len(g.buf) < 200
    assert np.array_equal(g.view(), values[g.first:])
    g.drop_before(5)  # before what is already dropped: nothing to do
    assert np.array_equal(g.view(), values[g.first:])


def _documented(section: str, columns: list[str]) -> list[str]:
    """The columns a docs section does not name: each by its name, or by a pattern the section
    writes (`<cause>_s`, sram/hbm/ddr/host_used_bytes)."""
    import re

    from chip.cost import CAUSES

    names = set(re.findall(r"[a-z][a-z0-9_]*", section))
    if "<cause>_s" in section:
        names |= {f"{c}_s" for c in CAUSES}
    for m in re.finditer(r"((?:[a-z]+/)+[a-z]+)(_[a-z_]+)", section):
        names |= {p + m.group(2) for p in m.group(1).split("/")}
    return [c for c in columns if c not in names]


def test_every_table_column_is_in_docs_engine_md():
    """docs/engine.md "Tables" names every column of the four tables (requests.model and the
    sockets' socket, replica, node and window were written and not named)."""
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "engine.md").read_text()
    sec = doc[doc.index("## Tables"):doc.index("## Timelines")]
    bullets = {name: sec[sec.index(f"- `{name}`"):] for name in
               ("requests", "steps", "sockets", "links")}
    for name, schema in (("requests", metrics.REQUESTS), ("steps", metrics.STEPS),
                         ("sockets", metrics.SOCKETS), ("links", metrics.LINKS)):
        text = bullets[name].split("\n- ")[0]
        assert _documented(text, [f.name for f in schema]) == [], name
