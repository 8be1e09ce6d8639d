"""Writes ``corpus.md``, ``corpus.json`` and ``corpus.png`` from the per-model sweeps that
``autoremat bench --corpus`` left in ``RESULTS/corpus/`` (for a run stopped part way, or
models swept in separate runs).

    python bench/corpus_summary.py [RESULTS]   # default: bench/results
"""

from __future__ import annotations

import json
import pathlib
import sys

from autoremat import _benchmark, _cli


def main(results: pathlib.Path) -> None:
    docs = [json.loads(p.read_text()) for p in sorted((results / "corpus").glob("*.json"))]
    sweeps = [_benchmark.from_json(d) for d in docs]
    commands = sorted({d["command"] for d in docs})
    _cli._write_corpus_summary(sweeps, results, sweeps[0].target or "none",
                               "; ".join(commands))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results"))
