"""Bytes a region holds whatever the plan: its forward working set and its cotangents."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet

import numpy as np

from autoremat._cost import fuses, fuses_cotangent
from autoremat._program import Atom, Eqn, Program, ScanBody, Segment, scan_operands
from autoremat._trace._common import is_float


def work_bytes(eqns: Sequence[Eqn], inputs: Sequence[int], kept: AbstractSet[int],
               value_bytes: Callable[[int], int], free: AbstractSet[int]) -> int:
    """Peak bytes live in one pass over ``eqns``, each value freed after its last read.

    Values in ``kept`` (read after the region) live to the end. Other outputs of
    elementwise and data-movement ops are taken to be fused into their consumers, as XLA
    does, and cost nothing. Residuals are not counted here: the memory model adds saved
    and recomputed values itself.
    """
    last: dict[int, int] = {}
    for i, e in enumerate(eqns):
        for a in e.ins:
            if isinstance(a, int):
                last[a] = i
    fused = {o for e in eqns if fuses(e.primitive.name, e.params) for o in e.outs
             if o not in kept}

    def size(i: int) -> int:
        return 0 if i in free or i in fused else value_bytes(i)

    live = {i for i in inputs if i in last}
    cur = peak = sum(size(i) for i in live)
    for i, e in enumerate(eqns):
        for o in e.outs:
            cur += size(o)
            live.add(o)
        peak = max(peak, cur)
        for a in {a for a in e.ins if isinstance(a, int)}:
            if last.get(a) == i and a not in kept and a in live:
                live.discard(a)
                cur -= size(a)
    return peak


def cotangent_bytes(eqns: Sequence[Eqn], later: AbstractSet[int],
                    value_bytes: Callable[[int], int],
                    differentiable: AbstractSet[int]) -> int:
    """Peak bytes of cotangents live in one backward pass over ``eqns`` (in reverse).

    A value's cotangent exists from the backward of its last reader to that of its
    producer. It is materialized when some reader's transpose is a dot, convolution, loop
    or call, or when it arrives from another region (``later``); otherwise it is an
    elementwise expression that XLA fuses into the transposes that read it.
    """
    materialized = set(later) | {a for e in eqns if not fuses_cotangent(e.primitive.name,
                                                                         e.params)
                                 for a in e.ins if isinstance(a, int)}
    # A cotangent that must outlive a materializing transpose (a dot's, a convolution's)
    # between its last reader and its producer cannot fuse into both sides: it exists.
    barriers = np.cumsum([not fuses_cotangent(e.primitive.name, e.params) for e in eqns])
    made = {o: i for i, e in enumerate(eqns) for o in e.outs}
    last = {a: i for i, e in enumerate(eqns) for a in e.ins if isinstance(a, int)}
    materialized |= {a for a, i in last.items() if a in differentiable
                     and i and barriers[i - 1] > (barriers[made[a]] if a in made else 0)}

    def size(i: int) -> int:
        return value_bytes(i) if i in materialized else 0

    live = {o for o in later if o in differentiable}
    cur = peak = sum(size(i) for i in live)
    for e in reversed(eqns):
        for a in {a for a in e.ins if isinstance(a, int) and a in differentiable} - live:
            live.add(a)
            cur += size(a)
        peak = max(peak, cur)
        for o in set(e.outs) & live:
            live.discard(o)
            cur -= size(o)
    return peak


def cotangent_holders(eqns: Sequence[Eqn], value_bytes: Callable[[int], int],
                      out: dict[int, int] | None = None) -> dict[int, int]:
    """Bytes the cotangent of each concatenated value holds: the concatenation's. Its
    cotangent is a slice of the concatenation's, which XLA fuses into the slice's
    reader, keeping the whole buffer (measured on TPU v5e: a U-Net's skip cotangents hold
    the skip and the upsampled decoder input together)."""
    out = {} if out is None else out
    for e in eqns:
        if e.primitive.name == "concatenate":
            for a in e.ins:
                if isinstance(a, int):
                    out[a] = max(out.get(a, 0), *(value_bytes(o) for o in e.outs))
        if e.scan_body is not None:
            cotangent_holders(e.scan_body.eqns, value_bytes, out)
        if e.shard_body is not None:
            cotangent_holders(e.shard_body.eqns, value_bytes, out)
    return out


def in_flight_cotangent_bytes(regions: Sequence[Segment], last_reader: dict[int, int],
                              value_bytes: Callable[[int], int],
                              differentiable: AbstractSet[int]) -> list[int]:
    """Bytes of cotangents live across each region's whole backward pass: those of values
    made in an earlier region and read in a later one but not in it (a long skip
    connection). The cotangent starts at the backward of the last region reading the
    value and is summed until that of the region making it (measured on TPU v5e: a U-Net's
    concatenated skips' cotangents are held from the decoder's backward to the
    encoder's)."""
    made = {o: r.index for r in regions for o in r.outputs if o in differentiable}
    out = [0] * len(regions)
    for r in regions:
        reads = set(r.inputs)
        for o, p in made.items():
            if p < r.index < last_reader.get(o, -1) and o not in reads:
                out[r.index] += value_bytes(o)
    return out


def differentiable(program: Program) -> set[int]:
    """Values that carry a cotangent: floating-point values computed from floating-point
    arguments. In a scan's body, as JAX decides: a constant or a scanned slice whose
    operand carries one, and a carry whose initial value does or that the body makes
    from one (a fixed point); the scan's results where the body's do."""
    out = {a for a in program.args if is_float(program.avals[a])}

    def floats(ids: Iterable[int]) -> set[int]:
        return {i for i in ids if is_float(program.avals[i])}

    def carries(a: Atom) -> bool:
        return isinstance(a, int) and a in out

    def visit(eqns: Sequence[Eqn]) -> None:
        for e in eqns:
            if e.scan_body is not None:
                visit_scan(e, e.scan_body)
                continue
            if e.shard_body is not None:
                out.update(b for b, o in zip(e.shard_body.ins, e.ins, strict=True) if carries(o))
                visit(e.shard_body.eqns)
            if e.primitive.name != "stop_gradient" and any(map(carries, e.ins)):
                out.update(floats(e.outs))

    def visit_scan(e: Eqn, body: ScanBody) -> None:
        consts, init, xs = scan_operands(e, e.ins)
        out.update(floats(i for i, o in zip((*body.consts, *body.carry_in, *body.xs_in),
                                            (*consts, *init, *xs), strict=True)
                          if carries(o)))
        while True:
            visit(body.eqns)
            carried = floats(c for c, o in zip(body.carry_in, body.carry_out, strict=True)
                             if carries(o)) - out
            if not carried:
                break
            out.update(carried)
        out.update(floats(o for o, b in zip(e.outs, (*body.carry_out, *body.ys_out),
                                            strict=True) if carries(b)))

    visit(program.eqns)
    return out


def gradient_buffers(program: Program, num_regions: int, last_reader: dict[int, int]
                     ) -> list[tuple[int, int]]:
    """``(bytes, region)`` of each floating-point argument's gradient, largest first: the
    region is the one whose backward writes it, the last reading its argument
    (``last_reader``; ``num_regions`` for an argument no region reads)."""
    return sorted(((program.value_bytes(a), last_reader.get(a, num_regions))
                   for a in program.args if is_float(program.avals[a])), reverse=True)


def grad_bytes_by_region(gradients: Sequence[tuple[int, int]], num_regions: int
                         ) -> list[int]:
    """Bytes of argument gradients that exist at each region's backward stage, from
    :func:`gradient_buffers`."""
    return [sum(b for b, r in gradients if r >= i) for i in range(num_regions)]
