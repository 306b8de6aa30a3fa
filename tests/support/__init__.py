"""Test-only helpers (on ``sys.path`` through ``pythonpath`` in ``pyproject.toml``, as ``support``).

- :mod:`support.reliability`: the bad-input catalogue runner and the concurrency check both IRs'
  reliability tests share.

The TFLite and PyTorch models the examples show too live in ``examples/_common``.
"""
