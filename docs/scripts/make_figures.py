"""Draws the figures of the documentation that come from autoremat itself.

    python docs/scripts/make_figures.py        # writes docs/images/*.png (about a minute on a CPU)

Needs matplotlib (``pip install -e ".[plots]"``). The figures are committed; run this
again when the memory model or the zoo changes. Benchmark plots are not made here: they
live in ``bench/results/`` (``autoremat bench``) and the docs link to them.
"""

from __future__ import annotations

import pathlib

import jax

import autoremat
from autoremat import zoo
from autoremat._budget import format_bytes

IMAGES = pathlib.Path(__file__).resolve().parents[1] / "images"
MODEL = "gpt2-small-tiny"


def memory_timeline() -> None:
    """The modelled memory over the step of a plan halfway between the floor and no remat."""
    model = zoo.get(MODEL)
    params, batch = model.param_shapes(), model.batch_shapes()
    loss = model.make_loss()
    no_remat = autoremat.plan(loss, params, batch, budget=1.0)
    floor = autoremat.plan(loss, params, batch, budget="floor")
    budget = (floor.peak_bytes + no_remat.peak_bytes) // 2
    plan = autoremat.plan(loss, params, batch, budget=budget)
    path = IMAGES / f"memory-{MODEL}.png"
    plan.plot_memory(path, title=f"{MODEL}: budget {format_bytes(budget)}")
    print(f"{path}: budget {format_bytes(budget)}, "
          f"predicted peak {format_bytes(plan.peak_bytes)}"
          f" (no remat {format_bytes(no_remat.peak_bytes)},"
          f" floor {format_bytes(floor.peak_bytes)}),"
          f" overhead {plan.overhead:.2%}, {plan.status}")


if __name__ == "__main__":
    jax.config.update("jax_platforms", "cpu")
    IMAGES.mkdir(exist_ok=True)
    memory_timeline()
