"""Plans (TP / PP / EP / DP), per-socket programs, memory footprints, plan search."""

from partitioning.evaluate import PlanEstimate, evaluate_plan, search_plans
from partitioning.footprint import Footprint, Placement, PlanDoesNotFit, check_fit, footprints
from partitioning.plan import Plan, validate
from partitioning.program import Program, build_programs
from partitioning.routing import RoutingModel, expert_load
from partitioning.search import enumerate_plans, search

__all__ = [
    "Footprint",
    "Placement",
    "Plan",
    "PlanDoesNotFit",
    "PlanEstimate",
    "Program",
    "RoutingModel",
    "build_programs",
    "check_fit",
    "enumerate_plans",
    "evaluate_plan",
    "expert_load",
    "footprints",
    "search",
    "search_plans",
    "validate",
]
