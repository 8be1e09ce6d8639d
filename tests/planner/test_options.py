"""One options record for every entry point: ``plan``, ``optimize``, the CLI, the benchmark."""

from __future__ import annotations

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import pytest

import autoremat
from autoremat import _benchmark, _measure
from autoremat._cli import _PLAN_OPTIONS


def _fields() -> set[str]:
    return {f.name for f in dataclasses.fields(autoremat.PlanOptions)}


def test_plan_takes_exactly_the_options_and_the_budget():
    keywords = {name for name, p in inspect.signature(autoremat.plan).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == _fields() | {"budget"}


def test_plan_defaults_are_the_options_defaults():
    params = inspect.signature(autoremat.plan).parameters
    for field in dataclasses.fields(autoremat.PlanOptions):
        assert params[field.name].default == field.default, field.name


def test_verify_by_default_on_this_machines_accelerator_only(monkeypatch):
    # No accelerator here (CI's machines have none): the model's plan, said not compiled.
    if jax.default_backend() == "cpu":
        assert autoremat.local_target() is None and autoremat.PlanOptions().verify is None
    w, x = jnp.ones((32, 32)) / 32, jnp.ones((16, 32))
    loss = lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w) ** 2)
    if autoremat.local_target() is None:
        plan = autoremat.plan(loss, w, x, budget="floor")
        assert "not compiled" in plan.report() and plan.layout == "dense"
    # A process on a TPU: its own compile ("tpu"), counted in TPU tiles.
    monkeypatch.setattr(_measure, "local_target", lambda: "tpu")
    assert autoremat.PlanOptions().verify == "tpu"
    assert autoremat.PlanOptions().resolved_layout == "tiled"
    # The same calls compile, ahead of time here for want of a TPU, for a TPU v5e.
    pytest.importorskip("libtpu")
    monkeypatch.setattr(_measure, "local_target", lambda: "tpu-v5e")
    assert autoremat.PlanOptions().verify == "tpu-v5e"
    assert autoremat.PlanOptions(verify=None).verify is None
    plan = autoremat.plan(loss, w, x, budget="floor")
    assert plan.verify_target == "tpu-v5e" and plan.verify_compiles >= 1
    assert "verified on tpu-v5e" in plan.report()
    assert plan.layout == "tiled"  # counted as the TPU stores arrays, in tiles


@pytest.mark.parametrize("options, layout", [
    ({}, "dense"),
    ({"verify": "tpu-v5e"}, "tiled"),
    ({"verify": "tpu-v6e"}, "tiled"),
    ({"verify": "gpu"}, "dense"),
    ({"verify": "tpu-v5e", "layout": "dense"}, "dense"),
    ({"verify": None, "layout": "tpu"}, "tpu"),
])
def test_the_layout_follows_the_verify_target_unless_given(options, layout):
    options = autoremat.PlanOptions(**{"verify": None, **options})
    assert options.resolved_layout == layout
    # the CLI and the benchmark set the target on a record made before
    retargeted = dataclasses.replace(autoremat.PlanOptions(verify=None), **options.__dict__)
    assert retargeted.resolved_layout == layout


def test_optimize_takes_every_option_and_refuses_others():
    autoremat.optimize(lambda x: x, budget="1GiB", verify="tpu-v5e", refine_rounds=2,
                       op_times=None, progress=print, nested_scans=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'verfy'"):
        autoremat.optimize(lambda x: x, budget="1GiB", verfy="tpu-v5e")


@pytest.mark.parametrize("options, message", [
    ({"layout": "sparse"}, "layout must be one of"),
    ({"backends": ("GUROBI",)}, "choose from"),
    ({"verify_rounds": 0}, "verify_rounds must be 1 or more"),
    ({"refine_rounds": -1}, "refine_rounds must be 0 or more"),
    ({"time_limit_s": 0}, "time_limit_s must be positive"),
    ({"node_limit": 0}, "node_limit must be 1 or more"),
])
def test_bad_options_are_refused_when_made(options, message):
    with pytest.raises(ValueError, match=message):
        autoremat.PlanOptions(**options)
    with pytest.raises(ValueError, match=message):
        autoremat.optimize(lambda x: x, budget="1GiB", **options)


def test_the_cli_and_the_benchmark_take_the_record():
    cli = {o(lambda: None).__click_params__[0].name for o in _PLAN_OPTIONS}
    assert cli <= _fields()
    assert inspect.signature(_benchmark.sweep).parameters["options"].annotation in (
        "PlanOptions", autoremat.PlanOptions)
