"""Wall time of `rdu-cluster calibrate` (the fit) and `rdu-cluster validate` (every row plus the
leave-one-out refits), each in-process, as the CLI runs them. Prints seconds for both."""

from __future__ import annotations

import time

from rdu_cluster.validation import calibration, fit, report
from rdu_cluster.validation import published as v


def main() -> None:
    rows = v.load_cases()
    t = time.perf_counter()
    with calibration.use(None):
        fit.fit(rows)
    t_cal = time.perf_counter() - t
    t = time.perf_counter()
    with calibration.use(calibration.load("default")):
        rep = report.build(rows)
    t_val = time.perf_counter() - t
    print(f"calibrate: {t_cal:.1f} s ({sum(r['role'] == 'calibrate' for r in rows)} rows)")
    print(f"validate:  {t_val:.1f} s ({len(rows)} rows, {len(rep.loo)} leave-one-out refits)")


if __name__ == "__main__":
    main()
