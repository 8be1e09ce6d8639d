"""The value graph of a program under one placement."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

from jax._src import config as jax_config

from autoremat import _program, _sharding
from autoremat._graph import Graph, Region, Value
from autoremat._placement import Placement
from autoremat._program import Program, Segment
from autoremat._trace._common import abstract, is_float, produced, source_of
from autoremat._trace._facts import ProgramFacts, program_facts
from autoremat._trace._memory import (
    cotangent_bytes,
    grad_bytes_by_region,
    in_flight_cotangent_bytes,
    work_bytes,
)
from autoremat._trace._residuals import residuals, scan_step_fn, unnamed_recompute_flops
from autoremat._trace._residuals import signature as region_signature
from autoremat._trace._residuals import step_flops as plain_step_flops


def warn_unplanned(nbytes: int, region: Segment) -> None:
    if nbytes:
        source = source_of(region.eqns[0])
        warnings.warn(f"JAX keeps {nbytes} bytes of residuals in the region starting at "
                      f"{source} that are not named values; autoremat cannot plan or count "
                      "them, so the predicted peak may be low by that much.", stacklevel=4)


def graph_of(program: Program, placement: Placement, facts: ProgramFacts | None = None
             ) -> tuple[tuple[Segment, ...], Graph]:
    """The regions and value graph of ``program`` under ``placement`` (see
    :func:`autoremat._program.split_regions`; its scans already split as it says).

    ``facts``: ``program_facts(program)``, shared by the graphs of several placements of
    ``program`` so that what does not depend on the placement is worked out once.
    """
    facts = program_facts(program) if facts is None else facts
    regions = _program.split_regions(program, placement)
    free, differentiable = facts.free, facts.differentiable
    readers: dict[int, set[int]] = {}
    for r in regions:
        for e in r.eqns:
            for a in e.ins:
                if isinstance(a, int):
                    readers.setdefault(a, set()).add(r.index)
    last_reader = {a: max(rs) for a, rs in readers.items()}
    grad_bytes = grad_bytes_by_region(program, len(regions), last_reader)
    cotangent_size = facts.cotangent_size
    in_flight = in_flight_cotangent_bytes(regions, last_reader, cotangent_size,
                                           differentiable)

    records = {vid: {**facts.fields[vid], "region": r.index, "needed": False}
               for r in regions for e in r.eqns for vid in facts.made[e]}
    region_infos = []
    needed_across: set[int] = set()

    step_flops = fixed_flops = 0

    def mark_needed(make_fn: Callable[[], Callable], input_ids: Sequence[int],
                    region: Segment, fixed_fn: Callable[[int], int]) -> set[int]:
        """Marks the values the VJP of ``make_fn()`` reads; returns the positions of inputs
        it reads. Repeated layers are asked of JAX once (by their signature), as is what
        it recomputes saving every name (``fixed_fn(the region's plain step FLOPs)``)."""
        nonlocal step_flops, fixed_flops
        signature, local = region_signature(region, program.avals, facts.texts)
        if signature not in facts.residuals:
            names, arg_pos, unplanned = residuals(make_fn(), abstract(input_ids, program.avals))
            needed = tuple(sorted(local[_program.value_id(n)] for n in names))
            plain = _program.region_fn(program, region, frozenset(), None)
            flops = plain_step_flops(plain, abstract(region.inputs, program.avals))
            with jax_config.remat3(False):  # read like the residuals
                fixed = fixed_fn(flops)
            facts.residuals[signature] = needed, arg_pos, unplanned, flops, fixed
        needed, arg_pos, unplanned, flops, fixed = facts.residuals[signature]
        warn_unplanned(unplanned, region)
        by_position = {k: v for v, k in local.items()}
        for k in needed:
            records[by_position[k]]["needed"] = True
        step_flops += flops
        fixed_flops += fixed
        return arg_pos

    def named_region_fn(r: Segment, named: frozenset[int]) -> Callable:
        return _program.region_fn(program, r, named, _program.policy_for(named))

    def whole_region_fixed_fn(r: Segment, named: frozenset[int]) -> Callable[[int], int]:
        """What JAX recomputes in ``r`` saving every name in ``named``, beyond the region's
        plain step FLOPs."""
        return lambda flops: unnamed_recompute_flops(
            named_region_fn(r, named), flops, abstract(r.inputs, program.avals), r.eqns)

    for r in regions:
        if r.kind == "segment":
            named = frozenset(produced(r.eqns))
            make_fn = lambda r=r, named=named: named_region_fn(r, named)
            arg_pos = mark_needed(make_fn, r.inputs, r, whole_region_fixed_fn(r, named))
            needed_across.update(r.inputs[k] for k in arg_pos)
            barrier_inputs: tuple[int, ...] = ()
            if _program.has_input_barrier(r):
                inputs = set(r.inputs)
                barrier_inputs = tuple(a for a in r.inputs if a in records)
                for e in r.eqns:
                    if any(a in inputs for a in e.ins if isinstance(a, int)):
                        for vid in facts.made[e]:
                            records[vid]["replays_barrier"] = True
            work = work_bytes(r.eqns, r.inputs, set(r.outputs), program.value_bytes, free)
            cotangents = cotangent_bytes(r.eqns, set(r.outputs), cotangent_size,
                                          differentiable)
            if r.nest >= 0:
                # The group's checkpoint (its id is its first region) keeps its inputs;
                # its forward runs again.
                needed_across.update(i for i in r.inputs if i in records
                                     and records[i]["region"] < r.nest)
                for vid in (v for e in r.eqns for v in facts.made[e]):
                    records[vid]["replayed"] = True
            region_infos.append(Region(r.index, "segment", 1, work,
                                       cotangents + in_flight[r.index], grad_bytes[r.index],
                                       barrier_inputs, nest=r.nest))
            continue
        *slices, scan = r.eqns
        for vid in (v for e in slices for v in facts.made[e]):
            records[vid]["saveable"] = False  # made again in the backward pass
        body, length = scan.scan_body, scan.params["length"]
        outer_consts, _, _ = _program.scan_operands(scan, scan.ins)
        operands = [*body.consts, *body.carry_in, *body.xs_in]
        # Measured in a loop: JAX recomputes values inside a scan's body that it saves
        # when the body is differentiated alone (those of a nested scan). A loop that
        # slices its inputs is measured whole, in the checkpoint around it.
        if slices:
            fixed_fn = whole_region_fixed_fn(
                r, frozenset((*produced(body.eqns), *body.carry_in)))
        else:
            fixed_fn = lambda _, body=body, operands=operands, length=length: length * (
                unnamed_recompute_flops(
                    scan_step_fn(body, program.consts, in_loop=True),
                    scan_step_fn(body, program.consts, in_loop=True, named=False),
                    abstract(operands, program.avals), body.eqns))
        arg_pos = mark_needed(lambda body=body: scan_step_fn(body, program.consts),
                              operands, r, fixed_fn)
        flat_ids = [*outer_consts, *body.carry_in, *body.xs_in]
        for k in arg_pos:
            vid = flat_ids[k]
            if isinstance(vid, int) and vid in records and records[vid]["region"] == r.index:
                records[vid]["needed"] = True
            elif isinstance(vid, int):
                needed_across.add(vid)
        kept = {a for a in (*body.carry_out, *body.ys_out) if isinstance(a, int)}
        work = work_bytes(body.eqns, [*body.carry_in, *body.xs_in], kept, program.value_bytes,
                           free | set(body.consts) | set(body.xs_in))
        cotangents = cotangent_bytes(body.eqns, kept, cotangent_size, differentiable)
        # The loop sums the gradient of each differentiable constant in a buffer of its
        # size; each later region that reads the constant too made its own, and XLA adds
        # them up only after the last (measured on TPU v5e, with loops reading the stacked
        # weights of GPT-2-small, 162 MiB, as constants in pieces 1+2+4+5: three
        # accumulators live in the second piece).
        accumulators = sum(program.value_bytes(c) * sum(k > r.index for k in readers[c])
                           for c in dict.fromkeys(outer_consts)
                           if isinstance(c, int) and c in differentiable)
        # A loop slicing its inputs holds the slices through its forward pass and makes
        # them again for its backward pass, where it sums their cotangents.
        sliced = [o for e in slices for o in e.outs]
        work += sum(map(program.value_bytes, sliced))
        accumulators += sum(program.value_bytes(o) * (1 + (o in differentiable)) for o in sliced)
        kept = 0
        if r.group > 1:
            # A group's checkpoint keeps its carry and, to slice its inputs, its group
            # number (int32); what the body saves is made again in the group's backward,
            # for its iterations.
            _, init, xs = _program.scan_operands(scan, scan.ins)
            kept = length // r.group * (4 * bool(xs) + sum(program.value_bytes(c)
                                                           for c in init if isinstance(c, int)))
            outs = set(scan.outs)
            for vid in facts.made[scan]:
                if vid not in outs:
                    records[vid]["replayed"] = True
                    if records[vid]["multiplicity"] == length:
                        records[vid]["multiplicity"] = r.group
        region_infos.append(Region(r.index, "scan", length, work,
                                   cotangents + accumulators + in_flight[r.index],
                                   grad_bytes[r.index], group=r.group, kept_bytes=kept,
                                   nest=r.index if r.group > 1 else -1, sliced=bool(slices)))

    # An xs slice is a view of the scan's input: reading it holds the whole input, kept
    # from the forward pass unless the scan's region made it.
    for rec in records.values():
        if rec["primitive"] == "xs_in" and rec["needed"]:
            for vid in rec["inputs"]:
                if vid in records and records[vid]["region"] == rec["region"]:
                    records[vid]["needed"] = True
                else:
                    needed_across.add(vid)
    # What a nested group of segments hands to regions outside it is kept from the
    # forward, as an output of the group's checkpoint.
    nest_of = [r.nest for r in regions]
    for vid in needed_across:
        rec = records.get(vid)
        if rec is not None and rec.get("replayed") and regions[rec["region"]].kind == "segment" \
                and any(nest_of[k] != nest_of[rec["region"]] for k in readers.get(vid, ())):
            rec["replayed"] = False
    values = tuple(Value(**records[vid], needed_across=vid in needed_across)
                   for vid in sorted(records))
    graph = Graph(
        values=values,
        regions=tuple(region_infos),
        arg_bytes=sum(map(program.value_bytes, program.args)),
        grad_bytes=sum(program.value_bytes(a) for a in program.args
                       if is_float(program.avals[a])),
        step_flops=step_flops,
        fixed_flops=fixed_flops + facts.split_flops,
        fingerprint=facts.fingerprint,
        layout=program.layout,
        placement=placement,
        largest_grad_bytes=max((program.value_bytes(a) for a in program.args
                                if is_float(program.avals[a])), default=0),
    )
    return regions, _sharding.per_device_flops(graph, program)
