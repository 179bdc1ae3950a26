"""Speculative decoding on a cluster: a composition on top of `estimate`, costed op by op.

A step is k draft steps (each a real forward pass of the draft through the chip's execution
model) plus one target verification of k+1 tokens (StepShape("decode", batch, k+1, context)), plus,
when draft and target sit on separate sockets, the two hops that carry the drafts over and the
verdict back. The expected tokens a step emits come from the acceptance model
(workloads/speculative.py). Nothing here is tuned: the acceptance rate is an input with a stated
basis (DEFAULT_ACCEPTANCE), and k, when not given, is the one that makes the step fastest per
token on the hardware at hand (`best_k`), which is what a deployment would pick.

Drafts:
- a catalog model (or config.json path) with the target's tokenizer;
- "mtp": the target's own multi-token-prediction module(s) (DeepSeek-V3: one), reused
  autoregressively for k > mtp_layers as SGLang and vLLM do. Its graph is one decoder layer like
  the model's last plus the 2h -> h projection (eh_proj) and the shared embedding / LM head.

Placement: "shared" puts the draft on the target's sockets (its weights and KV cache take HBM
there; it runs tensor-parallel over the divisor of the target's tp that makes it fastest, the
other sockets waiting); "separate" puts it on `draft_sockets` more sockets of the same chip.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from chip import execution
from chip.cost import CAUSES, StepCost
from partitioning.cluster import ClusterSpec
from partitioning.estimate import Estimate, estimate, tp_comm_time
from partitioning.footprint import PlanDoesNotFit, fit_message, kv_cache_per_socket
from partitioning.plan import Plan
from partitioning.scenario import Scenario, tensor_plan
from rdu_cluster.config import load_cluster
from rdu_cluster.engine.plan import PlanSpec, check_draft_sockets
from rdu_cluster.output import results
from rdu_cluster.output.report import stacks_text, text_table
from rdu_cluster.scenarios import economics
from workloads import graph as graphs
from workloads.catalog import load_model
from workloads.checks import show
from workloads.errors import ConfigError
from workloads.ops import Block, Op, OpClass, Shard, StepShape, Work
from workloads.spec import ModelSpec, check_context
from workloads.speculative import (
    PROFILES,
    Acceptance,
    ConstantAcceptance,
    PositionalAcceptance,
    Speculation,
    parse_acceptance,
    parse_tree,
)

PLACEMENTS = ("shared", "separate")

# Conditional per-token acceptance rates with their basis. None of these was measured on SN40L or
# with the exact pairs; each is the nearest public figure, stated. `--acceptance` overrides.
_LLAMA_8B_70B = (
    0.88,
    ("devquasar.com 'Speculative decoding tradeoffs' (llama.cpp, greedy): Llama 3 8B drafting "
    "Llama 3 70B accepts 58.68% of 8 drafted tokens; the constant rate giving that is 0.88"),
)
_LLAMA_1B = (
    0.75,
    ("gigagpu.com vLLM speculative decoding guide: Llama 3.2 1B drafting Llama 3 70B accepts "
    "70-80% on factual Q&A (40-50% on creative text); midpoint of the factual range"),
)
_DEFAULT = (
    0.8,
    ("ggml-org/llama.cpp PR #24536: a Llama-family EAGLE-3 draft, cumulative per-position "
    "0.805, 0.632, 0.483 (conditional 0.80, 0.79, 0.76)"),
)
DEFAULT_ACCEPTANCE: dict[tuple[str, str], tuple[float, str] | str] = {
    ("llama-3.1-8b", "llama-3.1-70b"): _LLAMA_8B_70B,
    ("llama-3.1-8b", "llama-3.1-405b"): (
        _LLAMA_8B_70B[0],
        "assumption: the 70B pair's rate (no public measurement of 8B drafting 405B)",
    ),
    ("llama-3.2-1b", "llama-3.1-70b"): _LLAMA_1B,
    ("llama-3.2-1b", "llama-3.1-405b"): _LLAMA_1B,
    ("llama-3.2-3b", "llama-3.1-70b"): _LLAMA_1B,
    ("llama-3.2-3b", "llama-3.1-405b"): _LLAMA_1B,
    # a measured per-position profile (workloads/speculative.py PROFILES): acceptance falls
    # with the position the one MTP module drafts
    ("mtp", "deepseek-v3"): "deepseek-mtp",
}


def default_acceptance(draft: str, target: str) -> Acceptance:
    """The pair's published basis: a named per-position profile, or a constant rate (the same
    at every position) where only one figure is published."""
    basis = DEFAULT_ACCEPTANCE.get((draft, target), _DEFAULT)
    if isinstance(basis, str):
        return PROFILES[basis]
    rate, source = basis
    return ConstantAcceptance(rate, source)


@dataclass(frozen=True)
class SpecEstimate:
    base: Estimate  # the target alone: plain decode, prefill, fit
    speculation: Speculation
    draft: str
    draft_tp: int
    placement: str
    draft_sockets: int  # sockets beyond the target's (0 when shared)
    draft_steps: tuple[StepCost, ...]
    verify: StepCost
    transfer_s: Work
    draft_prefill: StepCost | None = None  # the draft's pass over the prompt
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def draft_s(self) -> Work:
        return sum((c.time_s for c in self.draft_steps), 0.0)

    @property
    def step_time_s(self) -> Work:
        return self.draft_s + self.verify.time_s + self.transfer_s

    @property
    def tokens_per_step(self) -> Work:
        """Over a request of gen_len tokens (its first from the prefill): a step emits no more
        than the output has left (Speculation.tokens_per_step_over)."""
        g = np.asarray(self.base.gen_len, dtype=float) - 1.0
        if g.ndim == 0:
            return self.speculation.tokens_per_step_over(float(g))
        return np.vectorize(self.speculation.tokens_per_step_over, otypes=[float])(g)

    @property
    def tpot_s(self) -> Work:
        return self.step_time_s / self.tokens_per_step

    @property
    def tokens_per_s_per_request(self) -> Work:
        return self.tokens_per_step / self.step_time_s

    @property
    def tokens_per_s_total(self) -> Work:
        return self.base.replicas * self.base.batch * self.tokens_per_s_per_request

    @property
    def speedup(self) -> Work:
        """Over plain decode of the same target on the same sockets."""
        return self.base.tpot_s / self.tpot_s

    @property
    def sockets_per_replica(self) -> int:
        return self.base.tp + self.draft_sockets

    @property
    def ttft_s(self) -> Work:
        """The prompt's prefill with the draft's, as the serving engine runs them: a shared
        draft prefills after the target on its sockets (chip/cost_tables.py _extra_rows), a separate
        one beside it on its own, the slower holding the step (simulation._draft_then_verify)."""
        return self.prefill_cause(None)

    def prefill_cause(self, name: str | None) -> Work:
        """The prefill's seconds of one cause (None: in all), combined as ttft_s says."""
        t, d = self.base.prefill, self.draft_prefill
        of = lambda c: c.time_s if name is None else c.cause(name)
        if d is None:
            return of(t)
        if self.placement == "shared":
            return of(t) + of(d)
        return np.where(np.asarray(t.time_s) >= np.asarray(d.time_s), of(t), of(d))


def resolve_draft(draft: str, target: ModelSpec) -> ModelSpec:
    """The draft's ModelSpec: a catalog model / path, or "mtp" for the target's own module."""
    if draft == "mtp":
        if not target.mtp_layers:
            raise ConfigError(
                f"draft: {target.name} has no multi-token-prediction module; give a draft model"
            )
        layer = target.layers[-1]
        return replace(target, name=f"{target.name}-mtp", layers=(layer,), mtp_layers=0)
    spec = load_model(draft).with_precision(target.precision)
    if spec.vocab_size != target.vocab_size:
        raise ConfigError(
            f"draft: {spec.name} has a vocabulary of {spec.vocab_size}, {target.name} of "
            f"{target.vocab_size}; a draft must share the target's tokenizer"
        )
    return spec


def check_draft(draft: str, target: ModelSpec, prompt_len: int, output_len: int) -> ModelSpec:
    """The draft (resolve_draft: the target's tokenizer) holding the longest request in its
    context: it processes the same sequence as the target."""
    spec = resolve_draft(draft, target)
    check_context(spec, prompt_len, output_len, "--draft")
    return spec


def check_sockets(placement: str, draft_sockets: int, cluster: ClusterSpec | None = None,
                  plan: Plan | None = None) -> None:
    """The draft's own sockets: none when shared (--draft-sockets would have no effect); when
    separate, beside a replica of the target's plan (default: tp over the cluster) on the
    cluster, as serve lays them out; each of a plan's dp replicas with a draft of its own."""
    if placement == "shared":
        if draft_sockets != 1:
            raise ConfigError("--draft-sockets: only with --draft-placement separate (a shared "
                              "draft runs on the target's sockets)")
    elif cluster is not None:
        p = plan or Plan(tp=cluster.sockets)
        group = check_draft_sockets(cluster, PlanSpec(p.tp * p.ep, p.ep, p.pp), draft_sockets)
        if p.dp * group > cluster.sockets:
            raise ConfigError(
                f"--draft-sockets: {draft_sockets}: the {p.dp} replicas of plan {p.name}, "
                f"{group} sockets each with their drafts, exceed the {cluster.sockets} sockets "
                f"of {cluster.name}")


def _replica_plan(cluster: ClusterSpec, plan: Plan | None, tp: int | None, placement: str,
                  draft_sockets: int) -> Plan:
    """simulate's target plan on `cluster`, its draft's sockets checked: `--tp N` with a
    separate draft is tpN replicated over as many (N + draft sockets) groups as the cluster
    holds, as serve lays them out (tp alone would replicate over sockets the drafts take)."""
    if plan is None and tp and placement == "separate":
        plan = Plan(tp=tp, dp=max(1, cluster.sockets // (tp + draft_sockets)))
    check_sockets(placement, draft_sockets, cluster, plan or (Plan(tp=tp) if tp else None))
    return plan or tensor_plan(cluster, tp)


def _tensor_only(text: str) -> Plan:
    """`--plan` with a draft: tp and dp degrees only (a speculative step is costed tensor
    parallel: the draft and the verification over the replica's tp sockets)."""
    p = Plan.parse(text)
    if p.pp > 1 or p.ep > 1 or p.adp > 1 or p.mixer_tp or p.micro_batches:
        raise ConfigError(f"--plan: {show(text)}: with --draft, tp and dp degrees only (the "
                          "speculative step is costed tensor parallel)")
    return p


def speculative_estimate(
    scenario: Scenario,
    speculation: Speculation,
    draft: str,
    *,
    placement: str = "shared",
    draft_sockets: int = 1,
    draft_tp: int | None = None,
    execution_model: str | None = None,
    memo: dict | None = None,
) -> SpecEstimate:
    """The scenario's target (its plan: tensor parallel, replicated) decoding with `draft`.
    `memo`: draft-step costs shared between calls on the same target, cluster and options
    (best_k's k values repeat each other's first draft steps)."""
    if placement not in PLACEMENTS:
        raise ConfigError(f"placement: {placement!r} unknown; accepted: {', '.join(PLACEMENTS)}")
    base = estimate(scenario, execution_model=execution_model)
    target, cluster = scenario.spec, scenario.cluster
    spec_d = resolve_draft(draft, target)
    ctx = base.prompt_len + (base.gen_len - 1.0) / 2.0
    cost = _coster(cluster, scenario.options, execution_model)
    verify_shape = StepShape("decode", base.batch, float(speculation.verify_tokens()), ctx)
    verify = cost(graphs.step_graph(target, verify_shape, Shard.tensor(base.tp)), base.tp)
    if placement == "shared":
        candidates = [draft_tp] if draft_tp else (
            [base.tp] if draft == "mtp" else _divisors(base.tp))
        extra_sockets, hops = 0, 0
    else:
        candidates, extra_sockets, hops = [draft_tp or draft_sockets], draft_sockets, 2
    _check_draft_tp(candidates, base.tp if placement == "shared" else draft_sockets)
    runs = [(_draft_steps(spec_d, draft, target, speculation, base, t, cost, memo), t)
            for t in candidates]
    steps, d_tp = min(runs, key=lambda r: float(np.max(sum(c.time_s for c in r[0]))))
    _check_fit(target, spec_d, draft, cluster, base, d_tp, placement)
    return SpecEstimate(
        base=base,
        speculation=speculation,
        draft=draft,
        draft_tp=d_tp,
        placement=placement,
        draft_sockets=extra_sockets,
        draft_steps=steps,
        verify=verify,
        transfer_s=hops * cluster.topology.link_latency_s,
        # the engine's prefill: a shared draft over the target's sockets (compute bound, it
        # takes them all, whatever tp its decode steps run at), a separate one over its own
        draft_prefill=_draft_prefill(spec_d, draft, target, base,
                                     base.tp if placement == "shared" else d_tp, cost, memo),
    )


def best_k(
    scenario: Scenario,
    acceptance: Acceptance,
    draft: str,
    ks: range = range(1, 13),
    branching: tuple[int, ...] | None = None,
    **kwargs: Any,
) -> SpecEstimate:
    """The k (of `ks`) with the most tokens per second per request, on this hardware
    (`kwargs`: speculative_estimate's)."""
    best = None
    memo: dict = {}
    limit = len(acceptance.values) if isinstance(acceptance, PositionalAcceptance) else None
    for k in ks:
        if limit is not None and k > limit:
            break
        spec = Speculation(k, acceptance, branching[:k] if branching else None)
        est = speculative_estimate(scenario, spec, draft, memo=memo, **kwargs)
        if best is None or _f(est.tokens_per_s_per_request) > _f(best.tokens_per_s_per_request):
            best = est
    if best is None:
        raise ConfigError("spec-k: no k of the range is valid for this acceptance model")
    return best


def _coster(cluster: ClusterSpec, options: Any, model: str | None) -> Callable:
    def cost(graph, tp: int) -> StepCost:
        return execution.step_cost(graph, cluster.chip, tp_comm_time(cluster, tp), options, model)

    return cost


def _draft_steps(spec_d, draft, target, speculation, base, tp, cost, memo=None) -> tuple:
    out = []
    ctx = base.prompt_len + (base.gen_len - 1.0) / 2.0  # decode's mean context (evaluate.py)
    scalar = np.ndim(ctx) == 0 and np.ndim(base.batch) == 0
    for d, width in enumerate(speculation.frontier()):
        key = (draft, float(width), float(ctx + d), float(base.batch), tp) if scalar else None
        if memo is not None and key in memo:
            out.append(memo[key])
            continue
        shape = StepShape("decode", base.batch, float(width), ctx + d)
        g = graphs.step_graph(spec_d, shape, Shard.tensor(tp))
        if draft == "mtp":
            g = _with_mtp_projection(g, target, shape, tp)
        out.append(cost(g, tp))
        if memo is not None and key is not None:
            memo[key] = out[-1]
    return tuple(out)


def _draft_prefill(spec_d, draft, target, base, tp, cost, memo=None) -> StepCost:
    """The draft's pass over the prompts, tensor parallel over `tp` sockets."""
    scalar = np.ndim(base.batch) == 0 and np.ndim(base.prompt_len) == 0
    key = ("prefill", draft, float(base.batch), float(base.prompt_len), tp) if scalar else None
    if memo is not None and key in memo:
        return memo[key]
    shape = StepShape.prefill(base.batch, base.prompt_len)
    g = graphs.step_graph(spec_d, shape, Shard.tensor(tp))
    if draft == "mtp":
        g = _with_mtp_projection(g, target, shape, tp)
    out = cost(g, tp)
    if memo is not None and key is not None:
        memo[key] = out
    return out


def _with_mtp_projection(g, target: ModelSpec, shape: StepShape, tp: int):
    """DeepSeek-V3's MTP module concatenates the normed embedding and hidden state (2h) and
    projects them to h (eh_proj) before its decoder layer; split like a dense MLP matrix."""
    h, wb = target.hidden_size, target.precision.weights.bytes
    ab = target.precision.activations.bytes
    rows = np.asarray(shape.batch, dtype=float) * shape.new_tokens
    op = Op(
        "mtp_eh_proj",
        OpClass.MATMUL,
        flops=2.0 * rows * 2 * h * h / tp,
        weight_bytes=2.0 * h * h * wb / tp,
        act_in_bytes=rows * 2 * h * ab,
        act_out_bytes=rows * h * ab / tp,
    )
    blocks = (g.blocks[0], Block("mtp_projection", (op,)), *g.blocks[1:])
    return g.with_blocks(blocks)


def _check_draft_tp(candidates: list[int], sockets: int) -> None:
    for t in candidates:
        if t < 1 or sockets % t:
            raise ConfigError(f"draft-tp: {t} does not divide the draft's {sockets} sockets")


def _check_fit(target, spec_d, draft, cluster, base, d_tp, placement) -> None:
    """The target's footprint (base: the one footprint check passed) plus the draft's
    weights and KV cache on each of its sockets (its KV sharded as the graph shards it, heads
    replicated where d_tp exceeds them), against HBM, in the footprint check's words."""
    hbm = cluster.chip.hbm.capacity_bytes
    total = base.prompt_len + base.gen_len
    d_w = (graphs.weight_bytes(target, include_mtp=True) - base.weight_bytes if draft == "mtp"
           else graphs.weight_bytes(spec_d))
    d_kv = kv_cache_per_socket(spec_d, d_tp, base.batch, total)
    draft_per_socket = d_w / d_tp + d_kv
    used = (base.hbm_used_bytes + draft_per_socket) if placement == "shared" else draft_per_socket
    worst = float(np.max(used))
    if worst > hbm:
        where = "with the target" if placement == "shared" else "on its own sockets"
        raise PlanDoesNotFit(fit_message(Plan.parse(base.plan), f"{target.name} + draft {draft} "
                                         f"({where})", cluster.name, "hbm", 0, worst, hbm))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _f(x) -> float:
    return float(np.ravel(np.asarray(x, dtype=float))[0])


# ---- validation metrics (rdu_cluster/validation/published.py registers them) ----


def case_estimate(case: dict[str, Any], cluster_key: str = "cluster") -> SpecEstimate:
    """A validation case's speculative run: `model` (target), `draft`, `acceptance` (a rate;
    default: DEFAULT_ACCEPTANCE for the pair), `spec_k` (default: best_k over 1..16)."""
    target = load_model(case["model"])
    draft = case["draft"]
    acc = case.get("acceptance")
    acceptance = default_acceptance(draft, target.name) if acc is None else ConstantAcceptance(acc)
    stack_name = case.get("stack" if cluster_key == "cluster" else "baseline_stack")
    options = None
    if stack_name:  # a GPU serving-stack profile (chip/serving_stacks.py)
        from chip.serving_stacks import stack

        options = stack(stack_name)
    # plan None: tp over every socket (Scenario.__post_init__; its field is typed as after)
    scenario = Scenario(target, load_cluster(case[cluster_key]),
                        None,  # type: ignore[arg-type]
                        case.get("batch", 1), case.get("prompt_len", 1024),
                        case.get("gen_len", 128), options)
    placement = case.get("placement", "shared")
    if "spec_k" in case:
        return speculative_estimate(scenario, Speculation(case["spec_k"], acceptance), draft,
                                    placement=placement)
    return best_k(scenario, acceptance, draft, ks=range(1, 17), placement=placement)


VALIDATION_METRICS: dict[str, Callable[[dict], float]] = {
    "spec_tokens_per_s": lambda c: _f(case_estimate(c).tokens_per_s_per_request),
    "spec_speedup": lambda c: _f(case_estimate(c).speedup),
    "spec_vs_baseline": lambda c: _f(case_estimate(c).tokens_per_s_per_request)
    / _f(case_estimate(c, "baseline_cluster").tokens_per_s_per_request),
}


# ---- result rows and text (simulate --draft) ------------------------------------------------


def records(sest: SpecEstimate, cluster: ClusterSpec) -> list[dict]:
    """Result rows (rdu_cluster/output/results.py schema): the target's rows with the speculative
    figures in place of plain decode's, and the speculative columns filled."""
    rows = results.records(sest.base, cluster.chip.name, cluster.chip.execution_model, cluster)
    spec_cols = {
        # a separate draft's sockets are the deployment's too (costed in the columns below)
        "sockets": int(sest.base.sockets + sest.base.replicas * sest.draft_sockets),
        "tokens_per_s_per_request": _f(sest.tokens_per_s_per_request),
        "tokens_per_s_total": _f(sest.tokens_per_s_total),
        "tpot_s": _f(sest.tpot_s),
        "ttft_s": _f(sest.ttft_s),
        **({f"prefill_{c}_s": _f(sest.prefill_cause(c)) for c in CAUSES}
           if sest.base.prefill.by_cause else {}),
        "draft": sest.draft,
        "spec_k": sest.speculation.k,
        "acceptance": sest.speculation.acceptance.describe(),
        "tokens_per_step": sest.tokens_per_step,
        "spec_speedup": _f(sest.speedup),
        **{k: (None if v is None else _f(v))
           for k, v in economics.speculative_columns(sest, cluster).items()},
    }
    out = []
    for row in rows:  # the intervals of the speculative figures, not of plain decode's
        row = {**row, **spec_cols}
        bands = results.interval_columns(row, cluster.chip)
        note = f"{bands.pop('interval_note')}; the acceptance's own uncertainty not included"
        bounds = {k: None if v is None or math.isnan(_f(v)) else _f(v) for k, v in bands.items()}
        out.append({**row, **bounds, "interval_note": note})
    return out


def report(sests: list[SpecEstimate], clusters: list[ClusterSpec]) -> str:
    first = sests[0]
    s = first.speculation
    tree = f", tree {','.join(map(str, s.branching))}" if s.branching else ""
    title = (f"{first.base.model} speculative decoding: draft {first.draft}, acceptance "
             f"{s.acceptance.describe()}{tree}; batch {_i(first.base.batch)}, prompt "
             f"{_i(first.base.prompt_len)}, gen {_i(first.base.gen_len)}; "
             f"{stacks_text([e.base for e in sests])}")
    ms = lambda x: f"{_f(x) * 1e3:.3f}"
    econ = [economics.speculative_columns(e, c) for e, c in zip(sests, clusters)]
    rows = [
        ["k (draft tokens a step)", *(str(e.speculation.k) for e in sests)],
        ["placement (draft tp)", *(f"{e.placement} ({e.draft_tp})" for e in sests)],
        ["expected tokens a step", *(f"{e.tokens_per_step:.3f}" for e in sests)],
        ["draft steps ms (all k)", *(ms(e.draft_s) for e in sests)],
        ["verification ms", *(ms(e.verify.time_s) for e in sests)],
        ["step ms", *(ms(e.step_time_s) for e in sests)],
        ["tokens/s per request", *(f"{_f(e.tokens_per_s_per_request):,.1f}" for e in sests)],
        ["tokens/s plain decode", *(f"{_f(e.base.tokens_per_s_per_request):,.1f}" for e in sests)],
        ["speed-up over plain decode", *(f"{_f(e.speedup):.2f}x" for e in sests)],
        ["joules per token", *(_opt(x["joules_per_token"], "{:.3f}") for x in econ)],
        ["USD per million tokens", *(_opt(x["cost_per_million_tokens_usd"], "{:.2f}")
                                     for x in econ)],
    ]
    header = ["", *(f"{c.name} ({c.chip.name})" for c in clusters)]
    return title + "\n" + text_table(header, rows)


def _opt(x, fmt: str) -> str:
    return "-" if x is None else fmt.format(_f(x))


def _i(x) -> int:
    return round(_f(x))


def simulate(
    target: ModelSpec,
    clusters: list[ClusterSpec],
    draft: str,
    spec_k: int | None = None,
    acceptance: str | None = None,
    tree: str | None = None,
    **kw: Any,
) -> tuple[list[dict], str]:
    """`simulate --draft`: one speculative estimate per cluster (k: given, or the best in
    1..16 for each cluster), its result rows and its text table. `kw`: batch, prompt_len,
    gen_len, tp or plan (text), placement, draft_sockets, options (one per cluster)."""
    acc = (default_acceptance(draft, target.name) if acceptance is None
           else parse_acceptance(acceptance))
    branching = parse_tree(tree)
    check_draft(draft, target, kw["prompt_len"], kw["gen_len"])
    plan = None if kw.get("plan") is None else _tensor_only(kw["plan"])
    args = {"placement": kw.get("placement", "shared"),
            "draft_sockets": kw.get("draft_sockets", 1)}
    plans = [_replica_plan(c, plan, kw.get("tp"), **args) for c in clusters]
    sests = []
    options = kw.get("options") or [None] * len(clusters)
    for cluster, p, opts in zip(clusters, plans, options):
        scenario = Scenario(target, cluster, p, kw["batch"], kw["prompt_len"], kw["gen_len"],
                            opts)
        if spec_k is None:
            ks = range(1, (len(branching) if branching else 16) + 1)
            sests.append(best_k(scenario, acc, draft, ks=ks, branching=branching, **args))
        else:
            spec = Speculation(spec_k, acc, branching)
            sests.append(speculative_estimate(scenario, spec, draft, **args))
    rows = [r for e, c in zip(sests, clusters) for r in records(e, c)]
    return rows, report(sests, clusters)
