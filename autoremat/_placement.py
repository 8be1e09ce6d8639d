"""The placement: where a plan's remat regions are and how they are grouped.

A placement is one frozen value, carried whole by the graph, the plan, the rewriter and the
policy file. Adding a kind of placement touches this module (the field, its JSON form and
its report line), the region splitter (:func:`autoremat._program.split_regions`) and the
memory model (:func:`autoremat._trace.graph_of`), and nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

_COUNT = {"type": "integer", "minimum": 0}
_POSITIVE = {"type": "integer", "minimum": 1}

# The JSON Schema of :meth:`Placement.to_json` (every field optional, defaulting as the
# dataclass does).
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "cuts": {"type": "array", "items": _COUNT},
        "scan_pieces": {"type": "array", "items": {"type": "array", "items": _POSITIVE}},
        "scan_groups": {"type": "array", "items": _POSITIVE},
        "segment_group": _POSITIVE,
        "written": {"type": "array", "items": _COUNT},
        "barriers": {"type": "boolean"},
    },
    "additionalProperties": False,
}


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the remat regions of a traced program are.

    Attributes:
      cuts: indices of the top-level equations (of the program with its scans split) that
        start a new region of unrolled code; every top-level scan is a region of its own.
      scan_pieces: per top-level scan, the iterations of the pieces it runs as, each piece
        a scan and a region of its own with its own decisions (``()`` for a scan left
        whole; ``()`` overall: none split; see :func:`autoremat._program.split_scans`).
      scan_groups: per top-level scan, its iterations per nested checkpoint (``()`` or 1:
        not nested). A nested scan keeps only its carry at the start of each group until
        the backward pass, which runs the group's forward again before its backward.
      segment_group: consecutive segments per nested group (1: none nested). Each group
        runs in one more checkpoint that keeps only its inputs, its forward run again when
        its backward starts.
      written: regions (indices of :func:`autoremat._program.split_regions`) run as
        written, in no checkpoint: JAX keeps what their backward reads and the compiler
        fuses there as in the function without remat (a plan saves every value of theirs
        the backward reads; :func:`autoremat._solve.fused_as_written` is what the
        compiler holds of them). One remat per layer leaves the code around the layers so.
      barriers: whether the inputs of each segment in a checkpoint pass one optimization
        barrier, so that its backward (weight gradients included) ends before that of the
        regions before it starts, as the memory model's stages assume
        (:func:`autoremat._program.region_fn`). One remat per layer has none, as a user's
        ``jax.checkpoint`` per block (or a library's own remat) writes it: on the TPU v5e
        compiler, the barriers put a Flax NNX transformer's per-layer plan 0.25% above
        ``nnx.remat`` per block, and without them it compiles to the same peak.

    Example:
      >>> from autoremat._placement import Placement
      >>> p = Placement(cuts=(4, 9), segment_group=2)
      >>> Placement.from_json(p.to_json()) == p
      True
    """

    cuts: tuple[int, ...] = ()
    scan_pieces: tuple[tuple[int, ...], ...] = ()
    scan_groups: tuple[int, ...] = ()
    segment_group: int = 1
    written: tuple[int, ...] = ()
    barriers: bool = True

    @property
    def splits_scans(self) -> bool:
        """Whether some top-level scan runs as pieces."""
        return any(self.scan_pieces)

    @property
    def nests_scans(self) -> bool:
        """Whether some top-level scan runs nested."""
        return any(g > 1 for g in self.scan_groups)

    @property
    def nests(self) -> bool:
        """Whether some scan or the segments run nested."""
        return self.nests_scans or self.segment_group > 1

    @property
    def restructures(self) -> bool:
        """Whether the program runs otherwise than as written whatever a plan saves: some
        scan split or nested, or segments nested."""
        return self.splits_scans or self.nests

    def to_json(self) -> dict[str, Any]:
        """The placement as JSON data (see :data:`SCHEMA`)."""
        doc: dict[str, Any] = {
            "cuts": list(self.cuts), "scan_pieces": [list(p) for p in self.scan_pieces],
            "scan_groups": list(self.scan_groups), "segment_group": self.segment_group}
        if self.written:  # the placements made before the field read as before
            doc["written"] = list(self.written)
        if not self.barriers:
            doc["barriers"] = False
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Placement:
        """The placement of JSON data valid under :data:`SCHEMA` (absent fields take their
        defaults; other keys are ignored)."""
        return cls(cuts=tuple(doc.get("cuts", ())),
                   scan_pieces=tuple(tuple(p) for p in doc.get("scan_pieces", ())),
                   scan_groups=tuple(doc.get("scan_groups", ())),
                   segment_group=doc.get("segment_group", 1),
                   written=tuple(doc.get("written", ())),
                   barriers=doc.get("barriers", True))

    def describe(self) -> list[str]:
        """The report's lines for what differs from one region per scan and per segment."""
        lines = []
        if self.splits_scans:
            pieces = ", ".join("+".join(map(str, s)) for s in self.scan_pieces if s)
            lines.append(f"scans split into  {pieces} iterations (each piece its own region)")
        if self.nests_scans:
            groups = ", ".join(str(g) for g in self.scan_groups if g > 1)
            lines.append(f"scans nested in   groups of {groups} iterations (each group's "
                         "forward runs again in the backward)")
        if self.segment_group > 1:
            lines.append(f"segments nested   in groups of {self.segment_group} (each group's "
                         "forward runs again in the backward)")
        if self.written:
            lines.append(f"as written        regions {', '.join(map(str, self.written))} "
                         "(no checkpoint)")
        if not self.barriers:
            lines.append("input barriers    none (segments checkpointed as jax.checkpoint "
                         "per block writes them)")
        return lines
