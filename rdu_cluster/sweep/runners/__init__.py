"""Built-in sweep runners, a kind a module, each a `register` call (rdu_cluster.sweep.registry):
importing this package registers them all. `simulate` (simulate.py): the plan evaluator
(partitioning.evaluate, through partitioning.estimate) of decode and prefill, one row per point,
with points that differ only in batch / prompt / generation length costed by one vectorized
call. `plan` (plan.py): the best plan of a plan search per point. `serve` (serve.py): one
serving simulation (the engine's Simulation on its local backend) per point, its summary a row.
In every kind a point that does not fit (or cannot run) is a row with feasible = false and the
reason, and is listed in the manifest as well. What more than one kind uses is common.py (the
fields the kinds pick from, the cached cluster, model and profile loaders, the options, the
check of clusters and models); a new kind is one module beside these, imported here.

Nested fields (common.py): `options.<toggle>` (DataflowOptions on RDU clusters, GpuOptions on
GPU clusters; a toggle of the other chip kind is ignored there), `chip.<path>`,
`topology.<path>` and `cost.<path>` (overrides of the cluster config, e.g.
chip.tiers.hbm.bandwidth_bytes_per_s, the same paths as `--set`: rdu_cluster.config),
`sockets`, `sockets_per_node`.
"""

from rdu_cluster.sweep.runners import plan, serve, simulate
from rdu_cluster.sweep.runners.common import cached_cluster, cluster_overrides
from rdu_cluster.sweep.runners.plan import PLAN, run_plan
from rdu_cluster.sweep.runners.serve import SERVE, SERVE_SCHEMA, check_serve, run_serve
from rdu_cluster.sweep.runners.simulate import SIMULATE, run_simulate

__all__ = [
    "PLAN", "SERVE", "SERVE_SCHEMA", "SIMULATE", "cached_cluster", "check_serve",
    "cluster_overrides", "plan", "run_plan", "run_serve", "run_simulate", "serve", "simulate",
]
