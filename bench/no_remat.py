"""The model of no remat against the compiler, on the corpus and the zoo.

For each model, the peak of the step run as written (no checkpoint) as the memory model
predicts it, two ways: saving every value the backward pass reads (what a checkpointed
plan that recomputes nothing holds, :func:`autoremat._solve.no_remat`), and as the
compiler runs the function written, fusing elementwise chains into the backward
(:func:`autoremat._solve.as_written`, what ``Plan.no_remat_peak_bytes`` is); both the
least over the planner's placements. Then the compiler's peak of that step, ahead of
time for the target. Writes ``no-remat.md`` and ``no-remat.json``.

    pip install -e ".[tpu,corpus]"
    python bench/no_remat.py --out bench/results             # every full-size model
    python bench/no_remat.py --model eqx-mlp --model gpt2-small
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics

import autoremat
from autoremat import _cli, _rewrite, _solve, zoo
from autoremat._benchmark import versions
from autoremat._layout import LAYOUTS
from autoremat._planner._candidates import candidates, least_no_remat
from autoremat._planner._options import PlanOptions

CORPUS = _cli._load_corpus(pathlib.Path(__file__).parent / "corpus")


def _model(name: str) -> zoo.ZooModel:
    return CORPUS[name] if name in CORPUS else zoo.get(name)


def measure(name: str, target: str, layout: str) -> dict:
    """Both predicted no-remat peaks of model ``name`` and its compiler peak."""
    m = _model(name)
    loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    options = PlanOptions(layout=layout)
    placed = [(c.facts, *c.problem(options)) for c in candidates(flat_fn, avals, options)]
    saving_all = min(_solve.no_remat(g, p).peak_bytes for _, g, p in placed)
    _, graph, written = least_no_remat(placed)
    real = autoremat.measure_step(loss, *args, target=target).peak_bytes
    row = {"model": name, "saving_all_bytes": saving_all, "as_written_bytes": written.peak_bytes,
           "compiler_bytes": real, "saving_all_error": saving_all / real - 1,
           "as_written_error": written.peak_bytes / real - 1,
           "regions": len(graph.regions)}
    print(f"{name}: saving all {saving_all / 2**20:.0f} MiB ({row['saving_all_error']:+.1%}), "
          f"as written {written.peak_bytes / 2**20:.0f} MiB ({row['as_written_error']:+.1%}), "
          f"compiler {real / 2**20:.0f} MiB", flush=True)
    return row


def _summary(rows: list[dict], key: str) -> str:
    errors = [abs(r[key]) for r in rows]
    under = sum(r[key] < 0 for r in rows)
    return (f"median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%}, "
            f"{sum(e <= 0.05 for e in errors)}/{len(rows)} within 5%, {under} under")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    full = [n for n in (*CORPUS, *zoo.ZOO) if not n.endswith("-tiny")]
    parser.add_argument("--model", action="append", choices=sorted({*CORPUS, *zoo.ZOO}))
    parser.add_argument("--target", default="tpu-v5e")
    parser.add_argument("--layout", default="dense", choices=LAYOUTS)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    args = parser.parse_args()
    names = args.model or full
    rows = [measure(name, args.target, args.layout) for name in names]
    lines = ["| model | regions | saving all MiB | error | as written MiB | error | compiler MiB |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['regions']} | {r['saving_all_bytes'] / 2**20:.0f} | "
              f"{r['saving_all_error']:+.1%} | {r['as_written_bytes'] / 2**20:.0f} | "
              f"{r['as_written_error']:+.1%} | {r['compiler_bytes'] / 2**20:.0f} |" for r in rows]
    command = "python bench/no_remat.py" + "".join(f" --model {m}" for m in args.model or ())
    if args.layout != "dense":
        command += f" --layout {args.layout}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "no-remat.md").write_text(
        f"# The model of no remat vs the {args.target} compiler\n\n"
        f"Made with `{command}`; versions {json.dumps(versions())}. The step run as "
        "written (no checkpoint): its peak as the model predicts it saving every value the "
        "backward pass reads (`_solve.no_remat`), and as the compiler runs it, elementwise "
        "chains fused into the backward (`_solve.as_written`, `Plan.no_remat_peak_bytes`); "
        "the least over the planner's placements (regions: of the placement the second "
        "comes from); then the compiler's peak. Layout: "
        f"{args.layout}.\n\n" + "\n".join(lines) + "\n\n"
        f"Saving all: {_summary(rows, 'saving_all_error')}.\n\n"
        f"As written: {_summary(rows, 'as_written_error')}.\n")
    (args.out / "no-remat.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
