"""A serving run's results: its four tables (requests, steps, sockets, links) with the run's
metadata, and its summary (vLLM bench's statistics, energy and cost, the prefix cache's
hits), from what the run recorded (engine/metrics.py, engine/finished.py)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rdu_cluster.engine import bench, energy, metrics, prefix_cache
from rdu_cluster.engine.requests import DONE, UNSERVED

if TYPE_CHECKING:
    from rdu_cluster.engine.simulation import ServeConfig, Simulation


@dataclass
class Tables:
    requests: object
    steps: object
    sockets: object
    links: object
    summary: dict


def tables(sim: Simulation, end: float) -> Tables:
    meta = metadata(sim)
    req_tbl = sim.finished.close(meta)
    req_cols = sim.finished.summary_columns()
    link_cols = _link_columns(sim, end)
    steps_tbl = sockets_tbl = None
    if sim.rec.sink is None:
        steps = metrics.steps_columns(sim.rec)
        if not sim.summary_only:  # else only the summary's columns are kept: no table
            steps_tbl = metrics.table(metrics.STEPS, steps, meta)
        sockets_tbl = metrics.table(metrics.SOCKETS, metrics.sockets_columns(sim.rec), meta)
        totals = metrics.step_totals(steps)
    else:  # the rest of the rows go to the sink; the summary reads the steps' totals
        sim.rec.finish()
        totals = sim.rec.step_totals()
    return Tables(
        requests=req_tbl,
        steps=steps_tbl, sockets=sockets_tbl,
        links=metrics.table(metrics.LINKS, link_cols, meta),
        summary=summary(sim, req_cols, totals, end),
    )


def _link_columns(sim: Simulation, end: float) -> dict:
    top = sim.cluster.topology
    bw = top.link_bandwidth_bytes_per_s * (top.links_per_pair if top.kind == "full_mesh"
                                           else 1)
    sim.recorder.flush_links()
    links = sorted(sim.rec.link_bytes)
    nbytes = [sim.rec.link_bytes[k] for k in links]
    return {"src": [a for a, _ in links], "dst": [b for _, b in links], "bytes": nbytes,
            "bandwidth_bytes_per_s": [bw] * len(links),
            "utilization": [b / (bw * end) if end > 0 else 0.0 for b in nbytes]}


def metadata(sim: Simulation) -> dict:
    c = sim.config
    desc = repr((sim.model.name, sim.cluster.name, sim.plan, c.scheduler, c.limits,
                 c.seed, c.kv_memory_fraction, c.block_tokens, c.execution_model, c.faults,
                 sim.trace.source, len(sim.trace), c.speculation, c.draft, c.coe,
                 c.draft_placement, c.draft_sockets, c.routing, c.concurrency,
                 c.prefix))
    return {"model": sim.model.name, "cluster": sim.cluster.name,
            "plan": sim.build.partition_plan().name,
            "scheduler": c.scheduler, "seed": c.seed, "trace": sim.trace.source,
            "config_hash": hashlib.sha256(desc.encode()).hexdigest()[:16]}


def summary(sim: Simulation, req: dict[str, np.ndarray], steps: dict, end: float) -> dict:
    """The run's figures from the requests' summary columns (Finished.summary_columns:
    NaN for null) and the steps' totals (metrics.step_totals)."""
    served = req["state"] == DONE
    ttft = metrics.percentiles(req["ttft_s"][served])
    tpot = req["tpot_s"][served]
    tpot = metrics.percentiles(tpot[~np.isnan(tpot)])  # null: a one-token output
    tokens = int(np.sum(req["generated_tokens"][served]))
    return {
        "requests": len(sim.trace), "served": int(np.sum(served)),
        "unserved": int(np.sum(req["state"] == UNSERVED)),
        "makespan_s": end, "output_tokens": tokens,
        "tokens_per_s": tokens / end if end > 0 else 0.0,
        "ttft_s": ttft, "tpot_s": tpot,
        "steps": steps["steps"], "decode_steps": steps["decode_steps"],
        "windows": sim.windows,
        "preemptions": int(np.sum(req["preemptions"])),  # recompute preemptions
        "swaps": sim.finished.swaps,  # swap preemptions (--preemption swap)
        "switches": len(sim.rec.switch_s),
        "switch_waited": int(np.count_nonzero(req["switch_wait_s"])),
        "switch_s": float(sum(sim.rec.switch_s.values())),
        "tokens_per_decode": _tokens_per_decode(steps),
        "speculation": _describe(sim.config),
        **energy.summary(sim.rates, steps, sim.cluster.sockets, end, tokens),
        "bench": bench.summary(measured(sim, req), end, sim.config.metrics),
        "overloaded": _overloaded(sim, req, end),
        **prefix_cache.summary(sim.finished.admitted, sim.finished.prefix_tokens,
                               sim.finished.prefix_copy_s, sim.build.prefix_mode,
                               sim.build.lower_tier()),
    }


MEASURED = ("state", "arrival_s", "ttft_s", "e2e_s", "generated_tokens", "prompt_len")


def measured(sim: Simulation, req: dict) -> bench.Measured:
    """The completed requests' client-side times (engine/bench.py): `req`'s columns (MEASURED:
    this run's, or a disaggregated run's in this run's request order) and the chunk times
    and ITLs recorded as they completed (in request order)."""
    done = np.asarray(req["state"]) == DONE  # a mask: no Python object per request
    col = lambda name: np.asarray(req[name])[done].astype(float)
    return bench.Measured(
        send_s=col("arrival_s"), ttft_s=col("ttft_s"), e2el_s=col("e2e_s"),
        output_len=col("generated_tokens").astype(np.int64),
        prompt_len=col("prompt_len").astype(np.int64),
        itl_s=sim.finished.itl_s, chunk_s=sim.finished.chunk_s,
        chunks=np.frombuffer(sim.finished.chunks, dtype=np.int64))


def _overloaded(sim: Simulation, req: dict, end: float) -> bool:
    if sim.config.concurrency is not None or sim.trace.after is not None:
        return False  # closed loop (clients, sessions): they bound the queue
    arrival = req["arrival_s"]
    admit = np.where(np.isnan(req["queue_s"]), math.inf, arrival + req["queue_s"])
    return bench.overloaded(arrival, admit)


def _describe(config: ServeConfig) -> str:
    """The speculation of the run, for the summary ("" without one)."""
    spec = config.speculation
    if spec is None:
        return ""
    shape = (f"tree {','.join(map(str, spec.branching))}" if spec.branching else f"k={spec.k}")
    where = ("on the target's sockets" if config.draft_placement == "shared"
             else f"on {config.draft_sockets} sockets of its own")
    return f"draft {config.draft} {where}, {shape}, acceptance {spec.acceptance.describe()}"


def _tokens_per_decode(steps: dict) -> float:
    """Mean tokens a sequence's decode step emits (1 without speculation)."""
    decodes = float(steps["decode_tokens"])
    return float(steps["emitted_tokens"]) / decodes if decodes else float("nan")
