"""Scenarios built on the plan evaluator: speculative decoding, Composition of Experts,
ablations, hosting footprints, energy and cost."""
