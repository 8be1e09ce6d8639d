"""A JAX training step as a Checkmate-style training graph, for the solvers' benchmark.

:func:`training_graph` traces ``loss``'s value and gradient as one program,
``step(params, *rest, ct) = (loss, vjp(ct))``, where ``ct`` is the loss's cotangent seed.
Equations that depend on ``ct`` or on the loss are the backward pass; the rest (the
primal computation and the residuals JAX's linearization computes with it) the forward
pass. Nested ``jit`` and ``checkpoint`` calls are inlined; a ``scan`` stays one node.

Nodes are fused groups of equations, as XLA would fuse them, so that there is about one
node per dot or convolution with its elementwise prologue and epilogue, the granularity of
Checkmate's layer graphs:

- a dot, a convolution, a control-flow or unknown primitive each starts a node;
- the equation that makes the loss is a node that no other equation joins;
- an elementwise, data-movement or reduction equation joins the newest of the nodes its
  inputs come from (nodes are numbered as they are made, in a topological order, so the
  merged graph stays acyclic), or starts a node when that is the loss node;
- such an equation computed from arguments alone (a broadcast constant, a transposed
  weight, an embedding lookup) joins its readers' node when they all lie in one node
  other than the loss, else it is a node of its own.

The loss node (``backward`` true, like Checkmate's ``Loss``) also produces the seed
``ct`` that the backward nodes read; the gradients are graph outputs. A node's
``cost_cpu`` is the FLOPs of its equations (:func:`autoremat._cost.eqn_flops`), so the
costs sum to those of the step (after dead-code elimination); ``cost_ram`` is the bytes
of its values that another node reads or the step returns (all of a fused node's outputs
are kept or dropped together). Arguments (parameters, batch) are not nodes, as in
Checkmate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import networkx as nx

from autoremat import _program, _source
from autoremat._cost import _REDUCTIONS, eqn_flops, fusible

__all__ = ["training_graph"]


def _fuses(name: str) -> bool:
    """Whether an equation of primitive ``name`` may join another's node."""
    return fusible(name) or name in _REDUCTIONS


def _reads(eqn: _program.Eqn) -> list[int]:
    """The value ids ``eqn`` reads (literals left out)."""
    return [a for a in eqn.ins if isinstance(a, int)]


def _trace_step(loss: Callable, params: Any, rest: tuple) -> _program.Program:
    """The flattened program of ``step(params, *rest, ct) = (loss, vjp(ct))``."""
    out = jax.eval_shape(loss, params, *rest)

    def step(p: Any, *args: Any) -> tuple[Any, Any]:
        *r, ct = args
        value, vjp = jax.vjp(lambda q: loss(q, *r), p)
        return value, vjp(ct)

    return _program.flatten(jax.make_jaxpr(step)(params, *rest, out))


def _group(program: _program.Program) -> tuple[list[list[int]], list[bool], dict[int, int]]:
    """Equations grouped into nodes (see the module doc).

    Returns:
      Each node's equations, whether it is backward, and the node of every value that a
      node produces (the seed ``ct`` is the loss node's).
    """
    eqns = program.eqns
    ct, loss_value = program.args[-1], program.outs[0]
    loss_eqn = next(i for i, e in enumerate(eqns) if loss_value in e.outs)
    tainted = {ct}
    backward = []
    for i, e in enumerate(eqns):
        backward.append(i == loss_eqn or any(a in tainted for a in _reads(e)))
        if backward[-1]:
            tainted.update(e.outs)
    order = ([i for i, b in enumerate(backward) if not b] + [loss_eqn]
             + [i for i, b in enumerate(backward) if b and i != loss_eqn])
    members: list[list[int]] = []
    node_of: dict[int, int] = {}
    pending: list[int] = []
    loss_node = -1
    for i in order:
        e = eqns[i]
        inputs = {node_of[a] for a in _reads(e) if a in node_of}
        fuses = i != loss_eqn and _fuses(e.primitive.name)
        if fuses and not inputs:
            pending.append(i)
            continue
        node = max(inputs) if fuses and max(inputs) != loss_node else len(members)
        if node == len(members):
            members.append([])
        members[node].append(i)
        node_of.update((o, node) for o in e.outs)
        if i == loss_eqn:
            node_of[ct] = loss_node = node
    is_backward = [any(backward[i] for i in m) for m in members]
    readers: dict[int, list[int]] = {}
    for i, e in enumerate(eqns):
        for a in _reads(e):
            readers.setdefault(a, []).append(i)
    eqn_node = {i: node for node, m in enumerate(members) for i in m}
    returned = {a for a in program.outs if isinstance(a, int)}
    for i in reversed(pending):
        outs = eqns[i].outs
        users = {eqn_node[j] for o in outs for j in readers.get(o, ())}
        if len(users) == 1 and users != {loss_node} and returned.isdisjoint(outs):
            node = users.pop()
        else:
            node = len(members)
            members.append([])
            is_backward.append(all(is_backward[u] for u in users))
        members[node].append(i)
        eqn_node[i] = node
        node_of.update((o, node) for o in outs)
    return members, is_backward, node_of


def _name(eqn: _program.Eqn) -> str:
    """The primitive and, where known, the user's line that made ``eqn``."""
    frame = _source.user_frame(eqn.source_info.traceback)
    if frame is None:
        return eqn.primitive.name
    return f"{eqn.primitive.name}@{frame.file_name.rsplit('/', 1)[-1]}:{frame.start_line}"


def _flops(program: _program.Program, eqn: _program.Eqn) -> int:
    """FLOPs of one application of ``eqn``."""
    ins = [program.avals[a] if isinstance(a, int) else a.aval for a in eqn.ins]
    return eqn_flops(eqn.primitive.name, eqn.params, ins, [program.avals[o] for o in eqn.outs])


def training_graph(loss: Callable, params: Any, *rest: Any, name: str = "step") -> dict[str, Any]:
    """The Checkmate-style training graph of ``loss``'s gradient in ``params``.

    Args:
      loss: ``loss(params, *rest)`` returning one array (usually a scalar).
      params: the differentiated argument (arrays or ``jax.ShapeDtypeStruct`` leaves).
      *rest: the other arguments (the batch).
      name: the graph's name (the graph attribute ``name`` is ``{name}_train``).

    Returns:
      networkx node-link data in the format of Checkmate's graphs (nodes with ``id``,
      ``name``, ``backward``, ``cost_cpu``, ``cost_ram``; ``links`` with ``source`` and
      ``target``), node ids in a topological order: forward nodes, the loss, backward nodes.
    """
    program = _trace_step(loss, params, rest)
    members, is_backward, node_of = _group(program)
    eqns = program.eqns
    ct = program.args[-1]
    g = nx.DiGraph()
    g.add_nodes_from(range(len(members)))
    g.add_edges_from((node_of[a], v) for v, m in enumerate(members) for i in m
                     for a in _reads(eqns[i]) if node_of.get(a, v) != v)
    rank = lambda v: (1, 0) if v == node_of[ct] else (2 if is_backward[v] else 0, min(members[v]))
    order = list(nx.lexicographical_topological_sort(g, key=rank))
    index = {v: k for k, v in enumerate(order)}
    read = {a for u, v in g.edges for i in members[v] for a in _reads(eqns[i])
            if node_of.get(a) == u}
    read.update(a for a in program.outs if isinstance(a, int))
    out = nx.DiGraph(name=f"{name}_train")
    for k, v in enumerate(order):
        produced = ([o for i in members[v] for o in eqns[i].outs]
                    + ([ct] if v == node_of[ct] else []))
        fused = f"+{len(members[v]) - 1}" if len(members[v]) > 1 else ""
        out.add_node(k, name=f"{k}:{_name(eqns[members[v][0]])}{fused}", backward=is_backward[v],
                     cost_cpu=sum(_flops(program, eqns[i]) for i in members[v]),
                     cost_ram=sum(program.value_bytes(o) for o in produced if o in read))
    out.add_edges_from(sorted((index[u], index[v]) for u, v in g.edges))
    return nx.node_link_data(out, edges="links")
