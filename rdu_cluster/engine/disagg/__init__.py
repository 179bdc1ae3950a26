"""Disaggregated serving: a prefill pool and a decode pool, possibly of different chips, with
each request's KV cache handed from its prefill replica to a decode replica over an inter-node
fabric (DistServe, Splitwise; vLLM's disaggregated prefill with its NIXL connector).

A request goes first to the prefill pool, where it is served as a request of one output token:
its prefill computes the prompt's KV. The KV then moves to the decode pool: the bytes are the
model's KV per token (workloads.graph.kv_cache_bytes) times the tokens sent, and the time is the
interconnect model's: each socket of the prefill replica sends its share to every socket of the
decode replica (the shards are re-cut when the two TP degrees differ), all the flows sharing
the fabric ports max-min fairly (interconnect.contention), one port per socket into a
non-blocking switch (the fabric TOML's bandwidth and latency, with their source). The decode
replica admits the request with that KV and decodes every output token, the first one included:
as vLLM's NIXL connector does, the prefill's sampled token is not streamed; the decode side
takes the prompt's KV except its last token and runs that token as its first decode step. So
TTFT = prefill queue + prefill + KV transfer + decode queue + one decode step.

Both pools run in one event loop (loop.run_coupled), each a Simulation of its own. A request
whose prefill ends (or that the prefill pool refuses) is handed on at once: its decode replica
is dealt round-robin as it is sent, and its KV transfer holds the ports of its prefill replica
and of its decode replica for its duration (Ports: a transfer that finds a port held waits for
it), so hand-overs contend on the fabric. Closed loops (--concurrency clients, --sessions) run
over the pools: a request through the decode pool sends its client's next request (its
session's next turn, after the think time) to the prefill pool, which holds the prefix cache
(a turn's history is found where it was prefilled; the decode pool receives the whole prompt's
KV). A replica of either pool plans ahead only to the earliest time something it cannot see
yet could reach it (Handover.frontier: another replica's next window, in either pool), so
every arrival is seen at the step boundary it would be in a step-by-step loop; a replica's
window is timed as it is planned up to there (engine/lookahead.py; a closed loop's prefill
replica up to Handover.returns), taking the arrivals known by then as they reach it. Replica
routing is round-robin in both pools (a stateful policy would need the other pool's state at
each hand-over). The prefill replica frees the KV when its step ends (the transfer overlapping
its later steps).

A module per concept, each importing at run time only those before it here: pools (a pool of
replicas, and a KV hand-over's time over the fabric), ports (the fabric ports the hand-overs
hold), prefill_bound (the least a prefill step that completes a request takes, which the
frontier waits past a prefill window), handover (the two pools in one loop: Handover, each
pool's front end), tables (the two pools' tables as one set), disaggregated (the run:
Disaggregated). The package re-exports the names imported elsewhere.
"""

from rdu_cluster.engine.disagg.disaggregated import Disaggregated
from rdu_cluster.engine.disagg.pools import Pool, group_sockets, transfer_time

__all__ = ["Disaggregated", "Pool", "group_sockets", "transfer_time"]
