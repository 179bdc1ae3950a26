"""A socket's resident weights and KV bytes per token are asked once per equal program
(engine/plan.py `_per_program`): the same values as computed afresh, one model's bf16 and fp8
programs told apart, and a program that does not hash computed each time."""

from __future__ import annotations

from dataclasses import replace

from rdu_cluster.config import load_fabric
from rdu_cluster.engine import plan as plans
from rdu_cluster.engine.disagg import Pool
from workloads.catalog import load_model
from workloads.spec import with_dtypes


def _program(weights: str):
    model = with_dtypes(load_model("llama-3.1-8b"), weights, None)
    cluster = Pool("sn40l-8", "tp2", 1).spec(model, load_fabric("ib-ndr"))
    spec = plans.PlanSpec.parse("tp2", cluster, model)
    return next(iter(plans.layouts(model, cluster, spec, None, None)[0].programs.values()))


def test_equal_programs_share_their_values_and_other_weights_do_not():
    for f in (plans.resident_weight_bytes, plans.kv_bytes_per_token):
        bf16, fp8 = _program("bf16"), _program("fp8")
        assert f(bf16) == f.__wrapped__(bf16) and f(fp8) == f.__wrapped__(fp8)
        assert f(_program("bf16")) == f(bf16)  # an equal program, made again
    assert plans.resident_weight_bytes(_program("bf16")) == 2 * plans.resident_weight_bytes(
        _program("fp8"))
    odd = replace(_program("bf16"), options={"unhashable": True})
    assert plans.kv_bytes_per_token(odd) == plans.kv_bytes_per_token.__wrapped__(odd)
