"""Stock decisions that wait for a 0-d operand folded earlier in the same pass.

The stock pass legalizes a call with its 0-d operands as constants, values included, and a
legalizer may reject a value (a division's simplifier raises "Divide by zero" on a zero
divisor). When such an operand is itself folded in this pass, its value is unknown while the
plan is made: the planning legalization shows it as one (:mod:`.requests`; :mod:`.legalize`
notes such calls in ``Legalization.pending_scalars``), and the decision is made again on the
real value once it is evaluated (:func:`stock_legalization_error`, asked per call by
``Analysis.stock_failures``), before the plan is final. A call stock would not fold there is
then kept, with stock's reason.

    lv = sqrt(2.0)        folds
    lv1 = divide(c, lv)   folds: legalized on 1.414 once lv has its value (on 0.0: kept)
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from .._sites import CallSite
from .._stock import scalar_rule
from .requests import legalize_requests, make_request

__all__ = ["stock_legalization_error"]


def stock_legalization_error(site: CallSite, scalars: Mapping[int, np.ndarray]) -> Optional[str]:
    """Why the stock pass would not fold ``site`` with these 0-d operand values, or None.

    The stock pass legalizes a call with its scalar operands as constants, values included; this
    does the same with ``scalars`` (leaf index -> value, for the leaves that were still pending
    when the call was first legalized). Stock raises where ``LegalizeOps`` raises: the call is
    then kept with that error, as every call stock cannot evaluate.
    """
    func, request = make_request(
        "check", [site], symbolic=False, scalars_as_constants=True, scalars=scalars
    )
    legalized, errors = legalize_requests({request.name: func})
    if request.name in errors:
        return scalar_rule(site.op_name, None, errors[request.name])
    return scalar_rule(site.op_name, legalized[request.name][request.name])
