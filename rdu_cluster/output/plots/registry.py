"""The plots the report draws for each kind of dataset (a sweep's kind: simulate, plan, serve;
or "run", one `serve --out` folder), in the order its page shows them."""

from __future__ import annotations

from chip.cost import CAUSES
from rdu_cluster.output.plots.common import Plot
from rdu_cluster.output.plots.run import (
    batch_over_time,
    latency_cdf,
    latency_over_time,
    link_use,
    socket_busy,
    time_by_cause,
)
from rdu_cluster.output.plots.sweep import (
    QUANTILES,
    ablation,
    breakdown,
    latency_vs_throughput,
    pareto,
    quantiles_cdf,
    roofline,
    serve_pareto,
    tokens_vs_batch,
    tpot_vs_rate,
    ttft_vs_rate,
    variant_ratio,
)

# --- the plots of each dataset kind --------------------------------------------------------
_RATE, _THR = "rate_requests_per_s", "throughput_tokens_per_s"
_Q = lambda m: tuple(f"{m}_p{q}_s" for q in QUANTILES)
PLOTS: dict[str, tuple[Plot, ...]] = {
    "simulate": (
        Plot("roofline", "Roofline", ("cluster", "chip", "flops_per_token", "bytes_per_token",
             "tokens_per_s_total", "sockets", "chip_peak_flops_per_s",
             "chip_hbm_bandwidth_bytes_per_s"), roofline),
        Plot("tokens_vs_batch", "Tokens/s against batch",
             ("cluster", "model", "batch", "tokens_per_s_total"), tokens_vs_batch),
        Plot("ablation", "Ablation", ("cluster", "model", "tokens_per_s_per_request"), ablation),
        Plot("breakdown", "Decode time by cause",
             ("cluster", "model", *(f"decode_{c}_s" for c in CAUSES)), breakdown),
        Plot("variant_ratio", "Hardware variants against the baseline",
             ("cluster", "model", "batch", "tokens_per_s_total", "tpot_s"), variant_ratio),
        Plot("pareto", "Pareto front", ("cluster", "model", "sockets", "tokens_per_s_total",
             "tokens_per_s_per_request"), pareto),
    ),
    "serve": (
        Plot("latency_vs_throughput", "Latency against throughput",
             ("cluster", "model", _RATE, _THR, "e2e_p50_s"), latency_vs_throughput),
        Plot("ttft_vs_rate", "TTFT against rate", ("cluster", "model", _RATE, *_Q("ttft")),
             ttft_vs_rate),
        Plot("tpot_vs_rate", "TPOT against rate", ("cluster", "model", _RATE, *_Q("tpot")),
             tpot_vs_rate),
        Plot("latency_cdf", "Latency quantiles (CDF points)",
             ("cluster", "model", *_Q("ttft"), *_Q("tpot"), *_Q("e2e")), quantiles_cdf),
        Plot("pareto", "Pareto front", ("cluster", "model", "sockets", _THR, "tpot_p50_s"),
             serve_pareto),
    ),
    "run": (
        Plot("latency_cdf", "Latency CDFs", ("requests.state", "requests.ttft_s",
             "requests.tpot_s", "requests.e2e_s"), latency_cdf),
        Plot("latency_over_time", "Latency by arrival time",
             ("requests.state", "requests.arrival_s", "requests.ttft_s", "requests.e2e_s"),
             latency_over_time),
        Plot("batch_over_time", "Batch over time",
             ("steps.replica", "steps.start_s", "steps.batch"), batch_over_time),
        Plot("time_by_cause", "Where the time went",
             ("steps.phase", *(f"steps.{c}_s" for c in CAUSES)), time_by_cause),
        Plot("socket_busy", "Socket busy fraction",
             ("sockets.socket", "sockets.busy_s", "sockets.time_s"),
             socket_busy),
        Plot("link_use", "Link utilization",
             ("links.src", "links.dst", "links.bytes", "links.utilization"), link_use),
    ),
}
PLOTS["plan"] = PLOTS["simulate"]  # a plan row has what it has; missing columns are named
