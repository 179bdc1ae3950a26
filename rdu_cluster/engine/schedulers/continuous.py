"""Continuous batching (Orca / vLLM): requests join and leave the batch at every step.

Without chunked prefill (vLLM V0's default): a step either prefills newly admitted prompts
whole (FCFS, within max_batch, the token budget and free KV blocks) or decodes every running
sequence; prefills go first. A prompt longer than the whole budget is prefilled alone, in one
step (as an engine serves it, not refused: why, above _queue). With chunked prefill
(Sarathi-Serve): every step decodes all running sequences and fills the rest of the token
budget with prompt chunks, continuing prompts first.
KV blocks for the whole prompt are taken at admission; when the decodes of a step need more
blocks than are free, the most recently admitted sequences are preempted (vLLM's policy), and
no new prompt is admitted in that step. Swapped sequences come back before new ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rdu_cluster.engine.schedulers import Limits, StepPlan, View, register

if TYPE_CHECKING:
    from rdu_cluster.engine.requests import Request


@register
class Continuous:
    name = "continuous"
    lockstep = True  # its decode steps decode every running sequence not prefilling
    # it reads a decoding sequence's cached and generated tokens only after View.fresh (to
    # preempt, or to count the blocks a step takes where not every running sequence decodes);
    # a sequence that decodes has cached no fewer than its target whenever they were brought
    stale_decodes = True
    # admission reserves the KV of the whole output too (no growth, so no preemption), and a
    # step without chunked prefill mixes whole prompts beside the decodes (in-flight batching):
    # engine/schedulers/no_evict.py
    reserve = False
    mixes = False

    def __init__(self, limits: Limits):
        self.limits = limits

    def step(self, view: View) -> StepPlan:
        running, preempt, free = _fit_decodes(view)
        if preempt:
            # the KV cache is full: an arrival could not join
            return StepPlan(decode=_decoding(running, view), preempt=preempt, saturated=True)
        if view.swapped:
            swap_in = _swap_in(view, running, free, self.limits.max_batch)
            if swap_in or running:
                # swapped sequences come back before any new one
                return StepPlan(decode=_decoding(running, view), swap_in=swap_in,
                                saturated=True)
        if self.limits.chunked_prefill or self.mixes:
            return self._chunked(view, running, free)
        return self._prefill_first(view, running, free)

    def _prefill_first(self, view: View, running: Sequence[Request], free: int) -> StepPlan:
        room = self.limits.max_batch - len(running)
        admit: list[Request]
        budget, admit, saturated = self.limits.token_budget, [], True
        for r in _queue(view, room):
            need = view.kv.blocks_for(self._tokens(r))
            tokens = r.uncached  # a cached prefix is not prefilled again
            # a prompt past the whole budget goes alone, in a step of its own (why: above
            # _queue)
            if len(admit) == room or (tokens > budget and admit) or need > free:
                break
            admit.append(r)
            budget, free = budget - tokens, free - need
        else:
            saturated = len(admit) == room or not view.more_arrivals
        if admit:
            prefill = tuple((r, r.uncached) for r in admit)
            return StepPlan(prefill=prefill, admit=tuple(admit), saturated=saturated,
                            reserve_output=self.reserve)
        room_left = len(running) < self.limits.max_batch
        saturated = bool(view.waiting) or not room_left or not view.more_arrivals
        decode = _decoding(running, view)
        # with nothing waiting or swapped and every running sequence decoding, a completion
        # changes nothing but the batch (_fit_decodes' first test settles the next plan)
        stands = not (view.waiting or view.swapped) and len(decode) == len(running)
        return StepPlan(decode=decode, saturated=saturated, stands=stands)

    def _chunked(self, view: View, running: Sequence[Request], free: int) -> StepPlan:
        decode = _decoding(running, view)
        budget = self.limits.token_budget - len(decode)
        prefill: list[tuple[Request, int]] = []
        if len(decode) < len(running):  # some still prefill (else no pass over them all)
            for r in running:  # r.prefilling read inline: this runs every step
                if budget <= 0:
                    break
                if r.cached < r.target:
                    chunk = min(r.target - r.cached, budget)
                    prefill.append((r, chunk))
                    budget -= chunk
        room = self.limits.max_batch - len(running)
        admit: list[Request]
        admit, saturated = [], True
        split = self.limits.chunked_prefill  # else (mixes) whole prompts, the budget's room
        for r in _queue(view, room):
            need = view.kv.blocks_for(self._tokens(r))
            whole = not split and r.uncached > budget and bool(admit or decode or prefill)
            if len(admit) == room or budget <= 0 or need > free or whole:
                break
            chunk = min(r.uncached, budget) if split else r.uncached
            admit.append(r)
            prefill.append((r, chunk))
            budget, free = budget - chunk, free - need
        else:
            saturated = len(admit) == room or budget <= 0 or not view.more_arrivals
        return StepPlan(prefill=tuple(prefill), decode=decode, admit=tuple(admit),
                        saturated=saturated, reserve_output=self.reserve)

    def _tokens(self, r: Request) -> int:
        """The tokens whose KV admitting r takes: its prompt and what it generated (its
        output to come too where the policy reserves it)."""
        return r.prompt_len + (r.output_len if self.reserve else r.generated)


# A prompt longer than the token budget, without chunked prefill, is prefilled alone in a step
# of its whole length: SGLang (the default stack) splits it into budget-sized prefill-only
# steps run back to back (chunked_prefill_size, no decodes mixed in by default), and vLLM V0
# without chunking raises its budget to the model's context (EngineArgs: max_num_batched_tokens
# = max_model_len): the same work, and the decodes wait for it in both. It was refused
# ("prompt exceeds the token budget"), so a 16K-token prompt served nothing by default.


def _queue(view: View, room: int):
    return view.waiting if room > 0 else ()


def _decoding(running: Sequence[Request], view: View) -> tuple[Request, ...]:
    """The running sequences not prefilling: all of them where the view's lockstep count
    says so (View.together; a lockstep span decodes exactly the sequences with runs open:
    Replica.advance checks it), else a pass over them."""
    if view.together is not None and len(running) == len(view.running):
        return tuple(running)
    return tuple([r for r in running if r.cached >= r.target])


def _fit_decodes(view: View) -> tuple[Sequence[Request], tuple[Request, ...], int]:
    """Preempt the newest running sequences until one decode step of the rest fits; the free
    blocks left after that step (read only to admit or swap in)."""
    preempt: list[Request]
    kv, preempt = view.kv, []
    free = kv.free
    if free >= len(view.running) * kv.blocks_for(view.lookahead) and not view.waiting \
            and not view.swapped:
        # A decode step grows a sequence by at most the blocks of its lookahead (it holds
        # its cached tokens' blocks), so all fit, and nothing waits to be admitted with what
        # is left. (The running list itself: no caller changes it.)
        return view.running, (), free
    running = list(view.running)
    need = view.growth()
    if need is None or need > free:  # the counts read below (_growth, kv.blocks): up to date
        view.fresh()
    if need is None:
        need = _growth(running, kv, view.lookahead)
    while running:
        if need <= free:
            return running, tuple(preempt), free - need
        victim = running.pop()
        preempt.append(victim)
        free += kv.blocks(victim)
        need -= _growth([victim], kv, view.lookahead)  # a sum over the sequences: theirs out
    return running, tuple(preempt), free


def _growth(running: list, kv, lookahead: int) -> int:
    """The blocks one decode step of the running sequences may take: those of its cached
    tokens and the lookahead (no more than its output has left) less those each holds (not
    prefilling)."""
    bt = kv.config.block_tokens
    if lookahead == 1:
        # It holds the blocks of its cached tokens (KVManager.grow), so it needs one more
        # block exactly when those fill their last block, and it holds no spare one (the
        # first test settles 15 in 16 sequences). Where its cached tokens fill whole blocks,
        # kv.blocks(r) * bt <= r.cached reads held <= cached / bt: the record is read inline,
        # as this runs over every running sequence each step (3,000 in an offline run).
        held = kv.held
        return sum([1 for r in running if r.cached % bt == 0 and r.cached >= r.target
                    and held.get(r.id, 0) * bt <= r.cached])
    return sum([max(0, -(-(r.cached + min(lookahead, r.remaining_output)) // bt) - kv.blocks(r))
                for r in running if r.cached >= r.target])


def _swap_in(view: View, running: Sequence[Request], free: int,
             max_batch: int) -> tuple[Request, ...]:
    out: list[Request] = []
    for r in view.swapped:
        need = view.kv.blocks_for(r.cached + min(view.lookahead, r.remaining_output))
        if len(running) + len(out) >= max_batch or need > free:
            break
        out.append(r)
        free -= need
    return tuple(out)
