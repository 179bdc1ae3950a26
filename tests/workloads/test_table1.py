"""Llama 3.1 8B, BF16, batch 1, 4K context against [KL] Table 1 (arXiv 2410.23668), as quoted in
/work/shared/REFERENCE.md: 14.9 GB weights, 0.5 GB KV cache, 20 GFLOP per token, 15.4 GB read per
token, 1.3 FLOP/byte.

Units: the table's GB are GiB (2^30 bytes). 8.03e9 params x 2 B = 16.06e9 B = 14.96 GiB (the table
says 14.9; 16.06 "GB" in 10^9 would be 8% off), and the KV cache of 4096 tokens is
32 layers x 8 KV heads x 128 x (K, V) x 2 B = 131,072 B/token x 4096 = 2^29 B = exactly 0.5 GiB.
4K is therefore 4096 (4000 tokens would give 0.49 GiB; both round to 0.5, but 4096 makes the
table exact). Read per token: 14.96 + 0.5 = 15.46 GiB, the table's 15.4.

Two reconciliations, both structural and both asserted exactly:
- Bytes read: the table counts every weight as read. The decode graph's embedding is a gather
  that reads one row of the 0.98 GiB table, so the graph streams 14.48 GiB; graph reads plus the
  unread embedding rows equal the table's figure.
- FLOPs: the graph counts 17.2 GFLOP (2 x 7.50B matmul weights, the LM head included, + 2.15
  GFLOP of attention over 4096 keys + norms, rope, softmax), 14% under the table's 20. The table is
  consistent with the common 2 FLOP per parameter of ALL 8.03B parameters (the embedding table
  included) + attention = 18.2 GFLOP, 9% under 20, the rest being the table's one-significant-
  figure rounding (18.2 / 15.4 = 1.2 FLOP/byte vs the quoted 1.3). The test holds that
  convention within 10% and the graph's count to it minus the embedding's 2 x 0.525 GFLOP.
"""

from __future__ import annotations

import pytest

from workloads import catalog, graph, params

GIB = 2**30
CONTEXT = 4096


@pytest.fixture(scope="module")
def spec():
    return catalog.load_model("llama-3.1-8b")


@pytest.fixture(scope="module")
def g(spec):
    return graph.decode_graph(spec, 1, CONTEXT)


def test_weights_14_9_gib(spec):
    weights = graph.weight_bytes(spec)
    assert weights == pytest.approx(14.9 * GIB, rel=0.03)
    assert weights / 1e9 == pytest.approx(16.06, rel=0.001)  # why the table cannot mean 10^9


def test_kv_cache_0_5_gib(spec, g):
    assert graph.kv_cache_bytes(spec, 1, CONTEXT) == 0.5 * GIB
    assert g.total("kv_read_bytes") == pytest.approx(0.5 * GIB, rel=0.03)


def test_bytes_read_per_token_15_4_gib(spec, g):
    graph_read = g.total("weight_bytes") + g.total("kv_read_bytes")
    unread_embedding = (params.embedding_params(spec) - spec.hidden_size) * 2
    assert graph_read + unread_embedding == pytest.approx(15.4 * GIB, rel=0.03)
    assert graph_read == pytest.approx(14.48 * GIB, rel=0.005)


def test_flops_per_token_20_gflop(spec, g):
    attention = sum(
        b.repeat * op.flops for b, op in g.ops() if op.name == "attention"
    )
    table_convention = 2 * params.total_params(spec) + attention
    assert table_convention == pytest.approx(20e9, rel=0.10)
    embedding_flops = 2 * params.embedding_params(spec)
    assert g.total("flops") == pytest.approx(table_convention - embedding_flops, rel=0.01)
    assert g.total("flops") == pytest.approx(17.2e9, rel=0.01)
