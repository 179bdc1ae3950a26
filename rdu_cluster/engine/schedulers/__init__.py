"""Scheduler policies, by registry: a policy is one module that defines a class with a `name`,
built from `Limits`, whose `step(view)` returns the next step's `StepPlan` WITHOUT changing
anything (the engine applies the plan). Adding a policy is one module in this package (the
registry finds it) plus its test: docs/extending.md.

The contract a policy must keep, `StepPlan.saturated` (a required field: every plan states it):
True only if the plan would be the same had more requests arrived since the view was taken
(the policy stopped at a limit: batch, token budget, KV capacity, or a rule of its own, or no
more requests will arrive); False when it ran out of waiting requests with room to spare. The
engine plans several spans per backend round trip, and times a window as it plans it, on the
strength of that answer: a saturated plan's span runs on past the next arrival. A plan that says
saturated where an arrival would have joined it gives other tables than a step-by-step loop
(a shortest-first policy that always said True did). The invariance tests (tests/engine/
test_policies.py) run every registered policy with multi-span windows and one step at a time
and compare the tables: a plug-in that breaks the contract fails them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from chip import runtime_memory, serving_stacks
from rdu_cluster.engine.kv import KVManager
from rdu_cluster.engine.lockstep import Lockstep
from rdu_cluster.engine.registry import Registry
from rdu_cluster.engine.requests import Request
from workloads.errors import ConfigError

PREEMPTION = ("recompute", "swap")
DEFAULT = "continuous"  # the policy a run gets unless it names one


@dataclass(frozen=True)
class Limits:
    """max_batch: sequences in a step (32 where no engine gives one: an RDU, whose runtime
    publishes no serving default; a GPU runs its stack's, max_batch_for). token_budget: new
    tokens in a step (prefill tokens plus one per decode); 8192 holds 8 prompts of 1,024 (an
    RDU's; a GPU runs its stack's, token_budget_for: 2,048 to 16,384 by stack and GPU).
    chunked_prefill: split prompts to fill the budget beside decodes (Sarathi-Serve / vLLM
    --enable-chunked-prefill). preemption: what a request pushed out of the KV cache loses:
    "recompute" (its KV, rebuilt by a new prefill) or "swap" (KV copied to DDR / host and back)."""

    max_batch: int = 32
    token_budget: int = 8192
    chunked_prefill: bool = False
    preemption: str = "recompute"

    def check(self) -> None:
        if self.max_batch < 1:
            raise ConfigError(f"--max-batch: must be positive, got {self.max_batch}")
        if self.token_budget < 1:
            raise ConfigError(f"--token-budget: must be positive, got {self.token_budget}")
        if self.preemption not in PREEMPTION:
            raise ConfigError(
                f"--preemption: unknown {self.preemption!r}; accepted: {', '.join(PREEMPTION)}"
            )


def scheduler_for(options: Any) -> str:
    """The scheduling policy where --scheduler is not given: the GPU stack's own where it
    differs (serving_stacks.scheduler_of: TensorRT-LLM's guaranteed-no-evict), else DEFAULT."""
    return serving_stacks.scheduler_of(options) or DEFAULT


def chunked_prefill_for(options: Any, scheduler: str) -> bool:
    """Whether prompts are chunked beside the decodes where --chunked-prefill is not given:
    as the GPU stack's scheduler does by default (serving_stacks.chunks_prefill: vLLM,
    Sarathi-Serve), where the policy takes chunks (`chunks`; static batching prefills each
    prompt whole); an RDU and the other stacks, not."""
    return serving_stacks.chunks_prefill(options) and getattr(REGISTRY.cls(scheduler),
                                                               "chunks", True)


def token_budget_for(chip: Any, options: Any = None) -> int:
    """The new tokens a step of a replica of `chip` takes where --token-budget is not given:
    the GPU stack's own (chip/runtime_memory.py token_budget: SGLang's chunked_prefill_size
    by GPU memory, vLLM's max_num_batched_tokens by its GPU rule, TensorRT-LLM's
    max_num_tokens), else Limits.token_budget."""
    return runtime_memory.of(chip, options).token_budget or Limits.token_budget


def max_batch_for(chip: Any, options: Any = None) -> int:
    """The sequences a replica of `chip` runs at once where --max-batch is not given: the GPU
    stack's own cap (chip/runtime_memory.py max_running: SGLang's request pool, vLLM's
    max_num_seqs, TensorRT-LLM's max_batch_size), else Limits.max_batch."""
    return runtime_memory.of(chip, options).max_running or Limits.max_batch


def engine_defaults(prefill: tuple[Any, Any], decode: tuple[Any, Any] | None = None, *,
                    scheduler: str | None = None, max_batch: int | None = None,
                    token_budget: int | None = None, chunked_prefill: bool | None = None,
                    preemption: str = Limits.preemption, coe: bool = False
                    ) -> tuple[str, Limits]:
    """The scheduling policy and limits a run takes: each one given, else its engine's own on
    the (chip, execution options) of the replicas that prefill (`prefill`: the token budget,
    chunking) and decode (`decode`, default `prefill`: the policy, the requests at once), as a
    serving engine a practitioner starts runs them (scheduler_for, max_batch_for,
    token_budget_for, chunked_prefill_for). A CoE run (`coe`) runs [MICRO24]'s runtime: the
    coe policy, Limits.max_batch, no chunking."""
    decode = decode or prefill
    policy = scheduler or ("coe" if coe else scheduler_for(decode[1]))
    if max_batch is None:
        max_batch = Limits.max_batch if coe else max_batch_for(*decode)
    if chunked_prefill is None:
        chunked_prefill = not coe and chunked_prefill_for(prefill[1], policy)
    budget = token_budget if token_budget is not None else token_budget_for(*prefill)
    return policy, Limits(max_batch, budget, chunked_prefill, preemption)


# View and StepPlan are values no one mutates, but not frozen: at light load the engine builds
# one of each a span, and a frozen dataclass's __init__ (object.__setattr__ a field) costs
# about 5x (1.16 against 0.22 microseconds for a StepPlan)
@dataclass(slots=True)
class View:
    """What a policy sees at a step boundary (read only)."""

    running: Sequence[Request]  # admission order
    waiting: Sequence[Request]  # FCFS: arrival order, recompute-preempted requests first
    swapped: Sequence[Request]
    kv: KVManager
    more_arrivals: bool  # requests of the trace not yet arrived
    # tokens a decode of the next step may write: 1, or k + 1 with speculative decoding
    # (the drafts it may accept and the target's own), for which vLLM reserves its
    # lookahead slots before the step
    lookahead: int = 1
    # under a lockstep policy where every running sequence decodes (none prefilling): their
    # aggregates (engine/lockstep.py), which give the blocks their decode step `at` takes
    # without a pass over the batch (`growth`); None: the policy counts them
    together: Lockstep | None = None
    at: int = 0  # the replica's next decode step
    # brings every running sequence's cached and generated tokens up to date: under a lockstep
    # policy they stand where it last read them (engine/lockstep.py), which a policy that
    # says so (stale_decodes) reads only after calling this; others see them up to date
    fresh: Callable[[], None] = lambda: None

    def growth(self) -> int | None:
        """The blocks one decode step of the running sequences takes where the aggregates
        know it (`together`, one token a step), else None."""
        if self.together is None or self.lookahead != 1:
            return None
        return self.together.growth(self.at, 1)


@dataclass(slots=True)
class StepPlan:
    prefill: tuple[tuple[Request, int], ...] = ()  # (request, new tokens this step)
    decode: tuple[Request, ...] = ()
    admit: tuple[Request, ...] = ()  # waiting -> running
    swap_in: tuple[Request, ...] = ()  # swapped -> running
    preempt: tuple[Request, ...] = ()  # running -> out of the cache
    # would the plan be the same had more requests arrived? (the contract above; required)
    saturated: bool = field(kw_only=True)
    reserve_output: bool = False  # admission reserves KV for prompt + output (no growth)
    expert: int = -1  # Composition of Experts: the expert the step runs (-1: not a CoE)
    # A decode plan that stands until a request arrives: at a span's end with none arrived,
    # the policy would plan the same decodes less those that completed, as long as each
    # one's next step fits in the free KV blocks (a decode grows by at most one a step). The
    # engine then runs the next span without asking (at light load, a quarter of the spans).
    stands: bool = False

    @property
    def empty(self) -> bool:
        return not (self.prefill or self.decode or self.preempt or self.swap_in)


class Scheduler(Protocol):
    name: str
    limits: Limits  # the engine reads its preemption (a swap moves KV between tiers)
    # Optional (False when absent): every decode step the policy plans decodes every running
    # sequence that is not prefilling. The engine then keeps a sequence's streamed chunks as
    # one run from when it starts decoding (Request.decoding_since), not one a span.
    lockstep: bool
    # Optional (False when absent): under a lockstep policy, the policy reads a decoding
    # sequence's cached and generated tokens only after View.fresh; otherwise the engine brings
    # them up to date before each step (engine/lockstep.py: they move as they are read).
    stale_decodes: bool

    def __init__(self, limits: Limits) -> None: ...

    def step(self, view: View) -> StepPlan: ...


REGISTRY = Registry("--scheduler", __name__)
register = REGISTRY.register
names = REGISTRY.names


def get(name: str, limits: Limits) -> Scheduler:
    cls = REGISTRY.cls(name)
    limits.check()
    return cls(limits)
