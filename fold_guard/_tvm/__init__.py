"""What both adapters share on TVM's side: the helpers ``fold_guard.relax`` and ``fold_guard.relay``
both use, none of them a rule of the fold (those are the TVM-free core's, ``fold_guard._core``).

* :mod:`.adapter`: the pass object each ``FoldConstant(...)`` returns, and the input check;
* :mod:`.pass_context`: a fold's internal passes run out of sight of the caller's instruments;
* :mod:`.serial`: one lock around every entry point that runs TVM;
* :mod:`.partition`: running a backend's partitioner with nothing folding;
* :mod:`.offload`: trying a backend's pattern table on a module;
* :mod:`.ledger_attr`: the precision ledger as an ``IRModule`` attribute;
* :mod:`.unwritten`: kernels whose result depends on memory nobody wrote;
* :mod:`.cores`, :mod:`.versions`: which TVM runs in this process (neither imports ``tvm``).

This package's ``__init__`` imports nothing, so ``fold_guard`` reads :mod:`.cores` before anything
imports ``tvm``.
"""
