"""Interactive plots of a dataset (Plotly, the optional `plot` extra) for the HTML report.

A dataset is a flat mapping of numpy columns: a sweep's rows (`columns(table)`), or a `serve`
output folder's tables with the table name in front ("requests.ttft_s", `run_columns`). Each
plot is a `Plot`: the columns it needs and a function returning (figure or None, caption). The
report checks the columns first, so a dataset without one gets a sentence, not a traceback.

Where a sweep varies more than a plot shows, it shows one slice (every other varying column at
its most common value, chosen per cluster and model; named in the caption). Fronts and curves
are drawn per model (one panel each) and per setting (one trace per cluster and workload
setting), never over points of different models or settings. Legends and panel titles carry
the labels (no free-floating annotations), so labels cannot overlap the data or each other.

A module per concept, each importing only those before it here: common (what more than one
kind of figure uses: the Plot record, a dataset's columns, plotly, the colours, panels, axis
scales, hover text and the small value helpers), slicing (a sweep's axes, the slice a figure
shows and its groups of rows, one trace each), sweep (the figures of a sweep dataset: simulate
and plan, serve), run (the figures of one `serve --out` folder), registry (PLOTS: the plots of
each dataset kind, in the page's order). The package re-exports the names imported elsewhere.
"""

from rdu_cluster.output.plots.common import Cols, Plot, columns, missing, require_plotly, unique
from rdu_cluster.output.plots.registry import PLOTS
from rdu_cluster.output.plots.run import busy_fractions, run_columns, socket_busy
from rdu_cluster.output.plots.slicing import with_variants
from rdu_cluster.output.plots.sweep import (
    QUANTILES,
    latency_vs_throughput,
    pareto,
    pareto_front,
    quantiles_cdf,
    serve_pareto,
    ttft_vs_rate,
    variant_ratio,
)

__all__ = [
    "PLOTS", "QUANTILES", "Cols", "Plot", "busy_fractions", "columns", "latency_vs_throughput",
    "missing", "pareto", "pareto_front", "quantiles_cdf", "require_plotly", "run_columns",
    "serve_pareto", "socket_busy", "ttft_vs_rate", "unique", "variant_ratio", "with_variants",
]
