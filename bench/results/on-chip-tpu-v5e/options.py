"""The plans in ``plans-msa-off/`` (verified ahead of time with the options autoremat
compiled TPU steps with until 2026-12-05: ``xla_msa_enable=false`` and the compiler's own
remat off), compiled again for ``tpu-v5e`` with JAX's default options, the compile a
user's ``jax.jit`` gets on the chip (and ``verify``'s since then); one JSON line per model.

    PYTHONPATH=. python bench/results/on-chip-tpu-v5e/options.py [MODEL ...] > options.jsonl
    PYTHONPATH=. python bench/results/on-chip-tpu-v5e/options.py --table options.jsonl
"""

from __future__ import annotations

import json
import pathlib
import sys

import autoremat
from autoremat import _measure
from bench import corpus, on_chip

MIB = 2**20
HERE = pathlib.Path(__file__).parent


def compile_row(saved: dict) -> dict:
    """``saved`` (a row of ``plans-msa-off/plans.json``) with each variant's peak under
    JAX's default options."""
    model = corpus.get(saved["model"])
    args = (model.param_shapes(), model.batch_shapes())
    loss = model.make_loss()
    row = {"model": saved["model"]}
    for variant, fn in (("none", loss), ("hand", model.make_loss(on_chip.HAND))):
        row[variant] = {"msa_off": saved[variant]}
        row[variant]["default"] = _measure.measure_step(
            fn, *args, argnums=_measure.float_argnums(args)).peak_bytes
    for key in on_chip.PLANS:
        path = HERE / "plans-msa-off" / f"{saved['model']}.{key}.json"
        plan = autoremat.load_plan(path, loss, *args)
        row[key] = {"budget": plan.budget_bytes, "msa_off": saved[key]["aot"],
                    "default": _measure.measure_step(
                        plan.apply(loss), *args, argnums=_measure.float_argnums(args)).peak_bytes}
    return row


def table(rows: list[dict]) -> str:
    """Per model and variant: the budget, both peaks, and the default one over budget."""
    lines = ["| model | variant | budget MiB | options until 2026-12-05 MiB | default options "
             "MiB | default over budget |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for row in rows:
        for variant in ("none", "hand", *on_chip.PLANS):
            v = row[variant]
            budget = f"{v['budget'] / MIB:.1f}" if "budget" in v else "-"
            over = f"{v['default'] / v['budget'] - 1:+.1%}" if "budget" in v else "-"
            lines.append(f"| {row['model']} | {variant} | {budget} | {v['msa_off'] / MIB:.1f} | "
                         f"{v['default'] / MIB:.1f} | {over} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--table"]:
        print(table([json.loads(line) for line in pathlib.Path(argv[1]).read_text().splitlines()]))
        return
    saved = json.loads((HERE / "plans-msa-off" / "plans.json").read_text())["rows"]
    for row in saved:
        if not argv or row["model"] in argv:
            print(json.dumps(compile_row(row)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
