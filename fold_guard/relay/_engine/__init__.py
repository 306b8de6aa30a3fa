"""Evaluation: the folded calls of a plan computed level by level, bit-identical to stock's.

:mod:`.evaluate` runs a plan's folded calls through stock's own evaluation pipeline, sharing the
work per op signature (:mod:`.kernels`: elementwise calls of one signature evaluated as one call
on their flattened operands, repeated calls through one prepared function).
"""

from .evaluate import Values, evaluate_plan, materialize

__all__ = ["Values", "evaluate_plan", "materialize"]
