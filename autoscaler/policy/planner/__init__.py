"""The planner: which MIG profile, how many replicas, on which GPU and slot (pure)."""

from autoscaler.policy.planner.core import DOWNSIZE_MIN_SLICES, apply_plan_to_cluster, group_of, plan

__all__ = ["DOWNSIZE_MIN_SLICES", "apply_plan_to_cluster", "group_of", "plan"]
