"""Graph loading, generators and the memory floor."""

import json
import pathlib

import networkx as nx
import pytest
from autoremat_solvers import (
    chain_training_graph,
    load_graph_json,
    random_layered_training_graph,
)
from autoremat_solvers.graph import ComputeGraph

SHARED = pathlib.Path(__file__).resolve().parents[3] / "shared" / "benchmarks" / "checkmate-graphs"


def test_chain_structure():
    g = chain_training_graph(3)
    assert g.n == 7
    assert g.names == ("f0", "f1", "f2", "loss", "f2_grad", "f1_grad", "f0_grad")
    assert g.preds[3] == (2,)
    assert g.preds[4] == (1, 2, 3)  # f2's input, f2, and the loss
    assert g.outputs == (6,)
    assert g.memory_floor() == 400  # f1_grad: f0, f1, f2_grad and itself


def test_random_layered_is_topological_and_deterministic():
    g = random_layered_training_graph(6, 3, seed=1)
    assert g == random_layered_training_graph(6, 3, seed=1)
    assert all(p < v for v, ps in enumerate(g.preds) for p in ps)
    assert sum(g.backward) == g.n // 2 + 1


def test_rejects_non_topological_preds():
    with pytest.raises(ValueError):
        ComputeGraph(
            cost=(1.0, 1.0), ram=(1, 1), preds=((1,), ()), backward=(False, False), names=("a", "b")
        )


def test_load_checkmate_format(tmp_path):
    g = nx.DiGraph()
    g.add_node(7, name="x", backward=False, cost_cpu=3, cost_ram=10)
    g.add_node(5, name="y", backward=True, cost_cpu=4, cost_ram=20)
    g.add_edge(7, 5)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(nx.node_link_data(g, edges="links")))
    cg = load_graph_json(path)
    assert cg.names == ("x", "y") and cg.preds == ((), (0,))
    assert cg.cost == (3.0, 4.0) and cg.ram == (10, 20) and cg.backward == (False, True)


def test_load_random_layered_format(tmp_path):
    data = {
        "directed": True,
        "multigraph": False,
        "graph": {"order": [0, 2, 1]},
        "nodes": [
            {"name": 0, "out_cost": 5, "duration": 0},
            {"name": 1, "out_cost": 6, "duration": 2},
            {"name": 2, "out_cost": 7, "duration": 3},
        ],
        "links": [{"0": 0, "1": 2}, {"0": 2, "1": 1}],
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    cg = load_graph_json(path)
    assert cg.names == ("0", "2", "1") and cg.preds == ((), (0,), (1,))
    assert cg.ram == (5, 7, 6) and cg.cost == (0.0, 3.0, 2.0)


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared Checkmate graphs absent")
def test_shared_vgg16():
    g = load_graph_json(SHARED / "VGG16__MLSys__256__224__224__3__train_nx.json")
    assert g.n == 45 and g.names[22] == "Loss" and g.backward[22] and not g.backward[21]
