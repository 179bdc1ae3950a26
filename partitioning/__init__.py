"""Plans (TP / PP / EP / DP), per-socket programs, memory footprints and the one fit check, the
one plan evaluator, plan search."""

from partitioning.evaluate import PlanEstimate, evaluate_plan, footprint, search_plans
from partitioning.expert_routing import RoutingModel, expert_load
from partitioning.footprint import Footprint, Placement, PlanDoesNotFit, footprints, misfits
from partitioning.plan import Plan, validate
from partitioning.program import Program, build_programs
from partitioning.scenario import Scenario
from partitioning.search import enumerate_plans, search

__all__ = [
    "Footprint",
    "Placement",
    "Plan",
    "PlanDoesNotFit",
    "PlanEstimate",
    "Program",
    "RoutingModel",
    "Scenario",
    "build_programs",
    "enumerate_plans",
    "evaluate_plan",
    "expert_load",
    "footprint",
    "footprints",
    "misfits",
    "search",
    "search_plans",
    "validate",
]
