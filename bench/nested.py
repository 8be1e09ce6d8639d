"""Floors with nested regions, on the real TPU compiler.

For each model, the ``budget="floor"`` plan without nesting and with it
(``nested_scans=True`` for scanned models, ``nested_segments=True`` for unrolled ones; see
:func:`autoremat.plan`), beside ``nothing_saveable`` per layer: predicted and compiled peak
(TPU v5e, ahead of time) and recompute overhead (FLOPs of the differentiated jaxpr over no
remat's).

Usage: ``python bench/nested.py [--verify] [--out bench/results]`` (``--verify``: the
floor plans with ``verify="tpu-v5e"``, the lowest on the compiler of those the model puts
within 10% of its floor); set ``AUTOREMAT_MEASURE_CACHE`` to
reuse compiles. Writes ``nested.md`` and ``nested.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import sys

import jax

import autoremat
from autoremat import _benchmark, _measure, zoo

# (model, layout, the nesting option that applies to it)
CASES = [("gpt2-small-scan", "dense", "nested_scans"), ("llama", "dense", "nested_scans"),
         ("gpt2-small", "dense", "nested_segments"), ("unet", "tpu", "nested_segments")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    parser.add_argument("--verify", action="store_true")
    options = parser.parse_args()
    out, verify = options.out, "tpu-v5e" if options.verify else None
    rows = []
    for name, layout, option in CASES:
        model = zoo.get(name)
        args = (model.param_shapes(), model.batch_shapes())
        loss = model.make_loss()
        base = _benchmark.program_flops(loss, *args)
        builtin = model.make_loss(jax.checkpoint_policies.nothing_saveable)
        rows.append({"model": name, "plan": "nothing_saveable per layer",
                     "real_peak_bytes": _measure.measure_step(builtin, *args).peak_bytes,
                     "overhead": _benchmark.program_flops(builtin, *args) / base - 1})
        for nested in (False, True):
            p = autoremat.plan(loss, *args, budget="floor", layout=layout, verify=verify,
                               **{option: nested})
            fn = p.apply(loss)
            rows.append({"model": name,
                         "plan": f"floor, layout={layout}" + (f", {option}=True" if nested else "")
                         + (", verify" if verify else ""),
                         "placement": {"scan_groups": p.placement.scan_groups,
                                       "segment_group": p.placement.segment_group},
                         "predicted_peak_bytes": p.peak_bytes,
                         "real_peak_bytes": _measure.measure_step(fn, *args).peak_bytes,
                         "overhead": _benchmark.program_flops(fn, *args) / base - 1})
        for r in rows[-3:]:
            print(name, r["plan"], f"{r['real_peak_bytes'] / 2**20:.1f} MiB",
                  f"{r['overhead']:+.2%}", flush=True)
    lines = ["# Floors with nested regions (TPU v5e)", "",
             __doc__.split("\n\n", 1)[1].split("\nUsage")[0].strip(), "",
             (f"Made with `{shlex.join(['python', *sys.argv])}`; versions: "
              f"{json.dumps(_benchmark.versions())}."),
             "", "| model | plan | predicted peak MiB | real peak MiB | overhead |",
             "|---|---|---|---|---|"]
    for r in rows:
        predicted = r.get("predicted_peak_bytes")
        lines.append(f"| {r['model']} | {r['plan']} | "
                     f"{'-' if predicted is None else f'{predicted / 2**20:.1f}'} | "
                     f"{r['real_peak_bytes'] / 2**20:.1f} | {r['overhead']:+.2%} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "nested.md").write_text("\n".join(lines) + "\n")
    (out / "nested.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
