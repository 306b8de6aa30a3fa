"""What the Relax and Relay benchmarks share: one fresh worker process per run, and min over runs.

Each benchmark script re-invokes itself with ``--worker`` and options; the worker prints one line
``RESULT <json>`` with at least ``seconds``, ``peak_kib`` and ``delta_kib``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict, Mapping, Optional


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def rss_kib() -> int:
    """This process's resident set size now, in KiB (Linux ``/proc``; 0 where unavailable)."""
    return _status_kib("VmRSS")


def peak_rss_kib() -> int:
    """This process's peak resident set size, in KiB (``VmHWM``; 0 where unavailable).

    Not ``resource.getrusage(...).ru_maxrss``: Linux carries that over ``fork`` + ``exec``, so a
    worker started by a parent of 1 GiB reports at least 1 GiB whatever it uses itself.
    ``VmHWM`` belongs to the worker's own address space, which ``exec`` starts afresh.
    """
    return _status_kib("VmHWM")


def run_worker(
    script: str,
    options: Mapping[str, Any],
    *,
    cwd: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
) -> Dict[str, Any]:
    """Run ``script --worker --<key> <value> ...`` in a fresh interpreter and return its RESULT."""
    cmd = [sys.executable, script, "--worker"]
    for key, value in options.items():
        cmd += [f"--{key}", str(value)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise RuntimeError(f"worker failed: {' '.join(cmd)}")
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"worker printed no result: {proc.stdout}\n{proc.stderr}")


def fold_fields(result: Any) -> Dict[str, Any]:
    """What a worker reports of a ``fold_guard.relax.fold`` result: steps, kernels, folded calls."""
    report = result.report
    return {
        "steps": {k: float(v) for k, v in report.seconds.items()},
        "kernels_compiled": int(report.kernels_compiled),
        "kernels_cached": int(report.kernels_cached),
        "folded": len(result.plan.folded),
    }


def keep_best(best: Dict[str, Dict[str, Any]], impl: str, result: Mapping[str, Any]) -> None:
    """Fold one run into ``best[impl]``: the fastest run's fields, and the lowest memory of any run.

    Peak memory is deterministic up to noise, so its minimum is taken independently of time.
    """
    previous = best.get(impl)
    if previous is None or result["seconds"] < previous["seconds"]:
        best[impl] = dict(result)
    if previous is not None:
        best[impl]["peak_kib"] = min(previous["peak_kib"], result["peak_kib"])
        best[impl]["delta_kib"] = min(previous["delta_kib"], result["delta_kib"])
