"""Link-figure sensitivity: tokens/s on sn40l-16 as the unpublished P2P link bandwidth and
per-hop latency vary 0.25x..4x around the config's assumption (50 GB/s, 1 us), and the same
plans on the what-if wirings (ring, 2D torus, switch).

    .venv/bin/python benchmarks/link_sensitivity.py
"""

from __future__ import annotations

from partitioning.evaluate import evaluate_plan
from partitioning.plan import Plan
from partitioning.scenario import Scenario
from partitioning.sensitivity import FACTORS, link_sensitivity
from rdu_cluster.config import load_cluster
from rdu_cluster.output.report import text_table
from workloads.catalog import load_model

CASES = (  # model, plan, batch
    ("llama-3.1-70b", "tp16", 1),
    ("llama-3.1-70b", "tp16", 64),
    ("llama-3.1-405b", "tp16", 1),
    ("llama-3.1-405b", "tp16", 16),
)
PROMPT, GEN = 8192, 256


def main() -> None:
    cluster = load_cluster("sn40l-16")
    for figure, label in (("link_bandwidth_bytes_per_s", "P2P link bandwidth"),
                          ("link_latency_s", "P2P per-hop latency")):
        header = ["model", "plan", "batch", *(f"{f:g}x" for f in FACTORS), "comm share @1x",
                  *(f"TTFT ms {f:g}x" for f in FACTORS)]
        body = []
        for model, plan, batch in CASES:
            rows = link_sensitivity(Scenario(load_model(model), cluster, Plan.parse(plan),
                                             batch, PROMPT, GEN), figures=(figure,))
            one = next(r for r in rows if r.factor == 1.0)
            body.append([model, plan, batch,
                         *(f"{r.tokens_per_s_per_request:,.1f}" for r in rows),
                         f"{one.communication_share:.1%}",
                         *(f"{r.ttft_s * 1e3:,.0f}" for r in rows)])
        title = f"tokens/s per request and time to first token vs {label} (sn40l-16, context {PROMPT}, gen {GEN})"
        print(title)
        print(text_table(header, body))
        print()
    names = ["sn40l-16", "sn40l-16-switch", "sn40l-16-torus", "sn40l-16-ring"]
    header = ["model", "plan", "batch", *names]
    body = []
    for model, plan, batch in CASES:
        spec = load_model(model)
        speeds = [evaluate_plan(Scenario(spec, load_cluster(n), Plan.parse(plan), batch, PROMPT,
                                         GEN), prefill=False).tokens_per_s_per_request
                  for n in names]
        body.append([model, plan, batch, *(f"{s:,.1f}" for s in speeds)])
    print("tokens/s per request by P2P wiring (what-if; same per-link figures)")
    print(text_table(header, body))


if __name__ == "__main__":
    main()
