"""Production speeds on SN40L against the batch they were served at: the reference set's
production rows (seed 002, DAC 2025) and the dense endpoint rows, simulated at batch 1..16 with
the default calibration profile. The MoE rows' batch-1 reading is in doubt: under production
load a sequence shares its step with others, and an MoE's per-request speed falls with the batch
(each sequence routes to its own experts, so the distinct experts streamed per step grow) while
a dense model's barely moves. The table shows, per row, the measured speed, the simulated one
at each batch, and the smallest batch at which the simulation is no faster than the measurement.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/production_batch.py
"""

from __future__ import annotations

from rdu_cluster.output.report import text_table
from rdu_cluster.validation import calibration, published

ROWS = (  # the production MoE rows, then dense endpoint rows for contrast
    "seed002-gpt-oss-120b-tokens",
    "seed002-minimax-m2.7-tokens",
    "dac25-sn40l16-deepseek-r1-tokens",
    "sn40l16-llama8b-tokens",
    "argonne-sn40l8-llama-3.1-8b-1024",
    "argonne-sn40l8-llama-3.1-70b-1024",
)
BATCHES = (1, 2, 4, 8, 16)


def main() -> None:
    cases = {c["id"]: c for c in published.load_cases()}
    body = []
    with calibration.use(calibration.load("default")):
        for rid in ROWS:
            case = cases[rid]
            metric = published.METRICS[case["metric"]]
            speeds = [metric({**case, "batch": b}) for b in BATCHES]
            slower = [b for b, s in zip(BATCHES, speeds, strict=True) if s <= case["value"]]
            body.append([rid, case["model"], case["cluster"], f"{case['value']:,.0f}",
                         *(f"{s:,.0f}" for s in speeds),
                         f"{speeds[-2] / speeds[0] - 1:+.0%}",
                         str(slower[0]) if slower else f">{BATCHES[-1]}"])
    header = ["row", "model", "cluster", "measured", *(f"b{b}" for b in BATCHES),
              "b8 vs b1", "batch reaching it"]
    print(text_table(header, body))


if __name__ == "__main__":
    main()
