"""One set of tables from a pair's two: each request's row from both pools (the prefill pool's
queue and admission, the decode pool's tokens and times, from the original arrival), the
decode pool's replicas, sockets and links numbered after the prefill pool's, and one summary
(energy and cost of both, the KV hand-overs, the prefix cache where prompts are prefilled)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rdu_cluster.engine import bench, energy, metrics, summary
from rdu_cluster.engine.requests import DONE, UNSERVED
from rdu_cluster.engine.simulation import Tables

if TYPE_CHECKING:
    from rdu_cluster.engine.disagg.disaggregated import Disaggregated


def combine(run: Disaggregated, p: Tables, d: Tables, idx, move, nbytes) -> Tables:
    pre, dec = run.sims
    n_rep = len(pre.replicas)
    # a disaggregated run is not streamed (no sink): each pool has its requests table
    req = _requests(cast(pa.Table, p.requests).to_pydict(),
                    cast(pa.Table, d.requests).to_pydict(), idx, move, nbytes, n_rep)
    meta = dict(dec.metadata(), cluster=f"{run.clusters[0].name}+{run.clusters[1].name}",
                plan=f"prefill {run.prefill}, decode {run.decode}, fabric "
                f"{run.fabric.name}", prefill_replicas=n_rep)
    steps = (None if p.steps is None  # summary_only: no steps table
             else pa.concat_tables([p.steps, _shift(d.steps, {"replica": n_rep})]))
    sockets = pa.concat_tables([p.sockets, _shift(d.sockets, {
        "replica": n_rep, "socket": run.clusters[0].sockets,
        "node": run.clusters[0].nodes})])
    links = pa.concat_tables([p.links, _shift(d.links, {
        "src": run.clusters[0].sockets, "dst": run.clusters[0].sockets})])
    return Tables(
        requests=metrics.table(metrics.REQUESTS, req, meta),
        steps=None if steps is None else steps.replace_schema_metadata(_meta(steps, meta)),
        sockets=sockets.replace_schema_metadata(_meta(sockets, meta)),
        links=links.replace_schema_metadata(_meta(links, meta)),
        summary=_summary(run, req, p, d, idx))

def _summary(run: Disaggregated, req: dict, p: Tables, d: Tables, idx) -> dict:
    dec = run.sims[1]
    end = max(p.summary["makespan_s"], d.summary["makespan_s"])
    out = dict(d.summary)
    served = [i for i, s in enumerate(req["state"]) if s == DONE]
    tokens = int(sum(req["generated_tokens"][i] for i in served))
    parts = [energy.summary(s.rates, s.rec.step_totals(), c.sockets, end, tokens)
             for s, c in zip(run.sims, run.clusters)]
    total = {k: _sum(q[k] for q in parts) for k in ("energy_j", "cost_usd")}
    moves = [req["kv_transfer_s"][i] for i in served]
    out.update({
        "requests": len(req["state"]), "served": len(served),
        "unserved": sum(1 for s in req["state"] if s == UNSERVED),
        "makespan_s": end, "output_tokens": tokens,
        "tokens_per_s": tokens / end if end > 0 else 0.0,
        "ttft_s": metrics.percentiles([req["ttft_s"][i] for i in served]),
        "tpot_s": metrics.percentiles([req["tpot_s"][i] for i in served]),
        "steps": p.summary["steps"] + d.summary["steps"],
        "decode_steps": p.summary["decode_steps"] + d.summary["decode_steps"],
        "windows": p.summary["windows"] + d.summary["windows"],
        "preemptions": int(sum(req["preemptions"])), "swaps": int(sum(req["swaps"])),
        "energy_j": total["energy_j"], "cost_usd": total["cost_usd"],
        "power_w": energy.ratio(total["energy_j"], end),
        "joules_per_token": energy.ratio(total["energy_j"], tokens),
        "cost_per_million_tokens_usd": energy.ratio(
            None if total["cost_usd"] is None else total["cost_usd"] * 1e6, tokens),
        "overloaded": p.summary["overloaded"] or d.summary["overloaded"],
        "kv_transfer_ms": metrics.percentiles([m * 1e3 for m in moves]),
        "kv_transfer_bytes_mean": float(np.mean([req["kv_transfer_bytes"][i]
                                                 for i in served])) if served else 0.0,
        "pools": {"prefill": str(run.prefill), "decode": str(run.decode),
                  "fabric": run.fabric.name,
                  "sockets": [c.sockets for c in run.clusters]},
    })
    out.update({k: p.summary[k] for k in PREFIX_KEYS})  # prompts are cached where prefilled
    m = summary.measured(dec, _decode_rows(req, idx))
    out["bench"] = bench.summary(m, end, run.config.metrics)
    return out


PREFIX_KEYS = ("prefix_cache", "prefix_cache_hit_rate", "prefix_cache_hit_rate_by_tier",
               "prefix_copy_s")  # engine/prefix_cache/cache.summary


def _requests(p: dict, d: dict, idx, move, nbytes, n_rep: int) -> dict:
    """Each request's row: the prefill pool's queue and admission, the decode pool's tokens
    and times, measured from the original arrival; energy and cost of both."""
    out = {k: list(v) for k, v in p.items()}
    out["prefill_replica"] = list(p["replica"])
    out["kv_transfer_s"] = [0.0] * len(p["state"])
    out["kv_transfer_bytes"] = [0.0] * len(p["state"])
    out["generated_tokens"] = [0] * len(p["state"])
    for j, i in enumerate(idx.tolist()):
        arrival = p["arrival_s"][i]
        for k in ("state", "output_len", "generated_tokens", "reason", "finish_s", "tpot_s"):
            out[k][i] = d[k][j]
        out["replica"][i] = d["replica"][j] + n_rep
        out["kv_transfer_s"][i], out["kv_transfer_bytes"][i] = float(move[j]), float(nbytes[j])
        shift = d["arrival_s"][j] - arrival  # prefill + transfer, before the decode pool
        # a request the prefill pool refused never queued there (null, as a pool's own row)
        out["queue_s"][i] = (None if p["queue_s"][i] is None
                             else p["queue_s"][i] + (d["queue_s"][j] or 0.0))
        out["ttft_s"][i] = None if d["ttft_s"][j] is None else d["ttft_s"][j] + shift
        out["e2e_s"][i] = None if d["e2e_s"][j] is None else d["e2e_s"][j] + shift
        for k in ("preemptions", "swaps"):
            out[k][i] = p[k][i] + d[k][j]
        for k in ("energy_j", "cost_usd"):
            out[k][i] = _sum((p[k][i], d[k][j]))
    return out


def _decode_rows(req: dict, idx) -> dict:
    """The combined columns summary.measured reads, in the decode simulation's request
    order."""
    order = idx.tolist()
    return {k: [req[k][i] for i in order] for k in summary.MEASURED}


def _sum(values) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else float(sum(values))


def _shift(tbl: pa.Table, by: dict[str, int]) -> pa.Table:
    for name, k in by.items():
        i = tbl.schema.get_field_index(name)
        tbl = tbl.set_column(i, tbl.schema.field(i), pc.add(tbl.column(i), k))
    return tbl


def _meta(tbl: pa.Table, meta: dict) -> dict:
    out = dict(tbl.schema.metadata or {})
    out.update({f"rdu_cluster.{k}".encode(): str(v).encode() for k, v in meta.items()})
    return out
