"""Compiles each FULL corpus model's training step for a TPU target, ahead of time on this
machine, without remat and under the hand baseline (``nothing_saveable`` on every block).

    python -m bench.corpus.measure [--model linen-cnn ...] [--target tpu-v5e] [--out DIR]

Prints one row per model (parameters, the compiler's peak without remat and with the hand
baseline, compile seconds of each) and, with ``--out``, writes ``corpus.md`` and
``corpus.json`` there. Needs ``libtpu`` (``pip install "autoremat[tpu]"``).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import jax

from autoremat import _measure
from bench import corpus

MIB = 2**20


def measure(name: str, target: str) -> dict:
    """Parameter MiB, and peak MiB and compile seconds without remat and for the hand
    baseline."""
    model = corpus.get(name)
    args = (model.param_shapes(), model.batch_shapes())
    argnums = _measure.float_argnums(args)
    row: dict = {"model": name, "description": model.description,
                 "params_mib": sum(math.prod(x.shape) * x.dtype.itemsize
                                   for x in jax.tree.leaves(args[0])) / MIB}
    for key, policy in (("none", None), ("hand", jax.checkpoint_policies.nothing_saveable)):
        m = _measure.measure_step(model.make_loss(policy), *args, target=target,
                                  argnums=argnums)
        row[f"{key}_peak_mib"] = m.peak_bytes / MIB
        row[f"{key}_compile_s"] = m.compile_seconds
    return row


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = ["| model | params MiB | no-remat peak MiB | hand peak MiB | compile s (none / hand) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['model']} | {r['params_mib']:.1f} | {r['none_peak_mib']:.1f} | "
              f"{r['hand_peak_mib']:.1f} | {r['none_compile_s']:.1f} / {r['hand_compile_s']:.1f} |"
              for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", action="append",
                        help="a FULL corpus model (repeatable); default: all of them")
    parser.add_argument("--target", default="tpu-v5e")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    names = args.model or [n for n in corpus.CORPUS if not n.endswith("-tiny")]
    rows = []
    for name in names:
        rows.append(measure(name, args.target))
        r = rows[-1]
        print(f"{name}: params {r['params_mib']:.1f} MiB, peak {r['none_peak_mib']:.1f} MiB "
              f"({r['none_compile_s']:.1f} s) without remat, {r['hand_peak_mib']:.1f} MiB "
              f"({r['hand_compile_s']:.1f} s) hand", file=sys.stderr, flush=True)
    print(table(rows))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "corpus.md").write_text(
            f"TPU compiler ({args.target}), ahead of time.\n\n{table(rows)}\n")
        (args.out / "corpus.json").write_text(json.dumps(
            {"target": args.target, "jax": jax.__version__, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
