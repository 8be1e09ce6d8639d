"""The graph of intermediate values the solver plans over: plain frozen data."""

from __future__ import annotations

import dataclasses

import numpy as np
from autoremat_ilp.problem import NO_CAP

from autoremat._layout import Layout
from autoremat._placement import Placement


@dataclasses.dataclass(frozen=True)
class Value:
    """One intermediate value of the forward pass.

    Attributes:
      id: the value's id in the flattened program (stable for a function and shapes).
      shape, dtype: of one instance.
      nbytes: bytes of one instance on one device (its shard, for a sharded program).
      multiplicity: instances kept if saved (the scan length inside a scan body, the
        group's in a nested scan, except for values computed from loop invariants alone,
        which JAX saves once).
      held_bytes: bytes it takes saved: its ``multiplicity`` instances, stacked as JAX
        stacks a scan's residuals (in tiles, one more padded dimension).
      primitive: the producing primitive; ``carry_in``/``xs_in`` for a scan body's inputs.
      source: ``file:line`` of the user code that produced it.
      flops: cost of recomputing one instance on one device (a scan body's values are
        recomputed once per iteration, see :meth:`Graph.recompute_flops`).
      region: index of the remat region it belongs to.
      inputs: ids of the intermediate values it is computed from (arguments and constants,
        always available, are left out).
      saveable: whether it can be kept as a residual.
      recomputable: whether it can be recomputed inside its region's backward pass.
      needed: the backward pass of its own region reads it (it must be saved or recomputed).
      needed_across: another region reads it, so it must be saved.
      user_name: the name the user's code gave it with
        :func:`jax.ad_checkpoint.checkpoint_name` (it is then that ``name`` equation's
        output), or ``None``.
      replays_barrier: it reads an input of a region whose inputs pass through an
        optimization barrier (:func:`autoremat._program.has_input_barrier`): recomputing
        it replays the barrier, which keeps every input of the region (JAX has no rule to
        drop a barrier's unused operands; see :attr:`Region.barrier_inputs`).
      replayed: it is made in a nested group (the body of a nested scan, or a nested group
        of segments, :attr:`Region.nest`), whose backward runs the group's forward again,
        and is not handed out of the group: saved, it is held for its group's backward
        alone (``multiplicity`` instances of it).
      fused: XLA fuses it into its consumers, so that, recomputed, it takes no memory of
        its own (elementwise and data-movement ops, and calls of only such ops:
        :func:`autoremat._cost.fuses`).
      relayout: the TPU compiler makes it as a copy in a new layout
        (:func:`autoremat._trace._relayouts.relayouts`): in code run as written it keeps
        the copy for the backward pass, not the values the copy's elementwise chain
        starts from (see :func:`autoremat._solve.fused_as_written`).
      released: the region at whose backward stage, saved, it is freed: its own, or, when
        nothing in its segment reads it (its backward pass included: a block's output),
        the first later region reading it, whose backward is the last to need it
        (measured on TPU v5e: a residual CNN's block outputs are freed so); ``-1``: its
        own.
    """

    id: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    multiplicity: int
    held_bytes: int
    primitive: str
    source: str
    flops: int
    region: int
    inputs: tuple[int, ...]
    saveable: bool
    recomputable: bool
    needed: bool
    needed_across: bool
    user_name: str | None = None
    replays_barrier: bool = False
    replayed: bool = False
    fused: bool = False
    relayout: bool = False
    released: int = -1


@dataclasses.dataclass(frozen=True)
class Region:
    """A remat region: a ``jax.checkpoint`` around a segment, or around a scan body.

    Attributes:
      index: position in program order.
      kind: ``"segment"`` or ``"scan"``.
      length: iterations (1 for a segment).
      work_bytes: peak bytes live during one forward pass through the region (one
        iteration for a scan), its inputs from other regions included but, for a
        segment, those saved by regions not nested, which count where they are held.
      cotangent_bytes: peak bytes of cotangents that exist during one backward pass
        through the region (those of elementwise chains fuse into their consumers).
      grad_bytes: bytes of argument gradients that exist from the region's backward pass
        on (those of arguments read in this region or later).
      barrier_inputs: the values of other regions that pass through the region's input
        barrier; each is kept for the region's backward if it recomputes a value that
        :attr:`Value.replays_barrier` (empty without a barrier).
      group: for a nested scan, its iterations per outer checkpoint (1: not nested). Its
        saved values are then made again in each group's backward, ``group`` instances
        at a time, and held only there; each group's forward is recomputed once.
      kept_bytes: bytes the region keeps from its forward to the end of its backward
        whatever the plan (a nested scan's carry at the start of each group).
      nest: the nested group of regions it belongs to (``-1``: none): consecutive
        segments run inside one more checkpoint that keeps only the group's inputs, or a
        nested scan (a group of its own); its values are made again when the group's
        backward starts (:attr:`Value.replayed`).
      sliced: a scan that slices its scanned inputs itself (a piece of a split scan), in a
        checkpoint around the loop that makes a loop-invariant value it recomputes once
        more than the loop's length.
      unrolled: a scan JAX unrolls whole (``unroll`` at least its length: penzai's
        ``LayerStack``). As written, it is straight-line code to the compiler, which
        fuses its elementwise chains into the backward as in a segment.
    """

    index: int
    kind: str
    length: int
    work_bytes: int
    cotangent_bytes: int
    grad_bytes: int
    barrier_inputs: tuple[int, ...] = ()
    group: int = 1
    kept_bytes: int = 0
    nest: int = -1
    sliced: bool = False
    unrolled: bool = False


@dataclasses.dataclass(frozen=True)
class Constant:
    """A constant of the program (an array the traced function closes over) that JAX may
    keep as a residual. It takes no memory of its own (it is held throughout, like the
    arguments), so it is counted in a plan's saved bytes but not in its peak.

    Attributes:
      id: the constant's id in the flattened program.
      nbytes: its bytes on one device.
      kept: the backward pass reads it whatever the plan.
      readers: the ids of the values whose recomputation reads it: JAX keeps it when the
        plan recomputes one of them.
    """

    id: int
    nbytes: int
    kept: bool
    readers: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Graph:
    """A traced function's values and regions, and the totals the plan is judged by.

    Attributes:
      values: every intermediate value, in program order.
      regions: the remat regions, in program order.
      arg_bytes: bytes of all arguments (on one device, as every size here).
      grad_bytes: bytes of the gradients of the floating-point arguments.
      step_flops: FLOPs of the forward plus backward pass without remat (of one device).
      fingerprint: a digest of the program's structure, to check a plan is applied to
        the function it was made for.
      layout: how the values' bytes were counted (see :mod:`autoremat._layout`).
      placement: where its regions are (equation indices are those of the program with
        its scans split).
      grad_buffers: bytes of each floating-point argument's gradient (the compiler's
        output buffers), largest first.
      grad_written: the region whose backward writes each of ``grad_buffers`` (the last
        one reading its argument; ``len(regions)`` for an argument no region reads).
      fixed_flops: FLOPs every plan on this graph adds to the step whatever it decides:
        what JAX recomputes that no name reaches (values inside a nested loop or a
        ``cond``, made by a custom differentiation rule, or from literals; asked of JAX
        region by region), and the sums of a split scan's gradients over its pieces.
      constants: the program's constants that JAX may keep as residuals
        (:meth:`constant_bytes`).
    """

    values: tuple[Value, ...]
    regions: tuple[Region, ...]
    arg_bytes: int
    grad_bytes: int
    step_flops: int
    fingerprint: str
    placement: Placement
    grad_buffers: tuple[int, ...] = ()
    grad_written: tuple[int, ...] = ()
    layout: Layout = "dense"
    fixed_flops: int = 0
    constants: tuple[Constant, ...] = ()

    def array(self, field: str, dtype: type = np.int64) -> np.ndarray:
        """One field of every value as a numpy array, in ``values`` order."""
        return np.array([getattr(v, field) for v in self.values], dtype=dtype)

    @property
    def fixed_bytes(self) -> int:
        """Bytes every plan holds by the end: the arguments and their gradients."""
        return self.arg_bytes + self.grad_bytes

    def reserved_room(self, held: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """How saved values of ``held`` bytes may share the gradients' buffers: ``(masks,
        caps, room, fits)``, bounds per distinct buffer size ``s``: the values larger than
        ``s`` fit only in the buffers larger than ``s``, the largest of them ``fits[k]``
        bytes, and at a region's stages only in those its backward or an earlier region's
        writes (a buffer written before holds its gradient; a value shares a buffer only
        if it dies before the buffer is written, and a region's saved values live to its
        backward). A buffer holds one value at a time, so each size ``s`` has one bound
        per cap ``t``, none or one of the sizes of those values smaller than a buffer
        they fit in: each value that fits in a buffer counts at most ``t`` bytes
        (``caps[k]``), each that fits in none counts whole, and each buffer shares at most
        ``t`` (the zoo's 32-layer MLP on TPU v5e: its 16 MiB hidden activations, in no 8
        MiB weight gradient, counted at ``t`` = 4 MiB put a plan at 1321.0 MiB that takes
        1479.6 of device memory, counted whole at 1501.0); ``room[k, i]``: the bytes those
        buffers share at region ``i``'s stages (0 for values larger than every buffer).
        Bounds whose values a larger size's bound counts already are left out."""
        sizes = sorted(set(self.grad_buffers), reverse=True)
        buffers, written = np.array(self.grad_buffers), np.array(self.grad_written)
        regions = np.arange(len(self.regions))
        masks, caps, room, largests = [], [], [], []
        for s in sizes:
            mask = held > s
            if masks and (mask == masks[-1]).all():
                continue
            fits = buffers > s
            largest = buffers[fits].max(initial=0)
            for t in (NO_CAP, *sorted(set(held[mask & (held < largest)].tolist()))):
                masks.append(mask)
                caps.append(t)
                largests.append(largest)
                room.append([int(np.minimum(buffers[fits & (written <= i)], t).sum())
                             for i in regions])
        return (np.array(masks, dtype=bool).reshape(-1, len(held)),
                np.array(caps, np.int64),
                np.array(room, np.int64).reshape(-1, len(self.regions)),
                np.array(largests, np.int64))

    def backward_base_bytes(self) -> np.ndarray:
        """Bytes in use at each region's backward stage whatever the plan: the arguments,
        the gradients made so far and the region's cotangents."""
        return np.array([self.arg_bytes + r.grad_bytes + r.cotangent_bytes
                         for r in self.regions], dtype=np.int64) + self.kept_bytes()

    def reserved_base_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """The backward and forward stages' bytes whatever the plan, with every gradient's
        buffer allocated for the whole step (see :mod:`autoremat._solve`)."""
        fixed = self.arg_bytes + self.grad_bytes
        kept = self.kept_bytes()
        return (np.array([fixed + r.cotangent_bytes for r in self.regions], dtype=np.int64)
                + kept,
                np.array([fixed + r.work_bytes for r in self.regions], dtype=np.int64) + kept)

    def forward_base_bytes(self) -> np.ndarray:
        """Bytes in use at each region's forward stage whatever the plan: the arguments and
        the region's forward working set."""
        return (np.array([self.arg_bytes + r.work_bytes for r in self.regions], dtype=np.int64)
                + self.kept_bytes())

    def kept_bytes(self) -> np.ndarray:
        """Bytes at each region's stages that regions up to it keep whatever the plan
        (:attr:`Region.kept_bytes`)."""
        return np.cumsum([r.kept_bytes for r in self.regions], dtype=np.int64)

    def constant_bytes(self, recomputed: np.ndarray) -> int:
        """Bytes of the constants JAX keeps as residuals when the values ``recomputed`` (a
        mask over ``values``) are made again in the backward pass."""
        again = {v.id for v, r in zip(self.values, recomputed, strict=True) if r}
        return sum(c.nbytes for c in self.constants
                   if c.kept or not again.isdisjoint(c.readers))

    def nested(self) -> np.ndarray:
        """Which values, saved, are held only in their nested group's backward
        (:attr:`Value.replayed`)."""
        return self.array("replayed", bool)

    def replays(self) -> np.ndarray:
        """Which values every plan computes once more, in the backward of their nested
        group: those :meth:`nested`, and all of a nested group of segments."""
        in_group = np.array([r.nest >= 0 and r.kind == "segment" for r in self.regions],
                            dtype=bool)
        return self.nested() | in_group[self.array("region")]

    def iterations(self) -> np.ndarray:
        """How many times recomputing each value computes it per step: its region's length,
        once more for a loop-invariant value of a :attr:`Region.sliced` loop."""
        lengths = np.array([r.length for r in self.regions], dtype=np.int64)
        sliced = np.array([r.sliced and r.length > 1 for r in self.regions], dtype=bool)
        region = self.array("region")
        return lengths[region] + (sliced[region] & (self.array("multiplicity") == 1))

    def recompute_flops(self) -> np.ndarray:
        """FLOPs of recomputing each value in every iteration of its region."""
        return self.iterations() * self.array("flops")
