"""Every public name has a docstring in the ecosystem's form, and its examples run."""

from __future__ import annotations

import dataclasses
import doctest
import enum
import importlib
import inspect

import autoremat_ilp
import pytest

import autoremat
from autoremat import zoo

MODULES = ["autoremat", "autoremat.zoo", "autoremat_solvers", "autoremat_ilp",
           "autoremat.integrations.flax_nnx", "autoremat.integrations.equinox",
           "autoremat.integrations.optax"]


def _public() -> list[tuple[str, object]]:
    out = []
    for name in MODULES:
        module = importlib.import_module(name)
        out += [(f"{name}.{n}", getattr(module, n)) for n in module.__all__]
    return out


PUBLIC = _public()
# Names whose example is the walk-through of another public record.

_SHOWN_IN = {f"autoremat_ilp.{n}": autoremat_ilp.Problem for n in (
    "solve", "Solution", "solve_min_peak", "evaluate", "stage_bytes", "violations", "prune",
    "host_bytes", "build_model", "Model")} | {
    f"autoremat_ilp.{n}": autoremat_ilp.Milp for n in ("solve_milp", "MilpResult")}
CALLABLES = [(n, o) for n, o in PUBLIC if inspect.isfunction(o) or inspect.isclass(o)]


def _is_error(obj: object) -> bool:
    return inspect.isclass(obj) and issubclass(obj, BaseException)


@pytest.mark.parametrize(("name", "obj"), CALLABLES, ids=[n for n, _ in CALLABLES])
def test_docstring_states_args_returns_and_an_example(name, obj):
    doc = inspect.getdoc(obj)
    assert doc, f"{name} has no docstring"
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj):
            assert "Attributes:" in doc, name
    else:
        signature = inspect.signature(obj)
        if signature.parameters:
            assert "Args:" in doc, name
        if signature.return_annotation not in ("None", None, inspect.Signature.empty):
            assert "Returns:" in doc, name
    if not _is_error(obj) and not isinstance(obj, enum.EnumMeta):
        shown_in = _SHOWN_IN.get(name)
        if shown_in is None:
            assert ">>>" in doc, f"{name} has no example"
        else:  # one walk-through example shows the ILP's pieces together
            example = inspect.getdoc(shown_in).split("Example:", 1)[1]
            assert name.rsplit(".", 1)[1] in example, f"{name} is not in its example"


def _examples() -> list[doctest.DocTest]:
    finder, seen, tests = doctest.DocTestFinder(recurse=False), set(), []
    for name, obj in CALLABLES:
        for test in finder.find(obj, name, globs={"jax": __import__("jax"), "autoremat": autoremat,
                                                  "zoo": zoo}):
            if test.examples and test.name not in seen:
                seen.add(test.name)
                tests.append(test)
    return tests


EXAMPLES = _examples()


@pytest.mark.parametrize("test", EXAMPLES, ids=[t.name for t in EXAMPLES])
def test_example_runs(test):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.failures == 0, f"{test.name}: {runner.failures} failing examples"
