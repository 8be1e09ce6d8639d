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
              "objective", "target", "verified_peak_bytes"},
     "program": {"fingerprint", "arg_bytes", "grad_bytes",
                 "placement": {"cuts", "scan_pieces", "scan_groups", "segment_group"}
                              (autoremat.Placement, absent fields at their defaults),
                 "layout": "dense" or "tpu",
                 "regions": [{"kind", "length", "values"}, ...]},
     "offload": null or {"host_budget", "target", "overlap", "host_bandwidth",
                 "peak_flops", "regions", "scan_buffers"} (autoremat.OffloadConfig),
     "decisions": [{"action", "source", "primitive", "shape", "dtype", "nbytes",
                    "multiplicity", "recompute_flops", "occurrences", "of"}, ...]}

Version 1 files still load: their ``program`` holds the placement's fields itself
(``cuts``, and optionally ``scan_pieces``, ``scan_groups``, ``segment_group``), and
``layout`` is optional.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import jax
import jsonschema
import numpy as np
from autoremat_solvers import policy as policy_model
from autoremat_solvers.milp import MilpStatus

from autoremat import _placement, _solve
from autoremat._graph import Graph, Value
from autoremat._layout import LAYOUTS, Layout
from autoremat._offload import OffloadConfig, offload_problem
from autoremat._placement import Placement
from autoremat._rewrite import PlanMismatchError

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
            }),
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
            })},
        }),
    }


SCHEMA = _schema(VERSION)
# The format versions this autoremat reads, with their validators.
_VALIDATORS = {v: jsonschema.Draft202012Validator(_schema(v)) for v in (1, VERSION)}
# Differences listed in a mismatch error before the rest are counted.
_MAX_LISTED = 20


class PolicyFileError(ValueError):
    """A policy file is not valid JSON, not a policy file, of another format version, or
    has an invalid field. ``field`` names the field (``None`` when the file is not JSON)."""

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(message)


class PolicyMismatchError(PlanMismatchError):
    """A policy file does not match the function and arguments it was loaded for.

    ``differences`` lists every difference found, one line each.
    """

    def __init__(self, where: str, differences: Sequence[str], note: str):
        self.differences = tuple(differences)
        listed = [f"  - {d}" for d in self.differences[:_MAX_LISTED]]
        if len(self.differences) > _MAX_LISTED:
            listed.append(f"  ... and {len(self.differences) - _MAX_LISTED} more")
        super().__init__(
            f"{where} does not match this function and these arguments:\n" + "\n".join(listed)
            + f"\n{note}Plan again for them (autoremat.plan then Plan.save, or `autoremat "
            "plan`), or load the file with the function and argument shapes it was made for.")


@dataclasses.dataclass(frozen=True)
class Site:
    """Where and how a value is made: the part of its identity that survives re-tracing.

    Attributes:
      source: ``file:line`` of the user code that made it.
      primitive: the producing primitive (``carry_in``/``xs_in`` for a scan body's inputs).
      shape, dtype: of one instance.
    """

    source: str
    primitive: str
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, value: Value) -> Site:
        return cls(value.source, value.primitive, tuple(value.shape), value.dtype)

    @property
    def key(self) -> tuple[str, str, tuple[int, ...], str]:
        """What two sites are compared by: the source's file name (not its directory)."""
        file, _, line = self.source.rpartition(":")
        source = f"{os.path.basename(file)}:{line}" if file and line.isdigit() else self.source
        return source, self.primitive, self.shape, self.dtype

    @property
    def array(self) -> str:
        """``float32[8,768]``."""
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"

    def __str__(self) -> str:
        return f"{self.source} {self.primitive} {self.array}"


@dataclasses.dataclass(frozen=True)
class Decision:
    """One action on some or all of the values made at one site.

    Attributes:
      action: ``"save"``, ``"recompute"`` or ``"offload"``.
      site: where the values are made.
      occurrences: which of the site's values, numbered from 0 in program order; ``None``
        for every one of them (for example the same value in every layer).
      of: how many values the function makes at the site.
      nbytes: bytes of one instance of one value.
      multiplicity: instances kept per value if saved (a scan's length).
      recompute_flops: FLOPs of recomputing one value in every iteration of its region.
    """

    action: str
    site: Site
    occurrences: tuple[int, ...] | None
    of: int
    nbytes: int
    multiplicity: int
    recompute_flops: int

    @property
    def count(self) -> int:
        """How many values the decision covers."""
        return self.of if self.occurrences is None else len(self.occurrences)


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
        action = {**dict.fromkeys(plan.saved, "save"),
                  **dict.fromkeys(plan.recomputed, "recompute"),
                  **dict.fromkeys(plan.offloaded, "offload")}
        flops = dict(zip(graph.array("id").tolist(), graph.recompute_flops().tolist()))
        by_site = _values_by_site(graph)
        groups: dict[tuple, list[int]] = {}
        for key, values in by_site.items():
            for k, v in enumerate(values):
                if v.id in action:
                    group = (action[v.id], key, v.multiplicity, flops[v.id])
                    groups.setdefault(group, []).append(k)
        decisions = []
        for (act, key, multiplicity, recompute_flops), occurrences in groups.items():
            first, of = by_site[key][0], len(by_site[key])
            decisions.append(Decision(
                action=act, site=Site.of(first),
                occurrences=None if len(occurrences) == of else tuple(occurrences), of=of,
                nbytes=first.nbytes, multiplicity=multiplicity,
                recompute_flops=int(recompute_flops)))
        order = {v.id: i for i, v in enumerate(graph.values)}
        first_value = lambda d: order[by_site[d.site.key][(d.occurrences or (0,))[0]].id]
        decisions.sort(key=lambda d: (first_value(d), d.action))
        counts = np.bincount(graph.array("region"), minlength=len(graph.regions))
        return cls(
            autoremat_version=importlib.metadata.version("autoremat"),
            jax_version=jax.__version__, objective=OBJECTIVE, target=plan.verify_target,
            verified_peak_bytes=plan.verified_peak_bytes,
            budget_bytes=plan.budget_bytes, peak_bytes=plan.peak_bytes,
            saved_bytes=plan.saved_bytes, recompute_flops=plan.recompute_flops,
            no_remat_peak_bytes=plan.no_remat_peak_bytes, step_flops=plan.step_flops,
            status=plan.status, gap=plan.gap, solve_seconds=plan.solve_seconds,
            fingerprint=graph.fingerprint, arg_bytes=graph.arg_bytes,
            grad_bytes=graph.grad_bytes, placement=plan.placement,
            regions=tuple(RegionSummary(r.kind, r.length, int(n))
                          for r, n in zip(graph.regions, counts)),
            decisions=tuple(decisions), offload=plan.offload, layout=plan.layout)

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

    def match(self, graph: Graph, where: str = "the policy file") -> _solve.Decisions:
        """The file's decisions on the values of ``graph``, a re-trace of its function.

        Figures are recomputed for ``graph``; status, gap and solve time are the file's.

        Raises:
          PolicyMismatchError: a decision's values are not all found, the decisions are
            not a valid plan for ``graph``, or their predicted peak exceeds the budget.
        """
        differences = self._region_differences(graph)
        chosen = self._locate(graph, differences)
        if not differences:
            decisions = self._evaluate(graph, chosen, differences)
            if not differences and graph.fingerprint != self.fingerprint:
                differences.append(
                    f"program structure: {self.fingerprint} in the file, {graph.fingerprint} "
                    "in the function (values the plan neither saves nor recomputes differ)")
            if not differences:
                return decisions
        note = ""
        if (self.autoremat_version, self.jax_version) != _versions():
            here = _versions()
            note = (f"The file was made with autoremat {self.autoremat_version} and jax "
                    f"{self.jax_version}; this is autoremat {here[0]} and jax {here[1]}.\n")
        raise PolicyMismatchError(where, list(dict.fromkeys(differences)), note)

    def _locate(self, graph: Graph, differences: list[str]) -> dict[int, str]:
        """The action on each value id of ``graph`` the decisions name; appends to
        ``differences`` each decision whose values are not found, and each value named
        twice."""
        by_site = _values_by_site(graph)
        chosen: dict[int, str] = {}
        for d in self.decisions:
            values = by_site.get(d.site.key, [])
            if len(values) != d.of:
                differences.append(_site_difference(d, values, by_site))
                continue
            for k in range(d.of) if d.occurrences is None else d.occurrences:
                if chosen.setdefault(values[k].id, d.action) != d.action:
                    differences.append(f"{d.site} #{k}: both saved and recomputed in the file")
        return chosen

    def _region_differences(self, graph: Graph) -> list[str]:
        counts = np.bincount(graph.array("region"), minlength=len(graph.regions))
        found = [RegionSummary(r.kind, r.length, int(n)) for r, n in zip(graph.regions, counts)]
        if len(found) != len(self.regions):
            return [f"regions: {len(self.regions)} in the file, {len(found)} in the function"]
        out = [] if graph.layout == self.layout else [
            f"layout: {self.layout} in the file, {graph.layout} in the function's trace"]
        for i, (a, b) in enumerate(zip(self.regions, found)):
            for field in ("kind", "length", "values"):
                if getattr(a, field) != getattr(b, field):
                    out.append(f"region {i}: {field} {getattr(a, field)} in the file, "
                               f"{getattr(b, field)} in the function")
        return out

    def _evaluate(self, graph: Graph, chosen: Mapping[int, str], differences: list[str]
                  ) -> _solve.Decisions:
        """The figures of the actions ``chosen`` on ``graph``; appends to ``differences``
        each rule of a valid plan they break, and a peak over the budget."""
        problem = _solve.to_problem(graph)
        ids = graph.array("id").tolist()
        save = np.array([chosen.get(i) == "save" for i in ids], dtype=bool)
        recompute = np.array([chosen.get(i) == "recompute" for i in ids], dtype=bool)
        offload = np.array([chosen.get(i) == "offload" for i in ids], dtype=bool)
        if self.offload is not None:
            problem = offload_problem(graph, problem, self.offload)
        # The rules name values by index in graph.values: add where each is made.
        sites = [str(Site.of(v)) for v in graph.values]
        name = lambda m: f"{m.group(1)} {m.group(2)} ({sites[int(m.group(2))]})"
        differences.extend(re.sub(r"(value|input) (\d+)", name, msg)
                           for msg in policy_model.violations(problem, save, recompute,
                                                              offload))
        cost, peak = policy_model.evaluate(problem, save, recompute, offload)
        decisions = _solve.decisions(graph, problem, policy_model.PolicyResult(
            MilpStatus(self.status), save, recompute, cost, peak, cost, self.gap,
            self.solve_seconds, offload if self.offload is not None else None))
        if decisions.peak_bytes > self.budget_bytes:
            differences.append(
                f"predicted peak: {decisions.peak_bytes} bytes for the function, over the "
                f"file's budget of {self.budget_bytes} bytes")
        return decisions

    def _to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "producer": {"autoremat": self.autoremat_version, "jax": self.jax_version},
            "plan": {f: getattr(self, f) for f in _PLAN_FIELDS},
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
            layout=program.get("layout", "dense"),
            regions=tuple(RegionSummary(**r) for r in program["regions"]),
            decisions=tuple(Decision(
                action=d["action"],
                site=Site(d["source"], d["primitive"], tuple(d["shape"]), d["dtype"]),
                occurrences=None if d["occurrences"] == "all" else tuple(d["occurrences"]),
                of=d["of"], nbytes=d["nbytes"], multiplicity=d["multiplicity"],
                recompute_flops=d["recompute_flops"]) for d in doc["decisions"]),
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
    return importlib.metadata.version("autoremat"), jax.__version__


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


def _values_by_site(graph: Graph) -> dict[tuple, list[Value]]:
    """The graph's values grouped by :attr:`Site.key`, each group in program order."""
    out: dict[tuple, list[Value]] = {}
    for v in graph.values:
        out.setdefault(Site.of(v).key, []).append(v)
    return out


def _site_difference(d: Decision, values: Sequence[Value],
                     by_site: Mapping[tuple, Sequence[Value]]) -> str:
    """Why the function's values at ``d``'s site are not the ones the file names."""
    if values:
        return f"{d.site}: {d.of} values in the file, {len(values)} in the function"
    source, primitive, shape, dtype = d.site.key
    near = [k for k in by_site if k[:2] == (source, primitive)]
    if not near:
        return f"{d.site}: not made by the function (no {primitive} at {source})"
    if all(k[3] == dtype for k in near):
        return (f"{d.site.source} {primitive}: shape {shape} in the file, "
                f"{' or '.join(str(k[2]) for k in near)} in the function")
    if all(k[2] == shape for k in near):
        return (f"{d.site.source} {primitive}: dtype {dtype} in the file, "
                f"{' or '.join(k[3] for k in near)} in the function")
    return (f"{d.site.source} {primitive}: {d.site.array} in the file, "
            f"{' or '.join(Site('', '', k[2], k[3]).array for k in near)} in the function")
