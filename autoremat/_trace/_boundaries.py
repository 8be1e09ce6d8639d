"""Where unrolled code is cut into regions.

Two kinds of candidate boundaries, both from the program's structure:

- **Layers** (:func:`layer_cuts`): code that runs once per layer is the same equations from
  the same source lines, again and again. The equations are tokenized (primitive and user
  source frames); the tokens that repeat the most common number of times are the layers'
  code, and the layers start where one of those tokens recurs, the one whose recurrences
  the fewest bytes cross (the residual stream, not the inside of a block), shifted to
  where still fewer cross if the same code lies at every layer's bound; a block that runs
  its code several times is one layer per call. These are the boundaries a user's
  one line of remat per block gives, whatever the widths.
- **Narrow crossings** (:func:`segment_cuts`): where the bytes still to be read are near
  the least of the program, thinned to segments of similar size.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np

from autoremat import _source
from autoremat._placement import Placement
from autoremat._program import Program, Segment, scan_input_slices, split_regions


def crossing_bytes(program: Program) -> np.ndarray:
    """``crossing[p]``, for ``p`` from 0 to the number of equations: the bytes of values
    made before equation ``p`` and read at or after it (arguments not counted)."""
    eqns = program.eqns
    delta = np.zeros(len(eqns) + 2, np.int64)
    born: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for i, e in enumerate(eqns):
        for a in e.ins:
            if isinstance(a, int) and a in born:
                last_use[a] = i
        for o in e.outs:
            born[o] = i
    for o, i in born.items():
        if o in last_use:
            delta[i + 1] += program.value_bytes(o)
            delta[last_use[o] + 1] -= program.value_bytes(o)
    return np.cumsum(delta)[:len(eqns) + 1]


# An equation's primitive and its user source frames, innermost first: (file, line), but
# (file, function) for the outermost frame in which equations differ (see :func:`_tokens`).
_Token = tuple[str, tuple[tuple[str, int | str], ...]]


def _tokens(program: Program) -> list[_Token]:
    """What each equation of ``program`` is, up to which call made it: its primitive and
    the user source frames it was traced from (:func:`autoremat._source.user_files`; line
    numbers, not columns). In the outermost frame where the equations differ, the traced
    function's own, the function and not the line: there the line says which of the
    function's calls of a block ran the code (a U-Net's encoder, middle and decoder
    loops), not what the code is."""
    is_user = _source.user_files()
    chains = [tuple(reversed(list(_source.frames(e.source_info.traceback, is_user))))
              for e in program.eqns]
    lines = [tuple((f.file_name, f.start_line) for f in chain) for chain in chains]
    outer = _outer_frames([c for c in lines if c])
    top = len(outer)
    return [(e.primitive.name, tuple(reversed(
        [*c[:top], (chain[top].file_name, chain[top].function_name), *c[top + 1:]]
        if outer and len(c) > top and c[:top] == outer else c)))
        for e, chain, c in zip(program.eqns, chains, lines, strict=True)]


def _outer_frames(chains: Sequence[tuple[tuple[str, int], ...]]
                  ) -> tuple[tuple[str, int], ...]:
    """The outermost frames that the ``chains`` (outermost first) from the outermost
    frame of most of them (the wrapper that calls the traced function) share, leaving
    each at least one of its own; none where no frame is outermost in most. JAX traces
    the equations of a ``jax.checkpoint`` with the checkpointed function's frames alone,
    so where the layers are in checkpoints already there are none, and every line is
    kept."""
    roots = collections.Counter(c[0] for c in chains)
    root, count = roots.most_common(1)[0] if roots else (None, 0)
    if 2 * count <= len(chains):
        return ()
    rooted = [c for c in chains if c[0] == root]
    depth = 0
    while all(len(c) > depth + 1 and c[depth] == rooted[0][depth] for c in rooted):
        depth += 1
    return rooted[0][:depth]


# Equations per token of :func:`layer_cuts` where single equations' source lines do not
# tell the layers' code apart: a run of a few is specific to its place in a layer even
# where the library's code hides every source line (Equinox, penzai).
_WINDOW = 4


def layer_cuts(program: Program) -> tuple[int, ...]:
    """Equation indices at which the program's repeated layers start, and where the code
    after the last one starts; ``()`` where nothing repeats (:func:`_layers`)."""
    return _cuts(program, _layers(program))


def layer_regions(program: Program) -> frozenset[int]:
    """The regions of the placement at :func:`layer_cuts` that are layers (indices of
    :func:`autoremat._program.split_regions`): those from the first layer's start to the
    last one's end. A scanned model's layers are its scans: unless every layer found holds
    a scan (a loop inside each layer), what repeats beside the loop is not layers (an
    embedding's and a loss's lookups) and the scans are the layers; where nothing repeats,
    the scans, or every region where there is none. One ``jax.checkpoint`` per layer is
    what a user writes by hand, the code around the layers (embedding, head, loss) left
    as written."""
    found = _layers(program)
    return _layer_regions(program, found,
                          split_regions(program, Placement(_cuts(program, found))))


def layer_placement(program: Program, around_as_written: bool = True) -> Placement:
    """The placement of one remat per layer: a region per layer (:func:`layer_cuts`) with
    no input barriers (``Placement.barriers``), as ``jax.checkpoint`` per block writes
    it, and with ``around_as_written`` the regions that are not layers
    (:func:`layer_regions`) run as written (``Placement.written``)."""
    found = _layers(program)
    placement = Placement(_cuts(program, found), barriers=False)
    if not around_as_written:
        return placement
    regions = split_regions(program, placement)
    layers = _layer_regions(program, found, regions)
    return dataclasses.replace(placement, written=tuple(
        r.index for r in regions if r.index not in layers))


def _cuts(program: Program, found: tuple[list[int], int] | None) -> tuple[int, ...]:
    """:func:`layer_cuts` of the layers ``found`` by :func:`_layers`."""
    if found is None:
        return ()
    starts, end = found
    return tuple(sorted({*starts, end} - {0, len(program.eqns)}))


def _layer_regions(program: Program, found: tuple[list[int], int] | None,
                   regions: Sequence[Segment]) -> frozenset[int]:
    """:func:`layer_regions` of the layers ``found`` by :func:`_layers`, ``regions`` those
    of the placement at their cuts."""
    scans = frozenset(r.index for r in regions if r.kind == "scan")
    if found is None:
        return scans or frozenset(r.index for r in regions)
    (starts, end), eqns = found, program.eqns
    bounds = zip(starts, [*starts[1:], end], strict=True)
    if scans and not all(any(e.scan_body is not None for e in eqns[a:b]) for a, b in bounds):
        return scans
    position = {id(e): i for i, e in enumerate(eqns)}
    return frozenset(r.index for r in regions if starts[0] <= position[id(r.eqns[0])] < end)


def _layers(program: Program) -> tuple[list[int], int] | None:
    """Where the program's repeated layers start, and where the last one ends; ``None``
    where nothing repeats.

    A token is one equation (its primitive and source frames, :func:`_token`) or, where
    the layers found so differ in no source line, a run of ``_WINDOW`` of them. The
    layers' tokens are those that occur ``k`` times, for the ``k`` (at least 2) that the
    most tokens share (on a tie, the larger) among those where the recurrences of one of
    the tokens begin layers that hold one recurrence of most of the others each (code run
    twice per layer, a normalization's two reductions, does not qualify). Each recurs once
    per layer; the layers start at the recurrences of the one the fewest bytes cross
    (:func:`crossing_bytes`), shifted by :func:`_narrowest_starts`, and the last ends as
    :func:`_last_layer_end` says; but
    where a block runs them several times (:func:`_rounds`), a layer is a call of it
    (:func:`_calls`), its bounds shifted by :func:`_narrowest_starts` too (over a residual
    add that ends every call). The first layer then takes in the code that runs before
    its first token in other layers too (:func:`_with_lead`).
    Scans, and the slices of their inputs made for them, are regions of their own, not
    tokens.
    """
    eqns = program.eqns
    in_scans = {j for i, s in scan_input_slices(program).items()
                for j in range(i - len(s), i + 1)}
    tokens = [None if e.scan_body is not None or i in in_scans else t
              for i, (e, t) in enumerate(zip(eqns, _tokens(program), strict=True))]
    crossing = crossing_bytes(program)
    for window in (1, _WINDOW):
        positions: dict[tuple[_Token, ...], list[int]] = collections.defaultdict(list)
        for i in range(len(eqns) - window + 1):
            run = tuple(t for t in tokens[i:i + window] if t is not None)
            if len(run) == window:
                positions[run].append(i)
        family = _layer_family(positions)
        lines = {frames for run in family for _, frames in run}
        if family and (window > 1 or len(lines) > 1):
            phase = min((p for p in family.values() if _begins_layers(p, family)),
                        key=lambda p: (int(crossing[p].sum()), p))
            after = max(p[-1] for p in family.values()) + window
            end = _last_layer_end(tokens, phase, after)
            rounds = _rounds(tokens, phase, end)
            if rounds > 1:
                starts, end = _calls(list(family.values()), rounds, window)
                *starts, end = _narrowest_starts(tokens, crossing, [*starts, end])
                return _with_lead(tokens, crossing, starts), end
            starts = _with_lead(tokens, crossing, _narrowest_starts(tokens, crossing, phase))
            return starts, _last_layer_end(tokens, starts, after + starts[-1] - phase[-1])
    return None


def _with_lead(tokens: list[_Token | None], crossing: np.ndarray, starts: list[int]
               ) -> list[int]:
    """The layers' ``starts``, the first moved back over its lead where no more bytes
    cross it there: the longest run of code just before it that runs, in another layer,
    between that layer's start and the code the first layer starts with. Haiku's ResNet
    computes a projection shortcut at the head of the first block of each group, before
    the convolutions that every block runs; where the first block started at those, the
    projection's output crossed its start beside the block's input."""
    first = starts[0]
    lead = 0
    for start, bound in zip(starts[1:], [*starts[2:], len(tokens)], strict=True):
        same = next((i for i in range(start, bound) if tokens[i] == tokens[first]), start)
        n = 0
        while n < min(same - start, first) and tokens[first - n - 1] is not None \
                and tokens[first - n - 1] == tokens[same - n - 1]:
            n += 1
        lead = max(lead, n)
    if crossing[first - lead] <= crossing[first]:
        first -= lead
    return [first, *starts[1:]]


def _narrowest_starts(tokens: list[_Token | None], crossing: np.ndarray, starts: list[int]
                      ) -> list[int]:
    """The layers' ``starts`` shifted, all but the first by one amount, to where the fewest
    bytes cross the widest of them (:func:`crossing_bytes`; the nearest such shift),
    among the shifts that move the same code at each (back over code that ends every
    layer, or on over code that starts every one) by at most half the shortest layer,
    and let no more bytes cross any of them; the first by that amount too where no more
    bytes cross it there (the code before the first layer differs from a layer's end).
    Where every layer runs the same code, a longer shift slides them all a layer on,
    the first left out; in a downsampling stage the middle of a bottleneck block is
    narrower than its input, yet no layer starts there.

    The layers' tokens (:func:`_layers`) can all lie inside a block: a normalization that
    starts every block of penzai's Llama runs again before its MLP and after the last
    block, so no token of it recurs once per layer, and the layers found started inside
    the attention, where its input crosses beside the residual stream. Unchanged with
    fewer than three layers."""
    if len(starts) < 3:
        return starts
    first, inner = starts[0], starts[1:]
    most = min(b - a for a, b in itertools.pairwise(starts)) // 2
    back = _common_run(tokens, inner, step=-1, most=most)
    on = _common_run(tokens, inner, step=1, most=min(most, len(tokens) - inner[-1]))
    narrower = [d for d in range(-back, on + 1)
                if all(crossing[s + d] <= crossing[s] for s in inner)]
    d = min(narrower, key=lambda d: (int(max(crossing[s + d] for s in inner)), abs(d), d))
    if first + d >= 0 and crossing[first + d] <= crossing[first]:
        first += d
    return [first, *(s + d for s in inner)]


def _common_run(tokens: list[_Token | None], bounds: list[int], step: int, most: int
                ) -> int:
    """How many equations (at most ``most``) from every one of ``bounds``, going back
    (``step=-1``: those just before it) or on (``step=1``: from it), are the same tokens
    at each."""
    first = 0 if step > 0 else -1
    for n in range(most):
        at = {tokens[b + first + step * n] for b in bounds}
        if len(at) != 1 or None in at:
            return n
    return most


def _calls(family: list[list[int]], rounds: int, window: int) -> tuple[list[int], int]:
    """Where the calls of a block that runs its code ``rounds`` times start, and where the
    last ends, from the positions of the code's tokens (``family``, ``window`` equations
    each): the first call where its code does, each other where the code of the call
    before ends, so that the code between two calls (a pooling, an upsampling and a
    concatenation) runs with the call that reads it and the bytes kept at a cut are the
    call's output. Compiled for TPU v5e, the zoo's U-Net so holds less at its peak than
    with cuts where the fewest bytes cross, or where the calls' code starts."""
    calls = len(family[0]) // rounds
    last = [max(p[(k + 1) * rounds - 1] for p in family) + window for k in range(calls)]
    return [min(p[0] for p in family), *last[:-1]], last[-1]


def _rounds(tokens: list[_Token | None], starts: list[int], end: int) -> int:
    """How many of the layers that ``starts`` begin (the last ending at ``end``) each call
    of a block runs (a double convolution's two rounds): the length of the runs they come
    in, where the runs have one length and each after the first follows other code (a
    pooling, an upsampling: tokens in at most half the layers); 1 otherwise."""
    bounds = [*starts[1:], end]
    layers_holding: dict[_Token, set[int]] = collections.defaultdict(set)
    for k, (a, b) in enumerate(zip(starts, bounds, strict=True)):
        for t in tokens[a:b]:
            if t is not None:
                layers_holding[t].add(k)
    runs, length = [], 0
    for a, b in zip(starts, bounds, strict=True):
        length += 1
        if any(t is not None and 2 * len(layers_holding[t]) <= len(starts)
               for t in tokens[a:b]):
            runs.append(length)
            length = 0
    runs += [length] if length else []
    return runs[0] if len(runs) >= 2 and len(set(runs)) == 1 else 1


def _last_layer_end(tokens: list[_Token | None], starts: list[int], after_family: int
                    ) -> int:
    """Where the last of the layers that ``starts`` begin ends: a layer's length after its
    start where its tokens repeat the layer before's, else just after the last of the
    layers' tokens (``after_family``). That one misses the layer's end where its last
    equations recur elsewhere in it too (a projection, its bias and the residual add, after
    the attention's and the MLP's), or where a few tokens of the code after the layers
    recur as often as the layers by chance."""
    end = 2 * starts[-1] - starts[-2]
    if end <= len(tokens) and tokens[starts[-2]:starts[-1]] == tokens[starts[-1]:end]:
        return end
    return after_family


def _layer_family(positions: dict[tuple[_Token, ...], list[int]]
                  ) -> dict[tuple[_Token, ...], list[int]]:
    """The tokens of the layers among ``positions`` (each token's equation indices), as
    :func:`layer_cuts` says; empty when there are none."""
    counts = collections.Counter(len(p) for p in positions.values() if len(p) >= 2)
    for layers in sorted(counts, key=lambda k: (counts[k], k), reverse=True):
        family = {t: p for t, p in positions.items() if len(p) == layers}
        if any(_begins_layers(p, family) for p in family.values()):
            return family
    return {}


def _begins_layers(starts: list[int], family: dict[tuple[_Token, ...], list[int]]) -> bool:
    """Whether ``starts`` begin layers holding one recurrence of most of ``family`` each."""
    return 2 * sum(_interleaved(q, starts) for q in family.values()) > len(family)


def _interleaved(occurrences: list[int], starts: list[int]) -> bool:
    """Whether the ``k``-th of ``occurrences`` falls in the ``k``-th layer that ``starts``
    begin (the last running to the end; a layer's code before its start in the first)."""
    bounds = [*starts[1:], math.inf]
    return all(q < b for q, b in zip(occurrences, bounds, strict=True)) and all(
        q >= a for q, a in zip(occurrences[1:], starts[1:], strict=True))


def segment_cuts(program: Program) -> tuple[int, ...]:
    """Equation indices at which unrolled code starts a new segment.

    A cut can go where the bytes of earlier values still to be read are within 1.5x of
    the least such crossing in the middle 80% of the program: a layer boundary, where
    only the residual stream crosses. Cuts are then thinned so that each segment produces
    at least half of ``total produced bytes / sqrt(#equations)``. Scans always get regions
    of their own.
    """
    eqns = program.eqns
    n = len(eqns)
    if n < 4:
        return ()
    produced = np.array([sum(program.value_bytes(o) for o in e.outs) for e in eqns], np.int64)
    crossing = crossing_bytes(program)
    lo, hi = max(1, n // 10), max(2, n - n // 10)
    threshold = 1.5 * max(1, int(crossing[lo:hi].min()))
    min_size = 0.5 * produced.sum() / math.sqrt(n)
    acc = np.concatenate([[0], np.cumsum(produced)])
    cuts: list[int] = []
    for p in range(1, n):
        if crossing[p] <= threshold and acc[p] - acc[cuts[-1] if cuts else 0] >= min_size \
                and acc[n] - acc[p] >= min_size:
            cuts.append(p)
    return tuple(cuts)




def candidate_cuts(program: Program) -> tuple[tuple[int, ...], ...]:
    """Candidate region boundaries (:attr:`Placement.cuts`), distinct, in the planner's
    order of preference.

    First :func:`segment_cuts`, then every second of its cuts (both phases): where a layer
    is cut in two (attention | MLP), one of them cuts only at layer boundaries. Then
    :func:`layer_cuts`, the regions of one remat per layer. Each region boundary is saved
    for the backward pass, so fewer regions save fewer copies of what crosses; larger
    regions recompute more at once. The planner solves each and keeps the cheapest plan
    that fits.
    """
    finest = segment_cuts(program)
    found = [finest]
    if len(finest) >= 3:
        found += [finest[phase::2] for phase in (0, 1)]
    found.append(layer_cuts(program))
    return tuple(dict.fromkeys(found))
