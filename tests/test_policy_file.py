"""Policy files: save, load in a new process, mismatches, and invalid files."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest

import autoremat
from autoremat._policy_file import SCHEMA
from tests.models import MODELS

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _float_argnums(args: tuple) -> tuple[int, ...]:
    return tuple(i for i, a in enumerate(args)
                 if all(jnp.issubdtype(x.dtype, jnp.inexact) for x in jax.tree.leaves(a)))


def _mid_plan(loss, args) -> autoremat.Plan:
    """The plan halfway between the smallest feasible budget and the no-remat peak."""
    top = autoremat.plan(loss, *args, budget=1.0)
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        autoremat.plan(loss, *args, budget=1)
    return autoremat.plan(loss, *args, budget=(info.value.floor_bytes + top.budget_bytes) // 2)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Per model: (loss, args, plan, path of its policy file), planned once."""
    cache = {}

    def get(model: str):
        if model not in cache:
            loss, args = MODELS[model]()
            plan = _mid_plan(loss, args)
            path = tmp_path_factory.mktemp("policy") / f"{model}.json"
            plan.save(path)
            cache[model] = loss, args, plan, path
        return cache[model]

    return get


_LOAD_IN_NEW_PROCESS = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    import autoremat
    from tests.models import MODELS
    from tests.test_policy_file import _float_argnums

    model, path, out = sys.argv[1:]
    loss, args = MODELS[model]()
    plan = autoremat.load_plan(path, loss, *args)
    grads = jax.jit(jax.grad(plan.apply(loss), argnums=_float_argnums(args)))(*args)
    np.savez(out, *jax.tree.leaves(grads))
    print(json.dumps({"saved": sorted(plan.saved), "recomputed": sorted(plan.recomputed),
                      "figures": [plan.budget_bytes, plan.peak_bytes, plan.saved_bytes,
                                  plan.recompute_flops, plan.step_flops,
                                  plan.no_remat_peak_bytes, plan.status, plan.gap]}))
""")


@pytest.mark.parametrize("model", ["mlp", pytest.param("gpt2_unrolled", marks=pytest.mark.slow),
                                   "gpt2_scanned"])
def test_load_in_a_new_process_gives_the_same_plan_and_gradients(model, saved, tmp_path):
    loss, args, plan, path = saved(model)
    assert plan.saved and (plan.recomputed or model == "mlp")
    out = tmp_path / "grads.npz"
    env = {**os.environ, "JAX_PLATFORMS": "cpu",  # the parent's path: the same packages
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-c", _LOAD_IN_NEW_PROCESS, model, str(path), str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded["saved"] == sorted(plan.saved)
    assert loaded["recomputed"] == sorted(plan.recomputed)
    assert loaded["figures"] == [plan.budget_bytes, plan.peak_bytes, plan.saved_bytes,
                                 plan.recompute_flops, plan.step_flops,
                                 plan.no_remat_peak_bytes, plan.status, plan.gap]
    expected = jax.jit(jax.grad(plan.apply(loss), argnums=_float_argnums(args)))(*args)
    with np.load(out) as grads:
        actual = [grads[f"arr_{i}"] for i in range(len(grads.files))]
    for g0, g1 in zip(jax.tree.leaves(expected), actual, strict=True):
        np.testing.assert_array_equal(np.asarray(g0), g1)


def test_loaded_plan_equals_the_saved_plan(saved):
    loss, args, plan, path = saved("gpt2_scanned")
    loaded = autoremat.load_plan(path, loss, *args)
    assert loaded == plan
    assert loaded.report() == plan.report()


def test_verified_target_is_kept(saved, tmp_path):
    loss, args, plan, _ = saved("mlp")
    verified = dataclasses.replace(plan, verified_peak_bytes=plan.peak_bytes + 512,
                                   verify_target="tpu-v5e")
    verified.save(tmp_path / "verified.json")
    doc = json.loads((tmp_path / "verified.json").read_text())
    assert doc["plan"]["target"] == "tpu-v5e"
    assert autoremat.load_plan(tmp_path / "verified.json", loss, *args) == verified
    assert "verified on tpu-v5e" in verified.report()


def test_verified_plan_modelled_over_its_budget_loads(saved, tmp_path):
    # The closed loop keeps a plan the compiler fits whatever the model predicts.
    loss, args, plan, _ = saved("mlp")
    verified = dataclasses.replace(plan, budget_bytes=plan.peak_bytes - 1024,
                                   verified_peak_bytes=plan.peak_bytes - 2048,
                                   verify_target="tpu-v5e")
    verified.save(tmp_path / "verified.json")
    assert autoremat.load_plan(tmp_path / "verified.json", loss, *args) == verified
    unverified = dataclasses.replace(verified, verified_peak_bytes=None, verify_target=None)
    unverified.save(tmp_path / "unverified.json")
    with pytest.raises(autoremat.PolicyMismatchError, match="over the file's budget"):
        autoremat.load_plan(tmp_path / "unverified.json", loss, *args)


def test_source_tree_never_installed_saves_and_loads(saved, tmp_path, monkeypatch):
    import importlib.metadata

    def version(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    loss, args, plan, _ = saved("mlp")
    monkeypatch.setattr(importlib.metadata, "version", version)
    plan.save(tmp_path / "plan.json")
    assert json.loads((tmp_path / "plan.json").read_text())["producer"]["autoremat"] == "unknown"
    assert autoremat.load_plan(tmp_path / "plan.json", loss, *args) == plan


def test_file_round_trips_and_follows_the_schema(saved):
    _, _, plan, path = saved("gpt2_unrolled")
    policy = autoremat.PolicyFile.read(path)
    assert policy == autoremat.PolicyFile.from_plan(plan)
    assert autoremat.PolicyFile.from_json(policy.to_json()) == policy
    doc = json.loads(path.read_text())
    jsonschema.validate(doc, SCHEMA)
    assert doc["format"] == "autoremat.policy" and doc["version"] == 2
    assert doc["producer"] == {"autoremat": "0.1.0", "jax": jax.__version__}
    assert doc["plan"]["budget_bytes"] == plan.budget_bytes
    assert doc["program"]["fingerprint"] == plan.graph.fingerprint
    # Decisions name sites, not value ids; one holding in every layer is said once.
    assert {"source", "primitive", "shape", "dtype", "occurrences"} <= set(doc["decisions"][0])
    every_layer = [d for d in policy.decisions if d.occurrences is None and d.of >= 4]
    assert every_layer
    covered = sum(d.count for d in policy.decisions)
    assert covered == len(plan.saved) + len(plan.recomputed)


def test_file_still_matches_after_the_code_moves(saved, tmp_path):
    loss, args, plan, path = saved("mlp")
    moved = tmp_path / "moved.json"
    moved.write_text(path.read_text().replace(str(ROOT), "/elsewhere/checkout"))
    assert autoremat.load_plan(moved, loss, *args) == plan


def _mismatch(path, loss, *args) -> autoremat.PolicyMismatchError:
    with pytest.raises(autoremat.PolicyMismatchError) as info:
        autoremat.load_plan(path, loss, *args)
    assert isinstance(info.value, autoremat.PlanMismatchError)  # and so a ValueError
    assert "Plan again" in str(info.value)
    return info.value


def test_other_batch_shape_lists_the_shapes(saved):
    loss, (params, x), _, path = saved("mlp")
    error = _mismatch(path, loss, params, x[:12])
    assert error.differences
    assert all("shape (256, 48) in the file, (12, 48) in the function" in d
               for d in error.differences)
    assert "models.py:" in str(error)


def test_fewer_layers_lists_the_counts(saved):
    loss, (params, x), _, path = saved("mlp")
    error = _mismatch(path, loss, params[:3], x)
    assert any("4 values in the file, 3 in the function" in d for d in error.differences)


def test_other_dtype_lists_the_dtypes(saved):
    loss, (params, x), _, path = saved("mlp")
    bf16 = lambda t: jax.tree.map(lambda a: a.astype(jnp.bfloat16), t)
    error = _mismatch(path, loss, bf16(params), bf16(x))
    assert any("dtype float32 in the file, bfloat16 in the function" in d
               for d in error.differences)


def _edited(path: pathlib.Path, tmp_path: pathlib.Path, edit) -> pathlib.Path:
    doc = json.loads(path.read_text())
    edit(doc)
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(doc))
    return out


def test_dropped_decision_is_not_a_valid_plan(saved, tmp_path):
    loss, args, _, path = saved("gpt2_unrolled")
    edited = _edited(path, tmp_path, lambda d: d["decisions"].pop(
        next(i for i, x in enumerate(d["decisions"]) if x["action"] == "save")))
    error = _mismatch(edited, loss, *args)
    assert any("neither saved nor recomputed" in d or "is not available" in d
               for d in error.differences)


def test_budget_below_the_decisions_peak_is_a_mismatch(saved, tmp_path):
    loss, args, plan, path = saved("mlp")
    edited = _edited(path, tmp_path, lambda d: d["plan"].update(budget_bytes=plan.peak_bytes - 1))
    error = _mismatch(edited, loss, *args)
    assert error.differences == ((f"predicted peak: {plan.peak_bytes} bytes for the function, "
                                 f"over the file's budget of {plan.peak_bytes - 1} bytes"),)


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def edit(doc):
        for k in keys[:-1]:
            doc = doc[k]
        doc[keys[-1]] = value

    return edit


@pytest.mark.parametrize("edit, field, message", [
    (_set("decisions", 0, "shape", "big"), "decisions[0].shape", "'big' is not of type 'array'"),
    (_set("decisions", 0, "shape", 0, -1), "decisions[0].shape[0]", "-1 is less than the minimum"),
    (_set("decisions", 0, "action", "discard"), "decisions[0].action",
     "'discard' is not one of ['save', 'recompute', 'offload']"),
    (_set("decisions", 0, "occurrences", [0, 0]), "decisions[0].occurrences", "non-unique"),
    (_set("decisions", 0, "occurrences", "some"), "decisions[0].occurrences",
     "'some' is not 'all' or a list of distinct occurrence numbers"),
    (_set("decisions", 0, "occurrences", [99]), "decisions[0].occurrences",
     "occurrence 99 is not below 'of'"),
    (_set("plan", "budget_bytes", True), "plan.budget_bytes", "True is not of type 'integer'"),
    (_set("plan", "extra", 1), "plan.extra", "not a field of format version 2"),
    (lambda doc: doc["plan"].pop("peak_bytes"), "plan.peak_bytes", "missing"),
    (_set("program", "regions", 0, "kind", "loop"), "program.regions[0].kind",
     "'loop' is not one of"),
])
def test_tampered_file_names_the_field(saved, tmp_path, edit, field, message):
    _, _, _, path = saved("mlp")
    edited = _edited(path, tmp_path, edit)
    with pytest.raises(autoremat.PolicyFileError) as info:
        autoremat.PolicyFile.read(edited)
    assert info.value.field == field
    assert str(info.value).startswith(f"{edited}: field {field}: ")
    assert message in str(info.value)
    assert "write it again with Plan.save" in str(info.value)


def test_other_format_version_is_refused(saved, tmp_path):
    loss, args, _, path = saved("mlp")
    edited = _edited(path, tmp_path, _set("version", 3))
    with pytest.raises(autoremat.PolicyFileError, match="has format version 3; this autoremat "
                       r"\(0.1.0\) reads versions 1 and 2\. Plan again") as info:
        autoremat.load_plan(edited, loss, *args)
    assert info.value.field == "version"


def _as_version_1(doc):
    """A version-2 file as version 1 wrote it: the placement's fields in ``program``."""
    doc["version"] = 1
    doc["program"].update(doc["program"].pop("placement"))


@pytest.mark.parametrize("model", ["mlp", "gpt2_scanned"])
def test_version_1_file_loads_the_same_plan(saved, tmp_path, model):
    loss, args, plan, path = saved(model)
    old = _edited(path, tmp_path, _as_version_1)
    loaded = autoremat.load_plan(old, loss, *args)
    assert (loaded.placement, loaded.saved, loaded.recomputed, loaded.peak_bytes) == (
        plan.placement, plan.saved, plan.recomputed, plan.peak_bytes)
    doc = json.loads(old.read_text())
    doc["program"]["extra"] = 1
    old.write_text(json.dumps(doc))
    with pytest.raises(autoremat.PolicyFileError, match="not a field of format version 1"):
        autoremat.PolicyFile.read(old)


@pytest.mark.parametrize("text", ['{"name": "left-pad", "version": "1.3.0"}', "[1, 2]",
                                  '{"format": "something-else"}'])
def test_foreign_json_is_not_a_policy_file(tmp_path, text):
    path = tmp_path / "foreign.json"
    path.write_text(text)
    with pytest.raises(autoremat.PolicyFileError, match="is not an autoremat policy file: field "
                       "'format' is") as info:
        autoremat.PolicyFile.read(path)
    assert info.value.field == "format"


@pytest.mark.parametrize("data", [b'{"format": "autoremat.policy", "vers', b"\x89PNG\r\n\x1a\n"])
def test_corrupted_file_is_not_json(tmp_path, data):
    path = tmp_path / "corrupt.json"
    path.write_bytes(data)
    with pytest.raises(autoremat.PolicyFileError, match="is not JSON") as info:
        autoremat.PolicyFile.read(path)
    assert info.value.field is None
