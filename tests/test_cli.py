"""The command line, run as a user would: in a subprocess, from a working directory."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import yaml

import autoremat
from autoremat._cli import _progress

# A user's module, imported by the command line from its working directory.
EXAMPLE = textwrap.dedent("""
    import jax
    import jax.numpy as jnp


    def loss(w, x):
        for _ in range(4):
            x = jnp.tanh(x @ w)
        return jnp.sum(x ** 2)


    def example_args():
        return (jax.ShapeDtypeStruct((64, 64), jnp.float32),
                jax.ShapeDtypeStruct((32, 64), jnp.float32))


    def loss_and_args():
        return loss, example_args()


    def not_a_pair():
        return example_args()


    NOT_CALLABLE = 3
""")


def _run(*args: str, cwd: pathlib.Path | None = None, timeout: float = 120,
         command: tuple[str, ...] = (sys.executable, "-m", "autoremat")
         ) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env, check=False)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> pathlib.Path:
    """A working directory holding the module ``cli_example``."""
    path = tmp_path_factory.mktemp("work")
    (path / "cli_example.py").write_text(EXAMPLE)
    return path


@pytest.fixture(scope="module")
def example(workdir):
    """(loss, args, budget): the example imported here, and a budget halfway between the
    smallest feasible one and the no-remat peak."""
    sys.path.insert(0, str(workdir))
    try:
        module = importlib.import_module("cli_example")
    finally:
        sys.path.remove(str(workdir))
    args = module.example_args()
    top = autoremat.plan(module.loss, *args, budget=1.0)
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        autoremat.plan(module.loss, *args, budget=1)
    return module.loss, args, (info.value.floor_bytes + top.budget_bytes) // 2


@pytest.fixture(scope="module")
def planned(workdir, example):
    """``autoremat plan cli_example:loss --args cli_example:example_args``, run once."""
    _, _, budget = example
    result = _run("plan", "cli_example:loss", "--args", "cli_example:example_args",
                  "--budget", str(budget), "--out", "policy.json", cwd=workdir)
    return result, workdir / "policy.json"


def test_plan_writes_the_policy_file_and_prints_the_report(planned, example):
    result, path = planned
    assert result.returncode == 0, result.stderr
    assert "predicted peak" in result.stdout and "overhead" in result.stdout
    assert "cli_example.py:" in result.stdout
    assert result.stdout.rstrip().endswith("wrote policy.json")
    assert "planning (time limit 60 s) ..." in result.stderr
    loss, args, budget = example
    assert autoremat.PolicyFile.read(path).budget_bytes == budget
    assert autoremat.load_plan(path, loss, *args) == autoremat.plan(loss, *args, budget=budget)


def test_report_prints_the_same_report_from_the_file_alone(planned, tmp_path):
    result, path = planned
    # Another directory, where the function cannot be imported: the file is enough.
    report = _run("report", str(path), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert report.stdout.startswith("made by autoremat 0.1.0 with jax ")
    table = result.stdout[result.stdout.index("budget"):result.stdout.index("\nplanned in")]
    assert table in report.stdout


def test_plan_from_a_factory_of_loss_and_args(workdir, example, planned, tmp_path):
    _, _, budget = example
    out = tmp_path / "factory.json"
    result = _run("plan", "cli_example:loss_and_args", "--budget", str(budget), "--out",
                  str(out), "--time-limit", "30", cwd=workdir)
    assert result.returncode == 0, result.stderr
    decisions = autoremat.PolicyFile.read(out).decisions
    assert decisions == autoremat.PolicyFile.read(planned[1]).decisions


def test_plan_a_zoo_model(tmp_path):
    result = _run("plan", "--model", "mlp-tiny", "--budget", "1.0", "--out", "mlp.json",
                  "--rows", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("mlp-tiny: ")
    assert (tmp_path / "mlp.json").exists()


@pytest.mark.parametrize("layout", ["tpu", "tiled"])
def test_plan_in_a_tpu_layout(tmp_path, layout):
    result = _run("plan", "--model", "mlp-tiny", "--budget", "1.0", "--out", "mlp.json",
                  "--rows", "0", "--layout", layout, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"layout            {layout} (bytes of the " in result.stdout
    assert autoremat.PolicyFile.read(tmp_path / "mlp.json").layout == layout


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="the TPU compiler is an optional extra: pip install -e '.[tpu]'")
def test_plan_verified_on_the_tpu_compiler(tmp_path):
    result = _run("plan", "--model", "mlp-tiny", "--budget", "1MiB", "--verify", "tpu-v5e",
                  "--refine-rounds", "1", "--out", "mlp.json", "--rows", "0", cwd=tmp_path,
                  timeout=300)
    assert result.returncode == 0, result.stderr
    assert "compiler peak" in result.stdout and "tpu-v5e" in result.stdout
    file = autoremat.PolicyFile.read(tmp_path / "mlp.json")
    assert file.target == "tpu-v5e" and file.verified_peak_bytes <= file.budget_bytes


def test_plan_verify_names_the_targets(tmp_path):
    result = _run("plan", "--model", "mlp-tiny", "--budget", "0.5", "--verify", "tpu-v9",
                  "--out", "mlp.json", cwd=tmp_path)
    assert result.returncode == 2 and "tpu-v5e" in result.stderr
    assert "Traceback" not in result.stderr


def test_console_script_imports_from_the_working_directory(workdir, tmp_path):
    script = pathlib.Path(sys.executable).parent / "autoremat"
    if not script.exists():
        pytest.skip("the autoremat console script is not installed (pip install -e .)")
    result = _run("plan", "cli_example:loss_and_args", "--budget", "1.0", "--out",
                  str(tmp_path / "p.json"), cwd=workdir, command=(str(script),))
    assert result.returncode == 0, result.stderr


def test_plan_below_the_floor_says_the_floor(workdir, example, tmp_path):
    loss, args, _ = example
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        autoremat.plan(loss, *args, budget=1024)
    out = tmp_path / "p.json"
    result = _run("plan", "cli_example:loss_and_args", "--budget", "1KiB", "--out", str(out),
                  cwd=workdir)
    assert result.returncode == 1
    assert f"the smallest feasible budget is {info.value.floor_bytes} bytes" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


_PLAN = ("plan", "cli_example:loss_and_args", "--budget", "1.0", "--out", "p.json")


@pytest.mark.parametrize("args, message", [
    (("plan", "cli_example", "--budget", "1.0", "--out", "p.json"),
     "'cli_example' is not MODULE:NAME"),
    (("plan", "no_such_module:f", "--budget", "1.0", "--out", "p.json"),
     "cannot import 'no_such_module'"),
    (("plan", "cli_example:nothing", "--budget", "1.0", "--out", "p.json"),
     "module 'cli_example' has no attribute 'nothing'"),
    (("plan", "cli_example:NOT_CALLABLE", "--budget", "1.0", "--out", "p.json"),
     "cli_example:NOT_CALLABLE is not callable (int)"),
    (("plan", "cli_example:loss", "--budget", "1.0", "--out", "p.json"),
     "it takes arguments: give its example arguments with --args"),
    (("plan", "cli_example:not_a_pair", "--budget", "1.0", "--out", "p.json"),
     "its first item is a ShapeDtypeStruct, not a function"),
    (("plan", "cli_example:loss", "--args", "cli_example:loss", "--budget", "1.0", "--out",
      "p.json"), "'--args': it must be callable with no arguments"),
    (("plan", "--budget", "1.0", "--out", "p.json"), "give FUNCTION (MODULE:NAME) or --model"),
    (("plan", "--model", "no-such-model", "--budget", "1.0", "--out", "p.json"),
     "'no-such-model' is not one of"),
    (_PLAN[:3] + ("lots",) + _PLAN[4:], "budget 'lots' is malformed"),
    (_PLAN + ("--time-limit", "0"), "0.0 is not in the range x>0"),
    (_PLAN[:5] + ("no/such/dir/p.json",), "directory 'no/such/dir' does not exist"),
    (("report", "missing.json"), "cannot read 'missing.json': No such file or directory"),
    (("report", "cli_example.py"), "cli_example.py is not JSON"),
])
def test_bad_arguments_are_usage_errors(workdir, args, message):
    result = _run(*args, cwd=workdir)
    assert result.returncode == 2, result.stderr
    assert "Usage:" in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (workdir / "p.json").exists()


def test_report_of_a_foreign_or_tampered_file_names_the_field(workdir, planned, tmp_path):
    _, path = planned
    foreign = tmp_path / "package.json"
    foreign.write_text('{"name": "left-pad", "version": "1.3.0"}')
    tampered = tmp_path / "tampered.json"
    tampered.write_text(path.read_text().replace('"version": 2', '"version": 7'))
    for file, message in [(foreign, "field 'format' is missing"),
                          (tampered, "has format version 7")]:
        result = _run("report", str(file), cwd=workdir)
        assert result.returncode == 2 and message in result.stderr
        assert "Traceback" not in result.stderr


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_shows_the_solvers_figures_then_erases():
    stream = _Terminal()
    with _progress("planning", stream) as progress:
        progress(1.0, 2e9, 1.5e9)
    text = stream.getvalue()
    assert "planning 0 s  best" in text
    assert "best 2 GFLOP, bound 1.5 GFLOP, gap 25.00%" in text
    assert text.endswith("\033[2K")  # the line erased


@pytest.mark.parametrize("show", [None, False])
def test_progress_elsewhere_prints_the_label_once(show):
    stream = io.StringIO()
    with _progress("planning", stream, show=show) as progress:
        assert progress is None
    assert stream.getvalue() == "planning ...\n"


def test_progress_asked_for_elsewhere_prints_a_line_per_better_plan_or_few_seconds():
    stream = io.StringIO()
    with _progress("planning", stream, show=True) as progress:
        for elapsed, best, bound in [(0.4, 100.0, -math.inf), (1, 90.0, 50.0), (2, 90.0, 60.0),
                                     (7, 90.0, 70.0)]:
            progress(elapsed, best, bound)
    assert stream.getvalue() == ("planning ...\n"
                                 "  0 s: best 100 FLOP, no bound yet\n"
                                 "  1 s: best 90 FLOP, bound 50 FLOP, gap 44.44%\n"
                                 "  7 s: best 90 FLOP, bound 70 FLOP, gap 22.22%\n")


def test_plan_with_progress_and_a_maxtext_configuration(tmp_path):
    result = _run("plan", "--model", "gpt2-small-tiny", "--budget", "0.7", "--out", "p.json",
                  "--maxtext", "remat.yml", "--progress", "--rows", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "FLOP, bound " in result.stderr  # not a terminal: lines of text
    assert result.stdout.rstrip().endswith("wrote remat.yml (MaxText remat_policy: custom)")
    config = yaml.safe_load((tmp_path / "remat.yml").read_text())
    assert config.pop("remat_policy") == "custom"
    assert config == {"qkv_proj": "device", "context": "device", "out_proj": "device",
                      "mlpwi": "device", "mlpwo": "device"}


def test_plan_considers_nested_placements_on_request(tmp_path):
    result = _run("plan", "--model", "gpt2-small-scan-tiny", "--budget", "floor",
                  "--nested-scans", "--out", "p.json", "--rows", "0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # Four layers in groups of two keep as many carries as four checkpoints: not chosen.
    assert autoremat.PolicyFile.read(tmp_path / "p.json").placement.scan_groups == ()
    # A 4-layer MLP in 6 regions, whose floor nests them in groups of 2
    # (tests/test_plan.py::test_nested_segments_lower_the_floor_and_apply_as_planned).
    result = _run("plan", "tests.models:mlp", "--budget", "floor", "--nested-segments",
                  "--out", str(tmp_path / "p.json"), "--rows", "0",
                  cwd=pathlib.Path(__file__).parent.parent)
    assert result.returncode == 0, result.stderr
    assert autoremat.PolicyFile.read(tmp_path / "p.json").placement.segment_group == 2


def test_maxtext_configuration_of_a_function_without_names_is_an_error(workdir, tmp_path):
    result = _run("plan", "cli_example:loss_and_args", "--budget", "1.0", "--out",
                  str(tmp_path / "p.json"), "--maxtext", str(tmp_path / "remat.yml"),
                  cwd=workdir)
    assert result.returncode == 1
    assert (tmp_path / "p.json").exists() and not (tmp_path / "remat.yml").exists()
    assert "no MaxText configuration written: no tensor" in result.stderr


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


def test_bench_writes_table_json_and_pareto_plot(tmp_path):
    out = tmp_path / "results"
    result = _run("bench", "--model", "gpt2-small-tiny", "--target", "none", "--budgets", "3",
                  "--time-limit", "20", "--out", str(out), timeout=300)
    assert result.returncode == 0, result.stderr
    table = (out / "gpt2-small-tiny.md").read_text()
    assert "| builtin | nothing_saveable |" in table and "| autoremat | floor |" in table
    data = json.loads((out / "gpt2-small-tiny.json").read_text())
    assert data["command"].startswith("autoremat bench") and data["versions"]["jax"] == "0.10.2"
    assert sum(r["kind"] == "autoremat" for r in data["rows"]) == 4
    png = (out / "gpt2-small-tiny.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_bench_unknown_model_is_a_usage_error(tmp_path):
    result = _run("bench", "--model", "gpt5", "--out", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "gpt2-small" in result.stderr


def test_bench_corpus_sweeps_a_corpus_model_and_writes_the_summary(tmp_path):
    corpus = pathlib.Path(__file__).parents[1] / "bench" / "corpus"
    result = _run("bench", "--corpus", str(corpus), "--model", "eqx-mlp-tiny", "--target",
                  "none", "--budgets", "2", "--out", str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "corpus" / "eqx-mlp-tiny.json").exists()
    summary = (tmp_path / "corpus.md").read_text()
    assert "| model | no remat MiB | hand MiB |" in summary
    assert "| eqx-mlp-tiny | not compiled |" in summary  # no compiler: nothing to compare
    unknown = _run("bench", "--corpus", str(corpus), "--model", "gpt2-small",
                   "--out", str(tmp_path))
    assert unknown.returncode == 2 and "not in the corpus" in unknown.stderr
