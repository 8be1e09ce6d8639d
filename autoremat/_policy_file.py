"""Policy files: a plan's decisions as versioned JSON, matched to a re-traced function.

A decision names the values it covers by *site* and *occurrence*, not by autoremat's
internal value ids: the site is where and how the value is made (source ``file:line``,
primitive, shape, dtype), and the occurrence counts the values made at that site in
program order. An unrolled layer run twelve times makes twelve values at each of its
sites; when a decision holds at every one of them the file says so once
(``"occurrences": "all"``). Sites compare the source by file name and line, so a file
still matches after the code moves to another directory.

The file also holds the plan's budget and predicted figures and the program's regions,
enough to print the plan's report without the function. Loading (see
:func:`autoremat.load_plan`) re-traces the function, finds every decision's values,
checks that together they are a valid plan, and recomputes the predicted figures.

Format (version 2; :data:`SCHEMA` is the JSON Schema)::

    {"format": "autoremat.policy", "version": 2,
     "producer": {"autoremat": "0.1.0", "jax": "0.10.2"},
     "plan": {"budget_bytes", "peak_bytes", "saved_bytes", "recompute_flops",
              "no_remat_peak_bytes", "step_flops", "status", "gap", "solve_seconds",
              "objective", "target", "verified_peak_bytes", "no_remat" (optional)},
     "program": {"fingerprint", "arg_bytes", "grad_bytes",
                 "placement": {"cuts", "scan_pieces", "scan_groups", "segment_group"}
                              (autoremat.Placement, absent fields at their defaults),
                 "layout": "dense", "tpu" or "tiled",
                 "regions": [{"kind", "length", "values"}, ...]},
     "offload": null or {"host_budget", "target", "overlap", "host_bandwidth",
                 "peak_flops", "regions", "scan_buffers"} (autoremat.OffloadConfig),
     "decisions": [{"action", "source", "primitive", "shape", "dtype", "nbytes",
                    "multiplicity", "recompute_flops", "occurrences", "of",
                    "held_bytes" (optional: nbytes x multiplicity)}, ...]}

Version 1 files still load: their ``program`` holds the placement's fields itself
(``cuts``, and optionally ``scan_pieces``, ``scan_groups``, ``segment_group``), and
``layout`` is optional.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import jax
import jsonschema
import jsonschema.exceptions
import numpy as np

from autoremat import _placement
from autoremat._errors import PolicyFileError, PolicyMismatchError
from autoremat._graph import Graph
from autoremat._layout import LAYOUTS, Layout
from autoremat._offload import OffloadConfig
from autoremat._placement import Placement
from autoremat._sites import (
    Decision,
    Site,
    decisions_of,
    site_difference,
    values_by_site,
)

if TYPE_CHECKING:
    from autoremat._plan import Plan

FORMAT = "autoremat.policy"
VERSION = 2
# What the solver minimized.
OBJECTIVE = "min_recompute_flops"

_COUNT = {"type": "integer", "minimum": 0}
_POSITIVE = {"type": "integer", "minimum": 1}
_TEXT = {"type": "string", "minLength": 1}


def _record(properties: Mapping[str, Any], optional: Mapping[str, Any] | None = None
            ) -> dict[str, Any]:
    return {"type": "object", "properties": {**properties, **(optional or {})},
            "required": list(properties), "additionalProperties": False}


def _program_record(version: int) -> dict[str, Any]:
    """The schema of a file's ``program`` in format ``version``."""
    common = {"fingerprint": _TEXT, "arg_bytes": _COUNT, "grad_bytes": _COUNT,
              "regions": {"type": "array", "items": _record({
                  "kind": {"enum": ["segment", "scan"]},
                  "length": _POSITIVE,
                  "values": _COUNT,
              })}}
    if version == 1:
        placement = _placement.SCHEMA["properties"]
        return _record({**common, "cuts": placement["cuts"]}, optional={
            "scan_pieces": placement["scan_pieces"], "scan_groups": placement["scan_groups"],
            "segment_group": placement["segment_group"], "layout": {"enum": list(LAYOUTS)}})
    return _record({**common, "placement": _placement.SCHEMA,
                    "layout": {"enum": list(LAYOUTS)}})


def _schema(version: int) -> dict[str, Any]:
    """The JSON Schema of a policy file in format ``version``."""
    return {
        "$id": f"urn:autoremat:policy:{version}",
        "title": f"autoremat policy file, version {version}",
        **_record({
            "format": {"const": FORMAT},
            "version": {"const": version},
            "producer": _record({"autoremat": _TEXT, "jax": _TEXT}),
            "plan": _record({
                "budget_bytes": _POSITIVE,
                "peak_bytes": _COUNT,
                "saved_bytes": _COUNT,
                "recompute_flops": _COUNT,
                "no_remat_peak_bytes": _COUNT,
                "step_flops": _COUNT,
                "status": {"enum": ["optimal", "feasible"]},
                "gap": {"type": "number", "minimum": 0},
                "solve_seconds": {"type": "number", "minimum": 0},
                "objective": _TEXT,
                "target": {"type": ["string", "null"], "minLength": 1},
                "verified_peak_bytes": {"type": ["integer", "null"], "minimum": 0},
            }, optional={"no_remat": {"type": "boolean"}}),
            "program": _program_record(version),
            "offload": {"oneOf": [{"type": "null"}, _record({
                "host_budget": _POSITIVE,
                "target": _TEXT,
                "overlap": {"type": "number", "minimum": 0, "maximum": 1},
                "host_bandwidth": {"type": ["number", "null"], "exclusiveMinimum": 0},
                "peak_flops": {"type": ["number", "null"], "exclusiveMinimum": 0},
                "regions": {"enum": ["scan", "all"]},
                "scan_buffers": _POSITIVE,
            })]},
            "decisions": {"type": "array", "items": _record({
                "action": {"enum": ["save", "recompute", "offload"]},
                "source": _TEXT,
                "primitive": _TEXT,
                "shape": {"type": "array", "items": _COUNT},
                "dtype": _TEXT,
                "nbytes": _COUNT,
                "multiplicity": _POSITIVE,
                "recompute_flops": _COUNT,
                "occurrences": {
                    "description": "'all' or a list of distinct occurrence numbers",
                    "oneOf": [
                        {"const": "all"},
                        {"type": "array", "items": _COUNT, "minItems": 1, "uniqueItems": True},
                    ],
                },
                "of": _POSITIVE,
            }, {"held_bytes": _COUNT})},
        }),
    }


SCHEMA = _schema(VERSION)
# The format versions this autoremat reads, with their validators.
_VALIDATORS = {v: jsonschema.Draft202012Validator(_schema(v)) for v in (1, VERSION)}


@dataclasses.dataclass(frozen=True)
class RegionSummary:
    """A remat region as the file records it: kind, iterations, and values made in it."""

    kind: str
    length: int
    values: int


@dataclasses.dataclass(frozen=True)
class PolicyFile:
    """A plan as stored in a policy file (see the module docstring for the format).

    Attributes:
      autoremat_version, jax_version: of the process that made the plan.
      objective: what the solver minimized (``"min_recompute_flops"``).
      target: the compiler target the plan was verified on (``Plan.verify_target``);
        ``None`` when its figures come from autoremat's memory model alone.
      verified_peak_bytes: the compiler's peak on ``target`` (``None`` without one).
      budget_bytes, peak_bytes, saved_bytes, recompute_flops, no_remat_peak_bytes,
        step_flops, status, gap, solve_seconds: as in :class:`autoremat.Plan`.
      fingerprint: the program's structure digest (``Graph.fingerprint``).
      arg_bytes, grad_bytes: bytes of the arguments and of their gradients.
      placement: where the program's regions are (``Plan.placement``).
      regions: the program's remat regions, in program order.
      decisions: every save, recompute and offload, in program order of their first value.
      offload: the offload configuration the plan was made with, or ``None``.
      layout: how the values' bytes are counted (``Plan.layout``).
      no_remat: the plan runs the function as written (``Plan.no_remat``); optional in the
        file, absent when false.

    Example:
      >>> import jax.numpy as jnp, autoremat
      >>> loss = lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w) ** 2)
      >>> w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
      >>> policy = autoremat.PolicyFile.from_plan(autoremat.plan(loss, w, x, budget="floor"))
      >>> autoremat.PolicyFile.from_json(policy.to_json()) == policy
      True
    """

    autoremat_version: str
    jax_version: str
    objective: str
    target: str | None
    verified_peak_bytes: int | None
    budget_bytes: int
    peak_bytes: int
    saved_bytes: int
    recompute_flops: int
    no_remat_peak_bytes: int
    step_flops: int
    status: str
    gap: float
    solve_seconds: float
    fingerprint: str
    arg_bytes: int
    grad_bytes: int
    placement: Placement
    regions: tuple[RegionSummary, ...]
    decisions: tuple[Decision, ...]
    offload: OffloadConfig | None = None
    layout: Layout = "dense"
    no_remat: bool = False

    @property
    def num_values(self) -> int:
        """Values in the program."""
        return sum(r.values for r in self.regions)

    @property
    def overhead(self) -> float:
        """Recomputed FLOPs over the FLOPs of the step without remat."""
        return self.recompute_flops / max(1, self.step_flops)

    @classmethod
    def from_plan(cls, plan: Plan) -> PolicyFile:
        """The policy file of ``plan``."""
        graph = plan.graph
        counts = np.bincount(graph.array("region"), minlength=len(graph.regions))
        return cls(
            autoremat_version=_versions()[0],
            jax_version=jax.__version__, objective=OBJECTIVE, target=plan.verify_target,
            verified_peak_bytes=plan.verified_peak_bytes,
            budget_bytes=plan.budget_bytes, peak_bytes=plan.peak_bytes,
            saved_bytes=plan.saved_bytes, recompute_flops=plan.recompute_flops,
            no_remat_peak_bytes=plan.no_remat_peak_bytes, step_flops=plan.step_flops,
            status=plan.status, gap=plan.gap, solve_seconds=plan.solve_seconds,
            fingerprint=graph.fingerprint, arg_bytes=graph.arg_bytes,
            grad_bytes=graph.grad_bytes, placement=plan.placement,
            regions=tuple(RegionSummary(r.kind, r.length, int(n))
                          for r, n in zip(graph.regions, counts, strict=True)),
            decisions=decisions_of(graph, plan.actions), offload=plan.offload,
            layout=plan.layout, no_remat=plan.no_remat)

    def to_json(self) -> str:
        """The file's text: objects one member a line, each decision on a line of its own."""
        return _dumps(self._to_dict()) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "policy file") -> PolicyFile:
        """Parses and validates a policy file's text.

        Args:
          text: the file's contents.
          where: how error messages name the file.

        Raises:
          PolicyFileError: the text is not JSON, not a policy file, of another format
            version, or a field is invalid; the message names the field.
        """
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PolicyFileError(f"{where} is not JSON ({e}); policy files are written "
                                  "by Plan.save and `autoremat plan --out`.") from None
        _check(doc, where)
        return cls._from_dict(doc)

    def write(self, path: str | os.PathLike) -> None:
        """Writes the file to ``path`` (UTF-8), replacing any file there."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json())

    @classmethod
    def read(cls, path: str | os.PathLike) -> PolicyFile:
        """Reads and validates the file at ``path`` (see :meth:`from_json`).

        Raises:
          OSError: the file cannot be read.
          PolicyFileError: the file is invalid.
        """
        with open(path, "rb") as f:
            return cls.from_json(f.read(), where=os.fspath(path))

    def locate(self, graph: Graph) -> tuple[dict[int, str], list[str]]:
        """The action on each value id of ``graph`` (a re-trace of the file's function) that
        the decisions name, and the differences found: regions or layout that differ, a
        decision whose values are not all found, a value named twice."""
        differences = self._region_differences(graph)
        chosen = self._locate(graph, differences)
        return chosen, differences

    def structure_differences(self, graph: Graph) -> list[str]:
        """How ``graph``'s program structure differs from the file's (values the plan
        neither saves nor recomputes may differ where every decision's values match)."""
        if graph.fingerprint == self.fingerprint:
            return []
        return [f"program structure: {self.fingerprint} in the file, {graph.fingerprint} in "
                "the function (values the plan neither saves nor recomputes differ)"]

    def mismatch(self, where: str, differences: Sequence[str]) -> PolicyMismatchError:
        """The error for ``differences`` between the file (at ``where``) and a function."""
        note = ""
        if (self.autoremat_version, self.jax_version) != _versions():
            here = _versions()
            note = (f"The file was made with autoremat {self.autoremat_version} and jax "
                    f"{self.jax_version}; this is autoremat {here[0]} and jax {here[1]}.\n")
        return PolicyMismatchError(where, list(dict.fromkeys(differences)), note)

    def _locate(self, graph: Graph, differences: list[str]) -> dict[int, str]:
        """The action on each value id of ``graph`` the decisions name; appends to
        ``differences`` each decision whose values are not found, and each value named
        twice."""
        by_site = values_by_site(graph)
        chosen: dict[int, str] = {}
        for d in self.decisions:
            values = by_site.get(d.site.key, [])
            if len(values) != d.of:
                differences.append(site_difference(d, values, by_site))
                continue
            for k in range(d.of) if d.occurrences is None else d.occurrences:
                if chosen.setdefault(values[k].id, d.action) != d.action:
                    differences.append(f"{d.site} #{k}: both saved and recomputed in the file")
        return chosen

    def _region_differences(self, graph: Graph) -> list[str]:
        counts = np.bincount(graph.array("region"), minlength=len(graph.regions))
        found = [RegionSummary(r.kind, r.length, int(n))
                 for r, n in zip(graph.regions, counts, strict=True)]
        if len(found) != len(self.regions):
            return [f"regions: {len(self.regions)} in the file, {len(found)} in the function"]
        out = [] if graph.layout == self.layout else [
            f"layout: {self.layout} in the file, {graph.layout} in the function's trace"]
        for i, (a, b) in enumerate(zip(self.regions, found, strict=True)):
            for field in ("kind", "length", "values"):
                if getattr(a, field) != getattr(b, field):
                    out.append(f"region {i}: {field} {getattr(a, field)} in the file, "
                               f"{getattr(b, field)} in the function")
        return out

    def _to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "producer": {"autoremat": self.autoremat_version, "jax": self.jax_version},
            "plan": {**{f: getattr(self, f) for f in _PLAN_FIELDS},
                     **({"no_remat": True} if self.no_remat else {})},
            "program": {"fingerprint": self.fingerprint, "arg_bytes": self.arg_bytes,
                        "grad_bytes": self.grad_bytes,
                        "placement": self.placement.to_json(),
                        "layout": self.layout,
                        "regions": [dataclasses.asdict(r) for r in self.regions]},
            "offload": None if self.offload is None else {
                **dataclasses.asdict(self.offload),
                "host_budget": self.offload.host_budget_bytes},
            "decisions": [{
                "action": d.action, "source": d.site.source, "primitive": d.site.primitive,
                "shape": list(d.site.shape), "dtype": d.site.dtype, "nbytes": d.nbytes,
                "multiplicity": d.multiplicity, "recompute_flops": d.recompute_flops,
                "held_bytes": d.held_bytes,
                "occurrences": "all" if d.occurrences is None else list(d.occurrences),
                "of": d.of,
            } for d in self.decisions],
        }

    @classmethod
    def _from_dict(cls, doc: Mapping[str, Any]) -> PolicyFile:
        program = doc["program"]
        return cls(
            autoremat_version=doc["producer"]["autoremat"], jax_version=doc["producer"]["jax"],
            **{f: doc["plan"][f] for f in _PLAN_FIELDS},
            fingerprint=program["fingerprint"], arg_bytes=program["arg_bytes"],
            grad_bytes=program["grad_bytes"],
            # Version 1 held the placement's fields in ``program`` itself.
            placement=Placement.from_json(program.get("placement", program)),
            layout=program.get("layout", "dense"), no_remat=doc["plan"].get("no_remat", False),
            regions=tuple(RegionSummary(**r) for r in program["regions"]),
            decisions=tuple(Decision(
                action=d["action"],
                site=Site(d["source"], d["primitive"], tuple(d["shape"]), d["dtype"]),
                occurrences=None if d["occurrences"] == "all" else tuple(d["occurrences"]),
                of=d["of"], nbytes=d["nbytes"], multiplicity=d["multiplicity"],
                recompute_flops=d["recompute_flops"],
                held_bytes=d.get("held_bytes", d["nbytes"] * d["multiplicity"]))
                for d in doc["decisions"]),
            offload=None if doc["offload"] is None else OffloadConfig(**doc["offload"]))


_PLAN_FIELDS = ("budget_bytes", "peak_bytes", "saved_bytes", "recompute_flops",
                "no_remat_peak_bytes", "step_flops", "status", "gap", "solve_seconds",
                "objective", "target", "verified_peak_bytes")


def _dumps(obj: Any, indent: str = "") -> str:
    """JSON text with objects one member a line and arrays of objects one element a line;
    anything inside an array stays on one line."""
    inner = indent + "  "
    if isinstance(obj, dict) and obj:
        members = [f"{inner}{json.dumps(k)}: {_dumps(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(members) + f"\n{indent}}}"
    if isinstance(obj, list) and obj and isinstance(obj[0], dict):
        items = [f"{inner}{json.dumps(v, allow_nan=False)}" for v in obj]
        return "[\n" + ",\n".join(items) + f"\n{indent}]"
    return json.dumps(obj, allow_nan=False)


def _versions() -> tuple[str, str]:
    """This autoremat's and jax's versions; autoremat's is ``"unknown"`` where it runs from
    a source tree that was never installed."""
    try:
        return importlib.metadata.version("autoremat"), jax.__version__
    except importlib.metadata.PackageNotFoundError:
        return "unknown", jax.__version__


def _field(path: Sequence[str | int]) -> str:
    """``["decisions", 2, "shape"] -> "decisions[2].shape"``."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _check(doc: Any, where: str) -> None:
    """Raises :class:`PolicyFileError` unless ``doc`` is a valid policy file of a format
    version this autoremat reads."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = (f"is {doc['format']!r}" if isinstance(doc, dict) and "format" in doc
                 else "is missing")
        raise PolicyFileError(
            f"{where} is not an autoremat policy file: field 'format' {found}, expected "
            f"{FORMAT!r}.", field="format")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version not in _VALIDATORS:
        found = (f"format version {doc['version']!r}" if "version" in doc
                 else "no format version")
        raise PolicyFileError(
            f"{where} has {found}; this autoremat ({_versions()[0]}) reads versions "
            f"{' and '.join(map(str, _VALIDATORS))}. "
            "Plan again with this version, or load the file with the autoremat that wrote "
            "it.", field="version")
    error = jsonschema.exceptions.best_match(_VALIDATORS[version].iter_errors(doc))
    if error is not None:
        path, message = list(error.absolute_path), error.message
        if error.validator == "required":
            path.append(next(k for k in error.validator_value if k not in error.instance))
            message = "missing"
        elif error.validator == "additionalProperties":
            path.append(next(k for k in error.instance if k not in error.schema["properties"]))
            message = f"not a field of format version {version}"
        elif error.validator == "oneOf":
            message = f"{error.instance!r} is not {error.schema['description']}"
        _invalid(where, _field(path), message)
    if (doc["plan"]["target"] is None) != (doc["plan"]["verified_peak_bytes"] is None):
        _invalid(where, "plan.verified_peak_bytes", "null exactly when plan.target is null")
    for i, d in enumerate(doc["decisions"]):
        if d["occurrences"] != "all" and max(d["occurrences"]) >= d["of"]:
            _invalid(where, f"decisions[{i}].occurrences",
                     f"occurrence {max(d['occurrences'])} is not below 'of' ({d['of']})")


def _invalid(where: str, field: str, message: str) -> NoReturn:
    raise PolicyFileError(f"{where}: field {field}: {message}. The file is damaged or was "
                          "edited; write it again with Plan.save or `autoremat plan --out`.",
                          field=field)


def save_plan(plan: Plan, path: str | os.PathLike) -> None:
    """Writes ``plan`` to a policy file at ``path`` (JSON), for :func:`autoremat.load_plan`
    and ``autoremat report``; replaces any file there.

    Args:
      plan: the plan.
      path: where to write it.

    Example:
      >>> import os, tempfile, jax.numpy as jnp, autoremat
      >>> loss = lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w) ** 2)
      >>> w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
      >>> path = os.path.join(tempfile.mkdtemp(), "plan.json")
      >>> autoremat.save_plan(autoremat.plan(loss, w, x, budget=1.0), path)
      >>> autoremat.load_plan(path, loss, w, x).recompute_flops
      0
    """
    PolicyFile.from_plan(plan).write(path)
