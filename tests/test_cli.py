"""The README's main command, run as a user would."""

from __future__ import annotations

import subprocess
import sys


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoremat", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_demo_plans_gpt2_small_within_two_minutes():
    # timeout=120 is the README's promise for a 2-core machine.
    result = _run("demo")
    assert result.returncode == 0, result.stderr
    assert "predicted peak" in result.stdout and "overhead" in result.stdout
    assert "gpt2.py:" in result.stdout


def test_demo_below_the_floor_says_the_floor():
    result = _run("demo", "--budget", "1GiB")
    assert result.returncode == 1
    assert "smallest feasible budget is" in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_malformed_budget_is_a_usage_error():
    result = _run("demo", "--budget", "lots")
    assert result.returncode == 2
    assert "accepted" in result.stderr or "expected" in result.stderr
    assert "Traceback" not in result.stderr
