"""Test-only helpers (on ``sys.path`` through ``pythonpath`` in ``pyproject.toml``, as ``support``).

- :mod:`support.ir_harness`: the checks both IRs' bad-input catalogues, fuzzers and model zoos
  share, over a small per-IR object (``tests/relax/harness_relax.py``,
  ``tests/relay/harness_relay.py``).
- :mod:`support.reliability`: the concurrency check both IRs' reliability tests share.

The TFLite and PyTorch models the examples show too live in ``examples/_common``.
"""
