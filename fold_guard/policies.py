"""Named fold policies: the built-ins, and the registry backends add theirs to.

A policy is an ordered list of rules; each rule sees one call whose inputs are all constant (op,
attributes, input and output dtypes, shapes, byte sizes, and where its result goes) and says fold,
keep, or nothing. The first rule that answers decides; with no answer the IR's default does
(what the stock ``FoldConstant`` of that IR folds). Annotations outrank every policy:
``fold_barrier`` > ``fold_allow`` > policy > default.

Built-ins (``describe_policies()`` prints them with their rules):

- ``default``: no rules; exactly the stock pass.
- ``fold-qnn``: every constant ``qnn.*`` call folds (Relay's ``FoldConstant(fold_qnn=True)``).
- ``keep-qdq-weights``: fold ``quantize(constant)``, keep ``dequantize(integer constant)``; a
  requantize chain on a constant (``dequantize -> quantize``, or ``qnn.requantize``) folds into
  one integer constant at its last scale; the cast of a float16 / bfloat16 weight stays.
- ``qdq-accelerator``: ``keep-qdq-weights`` plus: every other quantized op on constants stays
  (``qnn.conv2d``, ``qnn.add``, ...), even when composed before ``fold-qnn``.
- ``keep-requantize``: keep a requantize chain's boundary instead (compose it first).
- ``keep-low-precision-weights``: keep the cast of a float16 / bfloat16 weight, nothing else.
- ``weights-only``: keep every constant call whose result does not end only as weight or bias
  inputs of conv / matmul / dense.
- ``size-guard``: keep a fold whose result is large and much larger than its constant inputs.

A backend registers its own policy once; every API that takes a policy then accepts its name:

>>> import fold_guard.policies as policies
>>> from fold_guard import Action, FoldPolicy, Rule
>>> with policies.policy_registry_scope():
...     npu = policies.register_policy(policies.compose(
...         policies.get_policy("qdq-accelerator"), policies.size_guard(2.0), name="my-npu"))
...     [rule.name for rule in policies.get_policy("my-npu").rules][1:4]
['keep-dequantize-of-integer-constant', 'fold-requantize-of-constant', 'keep-quantized-ops']
"""

from __future__ import annotations

from ._core.builtin_policies import (
    CAST_OPS,
    DEFAULT_GROWTH_FACTOR,
    DEFAULT_MIN_RESULT_BYTES,
    DEFAULT_POLICY,
    DEQUANTIZE_OPS,
    FOLD_QNN_POLICY,
    KEEP_LOW_PRECISION_WEIGHTS_POLICY,
    KEEP_QDQ_WEIGHTS_POLICY,
    KEEP_REQUANTIZE_POLICY,
    LOW_PRECISION_FLOATS,
    QDQ_ACCELERATOR_POLICY,
    QUANTIZE_OPS,
    REQUANTIZE_OPS,
    SIZE_GUARD_POLICY,
    WEIGHTS_ONLY_POLICY,
    size_guard,
)
from ._core.policy import CallView, FoldPolicy, Rule, compose
from ._core.reasons import Action
from ._core.registry import (
    PolicySpec,
    get_policy,
    list_policies,
    policy_registry_scope,
    register_policy,
    resolve_policy,
    unregister_policy,
)
from ._core.uses import BIAS_OPS, WEIGHT_OPS, is_weight_op

__all__ = [
    "BIAS_OPS",
    "CAST_OPS",
    "DEFAULT_GROWTH_FACTOR",
    "DEFAULT_MIN_RESULT_BYTES",
    "DEFAULT_POLICY",
    "DEQUANTIZE_OPS",
    "FOLD_QNN_POLICY",
    "KEEP_LOW_PRECISION_WEIGHTS_POLICY",
    "KEEP_QDQ_WEIGHTS_POLICY",
    "KEEP_REQUANTIZE_POLICY",
    "LOW_PRECISION_FLOATS",
    "QDQ_ACCELERATOR_POLICY",
    "QUANTIZE_OPS",
    "REQUANTIZE_OPS",
    "SIZE_GUARD_POLICY",
    "WEIGHTS_ONLY_POLICY",
    "WEIGHT_OPS",
    "Action",
    "CallView",
    "FoldPolicy",
    "PolicySpec",
    "Rule",
    "compose",
    "describe_policies",
    "get_policy",
    "is_weight_op",
    "list_policies",
    "policy_registry_scope",
    "register_policy",
    "resolve_policy",
    "size_guard",
    "unregister_policy",
]


def describe_policies() -> str:
    """Every registered policy with its rules, as ``policy.describe()`` prints them.

    >>> print(describe_policies().splitlines()[0])
    default: exactly what the IR's stock FoldConstant folds (no rules of its own)
    """
    return "\n".join(policy.describe() for policy in list_policies())
