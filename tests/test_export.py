"""Exporting training steps as Checkmate-style graphs for the solvers' benchmark."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import networkx as nx
from autoremat_solvers import BASELINES, load_graph_json, simulate

from autoremat import _export, _program, zoo

CHECKMATE_NODE_KEYS = {"id", "name", "backward", "cost_cpu", "cost_ram"}


def _program_flops(fn, *args) -> int:
    """FLOPs of ``fn``'s program after dead-code elimination."""
    program = _program.flatten(jax.make_jaxpr(fn)(*args))
    return sum(_export._flops(program, e) for e in program.eqns)


def test_small_step_has_one_node_per_dot(tmp_path):
    def loss(w, x):
        h = jnp.tanh(x @ w["a"])
        h = h + jnp.sin(h @ w["b"])
        return jnp.mean(h**2)

    w = {"a": jax.ShapeDtypeStruct((4, 8), jnp.float32),
         "b": jax.ShapeDtypeStruct((8, 8), jnp.float32)}
    data = _export.training_graph(loss, w, jax.ShapeDtypeStruct((2, 4), jnp.float32), name="toy")
    assert data["graph"] == {"name": "toy_train"}
    # Forward: tanh(x @ a); sin(h @ b) with the residual add and the sum of squares. Then the
    # loss (mean's division), the seed's elementwise backward, and the dots' transposes.
    assert [n["name"].split("@")[0] for n in data["nodes"]] == [
        "0:dot_general", "1:dot_general", "2:div", "3:div", "4:dot_general", "5:dot_general",
        "6:dot_general"]
    assert [n["backward"] for n in data["nodes"]] == [False] * 2 + [True] * 5
    # Node 1 returns two (2, 8) residuals for the backward (sin's and the square's) and the
    # sum; the loss node the loss and its seed.
    assert [n["cost_ram"] for n in data["nodes"][1:3]] == [2 * (2 * 8 * 4) + 4, 4 + 4]
    path = tmp_path / "toy__train_nx.json"
    path.write_text(json.dumps(data))
    g = load_graph_json(path)
    assert sorted(g.ram[v] for v in g.outputs) == [4 * 8 * 4, 8 * 8 * 4]  # the weights' gradients


def test_zoo_graph_loads_replays_and_accounts_every_flop(tmp_path):
    model = zoo.get("mlp-tiny")
    loss, params, batch = model.make_loss(), model.param_shapes(), model.batch_shapes()
    data = _export.training_graph(loss, params, batch, name=model.name)
    assert all(set(n) == CHECKMATE_NODE_KEYS for n in data["nodes"])
    assert [n["id"] for n in data["nodes"]] == list(range(len(data["nodes"])))
    path = tmp_path / "mlp-tiny__zoo_train_nx.json"
    path.write_text(json.dumps(data))
    g = load_graph_json(path)  # checks that ids are topological: preds[v] < v
    assert 30 <= g.n <= 400
    assert nx.is_directed_acyclic_graph(nx.node_link_graph(data, edges="links"))
    loss_node = g.backward.index(True)
    assert g.backward == (False,) * loss_node + (True,) * (g.n - loss_node)
    assert g.cost[loss_node] == 1 and g.ram[loss_node] == 8  # mean's division; loss and seed

    forward = sum(c for c, b in zip(g.cost, g.backward, strict=True) if not b) + g.cost[loss_node]
    assert forward == _program_flops(lambda p, b: jax.vjp(lambda q: loss(q, b), p), params, batch)
    assert g.total_cost == _program_flops(jax.value_and_grad(loss), params, batch)

    sim = simulate(g, BASELINES["checkpoint_all"](g, math.inf).schedule, math.inf)
    assert sim.ok and sim.cost == g.total_cost and g.memory_floor() <= sim.peak_ram
