"""A plain computation graph for rematerialization solvers.

Nodes are numbered ``0..n-1`` in a topological order. Each node produces one value of
``ram[v]`` bytes at a compute cost of ``cost[v]``. Training graphs mark the loss and the
gradient nodes ``backward``; every node must be computed at least once by a schedule.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import networkx as nx
import numpy as np

__all__ = [
    "ComputeGraph",
    "chain_training_graph",
    "load_graph_json",
    "random_layered_training_graph",
]


@dataclasses.dataclass(frozen=True)
class ComputeGraph:
    """A DAG in topological order: ``preds[v]`` only holds nodes ``< v``.

    Attributes:
      cost: compute cost of each node.
      ram: bytes of each node's output.
      preds: each node's inputs, earlier nodes.
      backward: whether each node belongs to the backward pass.
      names: a name per node.

    Example:
      >>> import autoremat_solvers as ars
      >>> graph = ars.ComputeGraph(cost=(1.0, 2.0), ram=(10, 20), preds=((), (0,)),
      ...                          backward=(False, True), names=("f", "f_grad"))
      >>> graph.n
      2
    """

    cost: tuple[float, ...]
    ram: tuple[int, ...]
    preds: tuple[tuple[int, ...], ...]
    backward: tuple[bool, ...]
    names: tuple[str, ...]

    def __post_init__(self) -> None:
        n = len(self.cost)
        if not (len(self.ram) == len(self.preds) == len(self.backward) == len(self.names) == n):
            raise ValueError("cost, ram, preds, backward and names must have one entry per node")
        for v, ps in enumerate(self.preds):
            if any(not 0 <= p < v for p in ps) or len(set(ps)) != len(ps):
                raise ValueError(f"node {v}: predecessors {ps} are not distinct earlier nodes")

    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.cost)

    @functools.cached_property
    def succs(self) -> tuple[tuple[int, ...], ...]:
        """Successors of each node, ascending."""
        out: list[list[int]] = [[] for _ in range(self.n)]
        for v, ps in enumerate(self.preds):
            for p in ps:
                out[p].append(v)
        return tuple(tuple(s) for s in out)

    @functools.cached_property
    def edges(self) -> tuple[tuple[int, int], ...]:
        """All edges ``(u, v)``, grouped by ``v`` ascending."""
        return tuple((u, v) for v, ps in enumerate(self.preds) for u in ps)

    @property
    def outputs(self) -> tuple[int, ...]:
        """The graph's final outputs: nodes nobody consumes."""
        return tuple(v for v in range(self.n) if not self.succs[v])

    @property
    def total_cost(self) -> float:
        """Cost of computing every node exactly once."""
        return float(sum(self.cost))

    def memory_floor(self) -> int:
        """A lower bound on any schedule's peak: a node's output plus all its inputs."""
        return max(self.ram[v] + sum(self.ram[p] for p in self.preds[v]) for v in range(self.n))

    @classmethod
    def from_networkx(
        cls, g: nx.DiGraph, *, cost: str, ram: str, order: list | None = None
    ) -> ComputeGraph:
        """Relabels ``g`` to ``0..n-1`` along ``order``.

        ``order`` defaults to the lexicographic topological order.
        """
        if order is None:
            order = list(nx.lexicographical_topological_sort(g))
        index = {node: i for i, node in enumerate(order)}
        data = [g.nodes[node] for node in order]
        return cls(
            cost=tuple(float(d[cost]) for d in data),
            ram=tuple(int(d[ram]) for d in data),
            preds=tuple(tuple(sorted(index[p] for p in g.predecessors(node))) for node in order),
            backward=tuple(bool(d.get("backward", False)) for d in data),
            names=tuple(str(d.get("name", node)) for node, d in zip(order, data, strict=True)),
        )


def load_graph_json(path: str | os.PathLike) -> ComputeGraph:
    """Loads a networkx node-link JSON benchmark graph.

    Two formats are understood: Checkmate's (``cost_cpu``, ``cost_ram``, ``backward``,
    ``name`` per node, ``source``/``target`` per link) and the Moccasin random layered
    graphs (``duration``, ``out_cost`` per node, links keyed ``"0"``/``"1"``, a
    topological ``order`` in the graph attributes); the latter have no backward nodes.

    Args:
      path: the JSON file (for example one of Checkmate's ``*_nx.json`` graphs).

    Returns:
      The graph, its nodes in a topological order.

    Example:
      >>> import json, os, tempfile, autoremat_solvers as ars
      >>> doc = {"directed": True, "multigraph": False, "graph": {},
      ...        "nodes": [{"id": 0, "cost_cpu": 1, "cost_ram": 8, "backward": False,
      ...                   "name": "f"}, {"id": 1, "cost_cpu": 2, "cost_ram": 8,
      ...                   "backward": True, "name": "f_grad"}],
      ...        "links": [{"source": 0, "target": 1}]}
      >>> path = os.path.join(tempfile.mkdtemp(), "g.json")
      >>> with open(path, "w") as f:
      ...     json.dump(doc, f)
      >>> ars.load_graph_json(path).n
      2
    """
    with open(path) as f:
        data = json.load(f)
    if data["links"] and "source" not in data["links"][0]:
        g = nx.node_link_graph(data, edges="links", source="0", target="1")
        return ComputeGraph.from_networkx(
            g, cost="duration", ram="out_cost", order=data["graph"].get("order")
        )
    g = nx.node_link_graph(data, edges="links")
    return ComputeGraph.from_networkx(g, cost="cost_cpu", ram="cost_ram")


def _with_backward(fwd_preds: list[list[int]], cost: np.ndarray, ram: np.ndarray) -> ComputeGraph:
    """Appends a loss and a gradient node per forward node, in Checkmate's style.

    The gradient of forward node ``v`` consumes ``v``'s inputs, ``v`` itself and the
    gradients of ``v``'s consumers (the loss for forward sinks). It costs twice ``v``.
    """
    m = len(fwd_preds)
    fwd_succs: list[list[int]] = [[] for _ in range(m)]
    for v, ps in enumerate(fwd_preds):
        for p in ps:
            fwd_succs[p].append(v)
    loss = m
    grad = {v: 2 * m - v for v in range(m)}  # reverse topological order after the loss
    preds: list[tuple[int, ...]] = [tuple(sorted(ps)) for ps in fwd_preds]
    preds.append(tuple(v for v in range(m) if not fwd_succs[v]))
    for v in reversed(range(m)):
        upstream = [grad[s] for s in fwd_succs[v]] or [loss]
        preds.append(tuple(sorted({*fwd_preds[v], v, *upstream})))
    fwd_cost = [float(c) for c in cost]
    fwd_ram = [int(r) for r in ram]
    return ComputeGraph(
        cost=tuple(fwd_cost + [1.0] + [2.0 * fwd_cost[v] for v in reversed(range(m))]),
        ram=tuple(fwd_ram + [1] + [fwd_ram[v] for v in reversed(range(m))]),
        preds=tuple(preds),
        backward=tuple([False] * m + [True] * (m + 1)),
        names=tuple(
            [f"f{v}" for v in range(m)] + ["loss"] + [f"f{v}_grad" for v in reversed(range(m))]
        ),
    )


def chain_training_graph(m: int, *, cost: float = 1.0, ram: int = 100) -> ComputeGraph:
    """A linear network of ``m`` uniform layers plus its loss and gradients.

    Args:
      m: forward layers.
      cost: compute cost of each forward layer (each gradient costs twice that).
      ram: bytes of each layer's output.

    Returns:
      The graph (``2m + 1`` nodes).

    Example:
      >>> import autoremat_solvers as ars
      >>> ars.chain_training_graph(4).n
      9
    """
    return _with_backward(
        [[v - 1] if v else [] for v in range(m)], np.full(m, cost), np.full(m, ram)
    )


def random_layered_training_graph(
    n_layers: int, max_width: int, *, seed: int, skip_prob: float = 0.2
) -> ComputeGraph:
    """A random layered forward DAG plus its loss and gradients.

    Layer ``l`` has 1..``max_width`` nodes; each node consumes one random node of the
    previous layer and, with probability ``skip_prob``, one random earlier node. Costs are
    uniform in [1, 10], sizes in [1, 10] * 100 bytes.

    Args:
      n_layers: forward layers.
      max_width: the most nodes in a layer.
      seed: the random seed (the same seed, the same graph).
      skip_prob: probability that a node also reads a random earlier node.

    Returns:
      The graph, forward nodes first.

    Example:
      >>> import autoremat_solvers as ars
      >>> g = ars.random_layered_training_graph(5, 3, seed=0)
      >>> g == ars.random_layered_training_graph(5, 3, seed=0)
      True
    """
    rng = np.random.default_rng(seed)
    layers: list[list[int]] = []
    fwd_preds: list[list[int]] = []
    for layer in range(n_layers):
        width = int(rng.integers(1, max_width + 1)) if 0 < layer < n_layers - 1 else 1
        nodes = []
        for _ in range(width):
            v = len(fwd_preds)
            ps: set[int] = set()
            if layers:
                ps.add(int(rng.choice(layers[-1])))
                if rng.random() < skip_prob:
                    ps.add(int(rng.integers(0, layers[-1][0])) if layers[-1][0] else 0)
            fwd_preds.append(sorted(ps))
            nodes.append(v)
        layers.append(nodes)
    m = len(fwd_preds)
    return _with_backward(
        fwd_preds, rng.integers(1, 11, m).astype(float), rng.integers(1, 11, m) * 100
    )
