"""What restructuring a scanned model's layer loop buys, on the real TPU compiler.

Two ways to go past one ``jax.checkpoint`` policy per scanned layer, measured on the zoo's
GPT-2-small scanned (peak bytes and FLOPs of the training step, TPU v5e, ahead of time):

* **Nested checkpoints** (Chen et al. 2016, sqrt(n)): the 12 layers run as an outer scan
  over groups of ``k``, each group in a ``jax.checkpoint`` that keeps only its input, the
  layers inside under ``nothing_saveable``. The backward recomputes a group's forward, then
  each of its layers again: ``12 / k + k`` layer inputs are kept instead of 12.
* **autoremat's floor plans** (``budget="floor"``): one checkpoint per layer, and with
  ``nested_scans=True`` (groups of 3, the plan's decisions inside each layer).
* **Mixing two policies across layers**: two scans of 6 layers each, one under each
  policy (the straight line between two built-in points in ``bench/results`` assumes a
  user can do this at no cost). Each scan's backward sums the stacked weights' gradient
  in a buffer of its own (see ``autoremat._trace.graph_of``).

Usage: ``python bench/scan_structure.py [--out bench/results]``; set
``AUTOREMAT_MEASURE_CACHE`` to reuse compiles. Writes ``scan_structure.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
from collections.abc import Callable
from typing import Any

import jax

import autoremat
from autoremat import _benchmark, _measure, zoo
from autoremat._budget import format_bytes
from autoremat.zoo import _layers, gpt2

NOTHING = jax.checkpoint_policies.nothing_saveable


def _loss(run_layers: Callable[[Callable, Any, jax.Array], jax.Array]) -> Callable:
    """GPT-2-small scanned's loss with its layer loop replaced by ``run_layers``."""
    c = dataclasses.replace(gpt2.GPT2_SMALL, scan_layers=True)

    def layer(p: Any, x: jax.Array) -> jax.Array:
        return gpt2.block(p, x, c.n_head)

    def loss(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        tokens = batch["tokens"]
        x = params["wte"][tokens] + params["wpe"][: tokens.shape[1]]
        x = run_layers(layer, params["layers"], x)
        x = _layers.layer_norm(x, params["lnf_g"], params["lnf_b"])
        return _layers.cross_entropy(x @ params["wte"].T, batch["targets"])

    return loss


def _scan(block: Callable, layers: Any, x: jax.Array, policy: Callable) -> jax.Array:
    step = jax.checkpoint(block, policy=policy, prevent_cse=False)
    return jax.lax.scan(lambda h, p: (step(p, h), None), x, layers)[0]


def nested(k: int) -> Callable:
    """Groups of ``k`` layers, each group checkpointed around its own scan."""

    def run(block: Callable, layers: Any, x: jax.Array) -> jax.Array:
        grouped = jax.tree.map(lambda w: w.reshape(-1, k, *w.shape[1:]), layers)
        group = jax.checkpoint(lambda h, ps: _scan(block, ps, h, NOTHING),
                               policy=NOTHING, prevent_cse=False)
        return jax.lax.scan(lambda h, ps: (group(h, ps), None), x, grouped)[0]

    return _loss(run)


def mixed(first: Callable, second: Callable, split: int = 6) -> Callable:
    """The first ``split`` layers under ``first``, the rest under ``second``."""

    def run(block: Callable, layers: Any, x: jax.Array) -> jax.Array:
        head = jax.tree.map(lambda w: w[:split], layers)
        tail = jax.tree.map(lambda w: w[split:], layers)
        return _scan(block, tail, _scan(block, head, x, first), second)

    return _loss(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    out = parser.parse_args().out
    model = zoo.get("gpt2-small-scan")
    args = (model.param_shapes(), model.batch_shapes())
    save_out_proj = zoo.preset_policy("save_out_proj", model)
    loss = model.make_loss()
    floors = {nested: autoremat.plan(loss, *args, budget="floor", nested_scans=nested)
              for nested in (False, True)}
    variants = {
        "autoremat floor plan": floors[False].apply(loss),
        "autoremat floor plan, nested_scans=True (groups of 3)": floors[True].apply(loss),
        "per layer: nothing_saveable (built-in)": model.make_loss(NOTHING),
        "per layer: save_out_proj (MaxText preset)": model.make_loss(save_out_proj),
        "nested, groups of 3 (4 + 3 layer inputs kept)": nested(3),
        "nested, groups of 4 (3 + 4 layer inputs kept)": nested(4),
        "two scans of 6: nothing_saveable, nothing_saveable": mixed(NOTHING, NOTHING),
        "two scans of 6: nothing_saveable, save_out_proj": mixed(NOTHING, save_out_proj),
        "two scans of 6: save_out_proj, nothing_saveable": mixed(save_out_proj, NOTHING),
    }
    base_flops = _benchmark.program_flops(model.make_loss(), *args)
    base = _measure.measure_step(model.make_loss(), *args)
    rows = []
    for name, loss in variants.items():
        m = _measure.measure_step(loss, *args)
        rows.append({"variant": name, "peak_bytes": m.peak_bytes,
                     "program_overhead": _benchmark.program_flops(loss, *args) / base_flops - 1,
                     "compiler_overhead": m.flops / base.flops - 1})
        print(f"{name}: {format_bytes(m.peak_bytes)}, program "
              f"{rows[-1]['program_overhead']:+.2%}", flush=True)
    lines = ["# Restructuring GPT-2-small scanned's layer loop (TPU v5e)", "",
             __doc__.split("\n\n", 1)[1].split("\nUsage")[0].strip(), "",
             f"Versions: {json.dumps(_benchmark.versions())}.", "",
             "| variant | real peak MiB | program overhead | compiler overhead |",
             "|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['peak_bytes'] / 2**20:.1f} | {r['program_overhead']:+.2%}"
              f" | {r['compiler_overhead']:+.2%} |" for r in rows]
    out.mkdir(parents=True, exist_ok=True)
    (out / "scan_structure.md").write_text("\n".join(lines) + "\n")
    (out / "scan_structure.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
