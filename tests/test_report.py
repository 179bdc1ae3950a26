"""`rdu-cluster report` on every dataset kind: serve sweeps, one `serve --out` folder, simulate
sweeps; skipped plots say why; fronts never mix models or settings; the page works in a real
browser (slow: headless Chromium, skipped without one)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

from rdu_cluster.cli import main
from rdu_cluster.output import plots
from rdu_cluster.output import report_page as report_cli
from rdu_cluster.output.plots.common import axis_scale

pytest.importorskip("plotly")

SERVE_SPEC = """
[sweep]
name = "serve-tiny"
kind = "serve"
[base]
model = "llama-3.1-8b"
cluster = "sn40l-8"
plan = "tp8"
requests = 12
prompt_len = 256
output_len = 16
[[axes]]
type = "grid"
rate = [5.0, 50.0]
max_batch = [4, 16]
"""


def _cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output + (r.stderr or "")
    return r


@pytest.fixture(scope="module")
def serve_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-sweep")
    spec = root / "spec.toml"
    spec.write_text(textwrap.dedent(SERVE_SPEC))
    _cli("sweep", spec, "--out", root / "data", "--no-progress")
    return root / "data"


@pytest.fixture(scope="module")
def serve_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("serve-run")
    _cli("serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--requests", "16",
         "--rate", "20", "--output-len", "16", "--prompt-len", "128", "--out", out)
    return out


def _figures(page: str) -> list[str]:
    return re.findall(r"<div id=\"(plot-\d+-[a-z_]+)\"", page)


def test_serve_sweep_report_has_its_plots(serve_sweep, tmp_path):
    html = tmp_path / "r.html"
    r = _cli("report", serve_sweep, "--out", html)
    assert "serve dataset, 4 rows, 5 plots" in r.output
    page = html.read_text()
    assert [f.split("-", 2)[2] for f in _figures(page)] == [
        "latency_vs_throughput", "ttft_vs_rate", "tpot_vs_rate", "latency_cdf", "pareto"]
    assert not re.search(r"<script[^>]*\ssrc=", page)  # plotly.js embedded: opens offline
    assert "Plotly.newPlot" in page and "max_batch=16" in page


def test_serve_folder_report(serve_run, tmp_path):
    html = tmp_path / "run.html"
    r = _cli("report", serve_run, "--out", html)
    assert "run dataset, 16 rows, 6 plots" in r.output
    page = html.read_text()
    assert "Serving run: llama-3.1-8b on sn40l-8" in page
    assert len(_figures(page)) == 6


def test_a_serve_folder_missing_a_table_is_refused(serve_run, tmp_path):
    cut = tmp_path / "cut"
    shutil.copytree(serve_run, cut)
    (cut / "steps.parquet").unlink()
    r = CliRunner().invoke(main, ["report", str(cut), "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 2 and f"{cut}: not a whole `serve --out` folder (no steps.parquet" \
        in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "r.html").exists()

def test_a_missing_column_skips_the_plot_with_a_sentence(serve_sweep):
    data = report_cli.load(serve_sweep)
    cols = {k: v for k, v in data.cols.items() if k != "tpot_p50_s"}
    figs = report_cli.render(report_cli.Dataset(data.kind, data.title, data.meta, cols))
    skipped = {f.name: f.caption for f in figs if f.html is None}
    assert set(skipped) == {"tpot_vs_rate", "latency_cdf", "pareto"}
    assert skipped["pareto"] == ("Skipped: this dataset has no column tpot_p50_s, which this "
                                 "plot needs.")
    page = report_cli.page(data, figs)
    assert page.count("class='skipped'") == 3


def test_unknown_kind_and_bad_folder_are_one_line(tmp_path):
    (tmp_path / "d").mkdir()
    r = CliRunner().invoke(main, ["report", str(tmp_path / "d"), "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 2 and "neither a sweep dataset" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "r.html").exists()
    # a report written into the dataset would become one of its files
    r = CliRunner().invoke(main, ["report", str(tmp_path), "--out", str(tmp_path / "d/r.html")])
    assert r.exit_code == 2 and "inside DIR" in r.stderr and not (tmp_path / "d/r.html").exists()
    data = report_cli.Dataset("capacity", "t", [], {"point_id": np.array(["a"])})
    (fig,) = report_cli.render(data)
    assert fig.html is None and "No plots for a 'capacity' dataset" in fig.caption


def test_report_without_plotly_says_so(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_plotly(name, *a, **k):
        if name.startswith("plotly"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_plotly)
    r = CliRunner().invoke(main, ["report", str(tmp_path), "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 2 and "pip install 'rdu-cluster[plot]'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "r.html").exists()


def test_pareto_fronts_never_mix_models_or_settings():
    """Two models, two prompt lengths (a setting), batch (a knob): one panel per model, one
    front per cluster and prompt length, and every front point is really undominated within
    its own group."""
    rng = np.random.default_rng(0)
    n = 48
    cols = {
        "point_id": np.array([str(i) for i in range(n)], dtype=object),
        "cluster": np.array(["c1", "c2"] * (n // 2), dtype=object),
        "model": np.array((["m1"] * 2 + ["m2"] * 2) * (n // 4), dtype=object),
        "prompt_len": np.repeat([128, 4096], n // 2),
        "batch": np.tile(np.repeat([1, 2, 4, 8, 16, 32], 4), 2),
        "sockets": np.full(n, 8),
        "tokens_per_s_total": rng.uniform(10, 1000, n),
        "tokens_per_s_per_request": rng.uniform(1, 100, n),
    }
    fig, _caption = plots.pareto(cols)
    fronts = [t for t in fig.data if t.mode == "lines+markers"]
    assert len(fronts) == 8  # 2 models x 2 clusters x 2 prompt lengths
    assert {t.name for t in fronts} == {f"{c}, prompt_len={p}" for c in ("c1", "c2")
                                        for p in (128, 4096)}
    x = cols["tokens_per_s_total"] / 8
    y = cols["tokens_per_s_per_request"]
    for t in fronts:
        panel_model = "m1" if t.xaxis in ("x", None) else "m2"
        cluster, setting = t.name.split(", prompt_len=")
        group = ((cols["model"] == panel_model) & (cols["cluster"] == cluster)
                 & (cols["prompt_len"] == int(setting)))
        for fx, fy in zip(t.x, t.y):
            k = np.flatnonzero(group & np.isclose(x, fx) & np.isclose(y, fy))
            assert len(k) == 1, "a front point comes from its own model and setting"
            assert not np.any(group & (x > fx) & (y > fy)), "dominated point on the front"


def _serve_cols(clusters=("c1", "c2", "c3"), models=("m1", "m2")) -> dict:
    """A serve sweep's columns: each cluster x model x max_batch (a knob, 7 values) x rate."""
    combos = [(c, m, b, r) for c in clusters for m in models for b in (1, 2, 4, 8, 16, 32, 64)
              for r in (1.0, 10.0)]
    c, m, b, r = (np.array(v, dtype=object if i < 2 else float) for i, v in enumerate(zip(*combos)))
    n = len(combos)
    rng = np.random.default_rng(1)
    cols = {"point_id": np.array([str(i) for i in range(n)], dtype=object), "cluster": c,
            "model": m, "max_batch": b.astype(int), "rate_requests_per_s": r,
            "sockets": np.full(n, 8), "throughput_tokens_per_s": rng.uniform(10, 3000, n),
            "e2e_p50_s": rng.uniform(0.1, 5, n)}
    for metric in ("ttft", "tpot", "e2e"):
        for q in plots.QUANTILES:
            cols[f"{metric}_p{q}_s"] = rng.uniform(0.005, 0.5, n) * (1 + q / 100)
    return cols


@pytest.mark.parametrize("draw", [plots.ttft_vs_rate, plots.latency_vs_throughput,
                                  plots.quantiles_cdf, plots.serve_pareto])
def test_a_colour_names_one_cluster_across_every_panel(draw):
    """Serve-sweep panels with many traces (3 clusters x 7 max_batch values x 2 models): a
    trace's colour is its cluster's, the same in every panel and plot, and no two clusters
    share one; the settings of one cluster differ by marker or dash instead."""
    cols = _serve_cols()
    fig, _ = draw(cols)
    colour_of: dict[str, set] = {}
    looks_of: dict[str, set] = {}
    for t in fig.data:
        cluster = t.name.split(",")[0].split(" ")[0]
        if cluster not in ("c1", "c2", "c3"):  # quantiles_cdf names lead with the model
            cluster = next(c for c in ("c1", "c2", "c3") if c in t.name)
        colour = t.line.color or t.marker.color
        colour_of.setdefault(cluster, set()).add(colour)
        looks_of.setdefault(cluster, set()).add((t.name, t.marker.symbol, t.line.dash))
    assert all(len(v) == 1 for v in colour_of.values()), colour_of
    assert len({next(iter(v)) for v in colour_of.values()}) == 3
    for cluster, seen in looks_of.items():
        by_name = {}
        for name, symbol, dash in seen:
            by_name.setdefault(name.replace(" p50", "").replace(" p99", ""), set()).add(
                (symbol, dash if draw is not plots.ttft_vs_rate else None))
        styles = [frozenset(v) for v in by_name.values()]
        assert len(set(styles)) == len(styles), f"{cluster}: two settings drawn alike"


@pytest.mark.parametrize("lo, hi, unit", [(25.0, 700.0, "tok/s"), (0.002, 0.9, "ms"),
                                          (1.0, 1e15, "FLOP/s")])
def test_log_axes_are_labelled_at_each_decade_with_their_unit(lo, hi, unit):
    """A log axis carries a label at each decade, written in full with its unit (a DeepSeek
    Pareto axis read "5" for 500 between 1-2-5 ticks), and at least two of them."""
    axis = axis_scale(np.geomspace(lo, hi, 7), unit=unit)
    assert axis["type"] == "log" and axis["dtick"] == 1
    assert axis["ticksuffix"] == f" {unit}"
    first, last = axis.get("range", [np.floor(np.log10(lo)), np.ceil(np.log10(hi))])
    assert last - first >= 1 and first <= np.log10(lo) and last >= np.log10(hi)
    assert axis_scale(np.geomspace(lo, hi, 7), log=True)["ticksuffix"] == ""


def test_socket_busy_fraction_measures_busy_time():
    """Two sockets, three windows with idle gaps between them: busy over the run's elapsed
    time, not over each window's span (which read 1.0 for every socket)."""
    cols = {"sockets.socket": np.array([0, 1] * 3),
            "sockets.time_s": np.repeat([1.0, 5.0, 10.0], 2),
            "sockets.busy_s": np.array([1.0, 0.5] * 3)}
    ids, frac, elapsed = plots.busy_fractions(cols)
    assert ids == [0, 1] and elapsed == 10.0
    assert np.allclose(frac, [0.3, 0.15])
    fig, _ = plots.socket_busy(cols)
    assert np.allclose(fig.data[0].y, [0.3, 0.15]) and "elapsed" in fig.layout.yaxis.title.text


def test_a_served_run_at_a_low_rate_is_mostly_idle(tmp_path):
    """End to end: 6 short requests at 0.5/s keep the sockets busy for a small share of the
    run; the report's busy fraction says so (it read 1.0)."""
    out = tmp_path / "run"
    _cli("serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--requests", "6",
         "--rate", "0.5", "--output-len", "8", "--prompt-len", "64", "--out", out)
    _, frac, elapsed = plots.busy_fractions(report_cli.load(out).cols)
    assert elapsed > 5 and 0 < frac.max() < 0.2, (elapsed, frac)


# --- in a real browser ----------------------------------------------------------------------
# Injected at the top of each page: collects JavaScript errors (and console.error, where Plotly
# reports), then after load counts each chart's drawn marks (bar, line and marker paths with a
# real shape: an unplottable bar is "M0,0Z", an unplottable line has NaN) and lists the pairs of
# its labels (every SVG text: ticks, titles, legend) whose boxes overlap, into a <pre>, and
# posts that verdict to the frame holding the page.
PROBE = """
(function () {
  var errors = [];
  window.addEventListener('error', function (e) { errors.push(String(e.message || e)); });
  window.addEventListener('unhandledrejection', function (e) {
    errors.push('unhandled rejection: ' + String(e.reason)); });
  var orig = console.error;
  console.error = function () {
    errors.push(Array.prototype.join.call(arguments, ' ')); orig.apply(console, arguments); };
  window.addEventListener('load', function () {
    setTimeout(function () {
      var charts = [];
      document.querySelectorAll('.plotly-graph-div').forEach(function (gd) {
        var marks = 0;
        gd.querySelectorAll('.barlayer path, .scatterlayer path.js-line, .scatterlayer path.point')
          .forEach(function (p) {
            var d = p.getAttribute('d') || '';
            if (d && d.indexOf('NaN') < 0 && d !== 'M0,0Z') { marks += 1; }
          });
        var boxes = [], overlaps = [];
        gd.querySelectorAll('text').forEach(function (t) {
          var r = t.getBoundingClientRect();
          if (t.textContent.trim() && r.width > 0 && r.height > 0) {
            boxes.push([t.textContent, r]); }
        });
        for (var i = 0; i < boxes.length; i++) {
          for (var j = i + 1; j < boxes.length; j++) {
            var a = boxes[i][1], b = boxes[j][1];
            if (Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1 &&
                Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1) {
              overlaps.push(boxes[i][0] + ' / ' + boxes[j][0]); }
          }
        }
        charts.push({id: gd.id, traces: (gd.data || []).length, marks: marks,
                     overlaps: overlaps});
      });
      var pre = document.createElement('pre');
      pre.id = 'rdu-check';
      pre.textContent = JSON.stringify({errors: errors, charts: charts});
      document.body.appendChild(pre);
      window.parent.postMessage({page: location.pathname.split('/').pop(),
                                 verdict: pre.textContent}, '*');
    }, 1500);
  });
})();
"""
# The frame page: each report in an iframe of the window's size (1280 x 1000: the size the
# overlap check is stated for), the verdicts they post gathered into one <pre>. One Chromium
# start for all the reports (a start and its first page cost ~4 s of CPU; each further page
# ~1.3 s, measured on this 2-core machine).
FRAMES = """<!DOCTYPE html><html><head><script>
var verdicts = {};
window.addEventListener('message', function (e) {
  verdicts[e.data.page] = JSON.parse(e.data.verdict);
  document.getElementById('rdu-check').textContent = JSON.stringify(verdicts);
});
</script></head><body style="margin:0"><pre id="rdu-check">{}</pre>%s</body></html>"""


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def browser_check(pages: dict, tmp_path) -> dict:
    """Open each page (with the probe) in one headless Chromium, each in a frame of the
    window's size: {name: the probe's verdict on it, None where the page did not finish
    loading}."""
    frames = []
    for name, page_path in pages.items():
        probed = tmp_path / f"probed-{name}.html"
        probed.write_text(page_path.read_text().replace(
            "<head>", f"<head><script>{PROBE}</script>", 1))
        frames.append(f'<iframe src="{probed.name}" width="1280" height="1000" '
                      f'style="border:0;display:block"></iframe>')
    top = tmp_path / "frames.html"
    top.write_text(FRAMES % "".join(frames))
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=15000",
           "--window-size=1280,1000",
           "--dump-dom", top.as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False).stdout
    found = re.search(r'<pre id="rdu-check">(.*?)</pre>', dom, re.DOTALL)
    assert found, f"the frame page did not load in Chromium: {dom[-500:]!r}"
    verdicts = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return {name: verdicts.get(f"probed-{name}.html") for name in pages}


BROWSED = ["serve_sweep", "serve_run", "simulate_sweep"]


@pytest.fixture(scope="module")
def browsed(request, tmp_path_factory):
    """Each kind of report, written and opened in Chromium: {kind: (page, verdict)}."""
    root = tmp_path_factory.mktemp("browsed")
    _cli("sweep", "examples/sweeps/decode-small.toml", "--out", root / "d", "--no-progress")
    sources = {"simulate_sweep": root / "d"} | {
        which: request.getfixturevalue(which) for which in BROWSED if which != "simulate_sweep"}
    pages = {}
    for which in BROWSED:
        pages[which] = root / f"{which}.html"
        _cli("report", sources[which], "--out", pages[which])
    verdicts = browser_check(pages, root)
    return {which: (pages[which].read_text(), verdicts[which]) for which in BROWSED}


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason="no chromium binary on PATH (CI installs it: "
                    "apt-get install chromium); the browser check needs one")
@pytest.mark.parametrize("which", BROWSED)
def test_report_renders_in_headless_chromium(which, browsed):
    page, verdict = browsed[which]
    assert verdict is not None, "the page did not finish loading in Chromium"
    assert verdict["errors"] == []
    assert len(verdict["charts"]) == len(_figures(page)) >= 5
    empty = [c["id"] for c in verdict["charts"] if c["traces"] == 0 or c["marks"] == 0]
    assert empty == [], f"charts with nothing drawn: {empty}"
    overlaps = {c["id"]: c["overlaps"] for c in verdict["charts"] if c["overlaps"]}
    assert overlaps == {}, f"labels drawn over each other (1280 px wide): {overlaps}"


def test_a_run_without_steps_says_so_not_single_socket(tmp_path):
    """A tp4pp2 run whose socket fails at 0 runs no step: its page said 'a single-socket plan'
    for the missing link plot."""
    out = tmp_path / "run"
    _cli("serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--plan", "tp4pp2",
         "--requests", "6", "--rate", "20", "--output-len", "8", "--prompt-len", "64",
         "--fault", "socket:1@0", "--out", out, "--no-progress")
    html = tmp_path / "run.html"
    _cli("report", out, "--out", html)
    page = html.read_text()
    assert "no link traffic (no step ran)" in page
    assert "single-socket plan" not in page


HARDWARE_SPEC = """
[sweep]
name = "hbm-what-if"
kind = "simulate"
[base]
model = "llama-3.1-8b"
cluster = "sn40l-16"
tp = 16
prompt_len = 1024
gen_len = 64
[[axes]]
type = "grid"
batch = [1, 8]
"chip.tiers.hbm.bandwidth_bytes_per_s" = [1.8e12, 3.6e12]
"""


def test_a_hardware_sweep_draws_every_variant_in_every_panel(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(textwrap.dedent(HARDWARE_SPEC))
    _cli("sweep", spec, "--out", tmp_path / "data", "--no-progress")
    data = report_cli.load(tmp_path / "data")
    variants = {"hbm_bandwidth_bytes_per_s=1.8e+12", "hbm_bandwidth_bytes_per_s=3.6e+12"}
    assert set(data.cols["variant"]) == variants
    drawn = {}
    for name in ("roofline", "tokens_vs_batch", "breakdown", "pareto", "variant_ratio"):
        plot = next(p for p in plots.PLOTS["simulate"] if p.name == name)
        fig, caption = plot.draw(data.cols)
        assert "Slice: chip_tiers" not in caption  # no variant is sliced away
        names = " ".join(str(t.name) for t in fig.data) + " ".join(
            str(x) for t in fig.data if t.type == "bar" for x in t.x)
        drawn[name] = {v for v in variants if v in names}
    assert all(found == variants for found in drawn.values()), drawn
    ratio = plots.variant_ratio(data.cols)[0]
    faster = [t for t in ratio.data if "3.6e+12" in t.name and t.xaxis in ("x", None)]
    assert faster and all(y > 1.2 for t in faster for y in t.y)  # tokens/s: 2x HBM, faster
