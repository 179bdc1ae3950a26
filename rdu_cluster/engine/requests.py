"""Request entities: one per trace row, mutated by the engine as it is scheduled.

Token accounting follows vLLM: a prefill writes the KV of its `target` tokens (the prompt, plus
the tokens generated before a recompute preemption) and samples one output token in the step it
completes; each decode step reads the `cached` tokens, writes one more and samples one token.
Times are not stored here: the engine records step indices (admission, first token, completion)
and resolves them to times once the steps' times are known.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

WAITING, RUNNING, SWAPPED, DONE, UNSERVED = "waiting", "running", "swapped", "done", "unserved"


@dataclass(eq=False, slots=True)  # slots: no attribute dict per request in flight
class Request:
    id: int
    arrival_s: float
    prompt_len: int
    output_len: int
    model: str = ""
    state: str = WAITING
    cached: int = 0  # tokens whose KV is in the cache
    generated: int = 0  # output tokens sampled so far
    target: int = 0  # tokens the current prefill must cache (prompt + generated at admission)
    admit_step: int = -1  # first step of its first admission
    first_token_step: int = -1
    done_step: int = -1
    preemptions: int = 0
    swaps: int = 0
    reason: str = ""  # why it was not served
    expert: int = -1  # Composition of Experts: the expert the router chose (-1: none)
    ready_s: float = -1.0  # when the scheduler first sees it; -1: on arrival
    switch_step: int = -1  # CoE: the step whose expert switch it waited for
    # Steps that streamed tokens to the client, one chunk a step (a speculative step's
    # accepted tokens arrive together), for the ITL (bench.py), in order, as (replica, first,
    # steps): decodes as runs of the replica's decode steps (its steps with decodes: first
    # counts those before, so another request's prefill-only step does not break a run),
    # consecutive ones merged (emit); a prefill's token (emit_prefill) as first = -1 - its
    # step, steps 1.
    emits: list[tuple[int, int, int]] = field(default_factory=list)
    # Under a lockstep policy (schedulers.Scheduler.lockstep), the decode step from which it
    # decodes in every decode step of its replica: its run, added to `emits` when it stops
    # (completes or is preempted); -1 when it is not decoding.
    decoding_since: int = -1
    # With the replica's Lockstep, while it decodes: the decode step its `cached` and
    # `generated` stand at; the steps since are added when they are read (Lockstep.bring).
    synced_at: int = -1
    # Disaggregated decode: tokens whose KV arrives with the request from its prefill replica
    # (None: it prefills here). Admission then allocates that KV and decodes at once.
    received: int | None = None
    content: tuple = ()  # (content id, tokens) chunks of prompt + output (traces.Trace.content)
    session: int = -1
    # Prefix caching (engine/prefix_cache/): cached tokens it would find now (set by its
    # replica), tokens found per tier over its admissions, their copy seconds, tokens admitted.
    probe: Callable[[Request], int] | None = field(default=None, repr=False)
    prefix_tokens: dict = field(default_factory=dict)
    prefix_copy_s: float = 0.0
    admitted_tokens: int = 0

    def __post_init__(self) -> None:
        if self.ready_s < 0:
            self.ready_s = self.arrival_s

    def __deepcopy__(self, memo: dict) -> Request:
        """A copy (engine/checkpoint.py) field by field: its lists and dicts its own, its
        probe the copy's (a bound method of its replica's prefix cache), the rest immutable
        (through copy's generic path, field by field, question 1 of bench_capacity.py's 16
        kept copies took 1.04 s of CPU, 0.72 s so)."""
        out = object.__new__(Request)
        memo[id(self)] = out
        for name in _FIELDS:
            setattr(out, name, getattr(self, name))
        out.emits = list(self.emits)
        out.prefix_tokens = dict(self.prefix_tokens)
        if self.probe is not None:
            out.probe = copy.deepcopy(self.probe, memo)
        return out

    @property
    def prefilling(self) -> bool:
        return self.cached < self.target

    @property
    def remaining_prefill(self) -> int:
        return self.target - self.cached

    @property
    def uncached(self) -> int:
        """Tokens its next admission must prefill: prompt and generated tokens, less the prefix
        the cache holds (0 without one)."""
        hit = self.probe(self) if self.probe is not None and self.cached == 0 else 0
        return self.prompt_len + self.generated - hit

    @property
    def remaining_output(self) -> int:
        return self.output_len - self.generated

    def admit(self, step: int) -> None:
        self.state = RUNNING
        self.target = self.prompt_len + self.generated
        if self.admit_step < 0:
            self.admit_step = step

    def prefill(self, tokens: int, step: int) -> None:
        self.cached += tokens
        if self.cached == self.target:
            self._sample(step)

    def decode_speculative(self, tokens: int, step: int) -> None:
        """One speculative step that emitted `tokens` (accepted drafts plus the target's own)."""
        self.cached += tokens
        self.generated += tokens - 1
        self._sample(step)

    def _sample(self, step: int) -> None:
        self.generated += 1
        if self.first_token_step < 0:
            self.first_token_step = step
        if self.generated >= self.output_len:
            self.state, self.done_step = DONE, step

    def emit(self, replica: int, first: int, steps: int) -> None:
        """It streamed a token in each of `steps` decode steps from decode step `first` on
        `replica`: a run that continues the last one is merged into it (the same chunks, one
        tuple per run of consecutive decode steps rather than one per span)."""
        runs = self.emits
        if runs:
            rep, start, n = runs[-1]
            if rep == replica and start + n == first and start >= 0:  # not a prefill's
                runs[-1] = (rep, start, n + steps)
                return
        runs.append((replica, first, steps))

    def emit_prefill(self, replica: int, step: int) -> None:
        """Its prefill, done in `step` on `replica`, sampled a token (Request.emits)."""
        self.emits.append((replica, -1 - step, 1))

    def preempt_recompute(self) -> None:
        self.state, self.cached, self.target = WAITING, 0, 0
        self.preemptions += 1

    def preempt_swap(self) -> None:
        self.state = SWAPPED
        self.swaps += 1


_FIELDS = tuple(f.name for f in fields(Request))


def decode_lockstep(requests: Sequence[Request], steps: int, first: int) -> list[Request]:
    """Each of `requests` ran `steps` decode steps from step `first`: it read its cached
    tokens and sampled one token a step. Returns those that completed. The engine's innermost
    loop; under a lockstep policy a sequence's run of chunks stays open while it decodes
    (Request.decoding_since), so this is all a decode span does to it."""
    last = first + steps - 1
    done = []
    for r in requests:
        r.cached += steps
        generated = r.generated = r.generated + steps  # read once: the engine's hottest loop
        if generated >= r.output_len:
            r.state, r.done_step = DONE, last
            done.append(r)
    return done


def decode_batch(requests: Sequence[Request], steps: int, first: int, replica: int,
                 dfirst: int) -> list[Request]:
    """decode_lockstep, each step's token streamed as a chunk of the run from decode step
    `dfirst` on `replica` (a policy that is not lockstep: CoE)."""
    done = decode_lockstep(requests, steps, first)
    run = (replica, dfirst, steps)
    for r in requests:
        runs = r.emits  # r.emit(replica, dfirst, steps), inline
        if runs:
            rep, start, n = runs[-1]
            if rep == replica and start + n == dfirst and start >= 0:  # not a prefill's
                runs[-1] = (rep, start, n + steps)
                continue
        runs.append(run)
    return done