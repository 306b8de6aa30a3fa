"""Test-only helpers (on ``sys.path`` through ``pythonpath`` in ``pyproject.toml``, as ``support``).

- :mod:`support.reliability`: the bad-input catalogue runner and the concurrency check both IRs'
  reliability tests share;
- :mod:`support.tflite_models`: a small int8 TFLite model written without TensorFlow (Relay only).
"""
