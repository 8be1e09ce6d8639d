"""MkDocs hook: files from outside ``docs/``, and API reference pages made from ``__all__``.

* The notebooks (``notebooks/*.ipynb``, rendered by mkdocs-jupyter), the planner's and the
  integer program's READMEs (``autoremat/_planner/README.md``,
  ``solvers/autoremat_ilp/README.md``) and the benchmark
  results (``bench/results/``, ``solvers/bench/results/``: tables, plots, JSON) are
  served under the same paths they have in the repository, so the docs link to the one
  copy of each figure instead of repeating it. Result pages missing from ``nav`` are
  added to its "Results" section, so that a new table does not break the strict build,
  and a result page shows the plot and links the JSON beside it (``MODEL.png``,
  ``MODEL.json``; ``overhead.png`` and ``results.json`` for the solver benchmark).
* ``<!-- autoremat-help: CMD ... -->`` in a page becomes the ``--help`` of ``autoremat``
  and of each command named, as the installed command line prints them (so the page is
  never out of date).
* ``reference/autoremat.md``, ``reference/zoo.md``, ``reference/solvers.md`` and
  ``reference/ilp.md`` are written from the ``__all__`` of ``autoremat``, ``autoremat.zoo``,
  ``autoremat_solvers`` and ``autoremat_ilp``
  (read from the source, nothing imported), grouped by :data:`GROUPS`; a name not in any
  group is listed under "More", so every public name is documented.
"""

from __future__ import annotations

import ast
import pathlib
import re

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Repository folders served as they are, and the files of each that the site takes.
EXTERNAL = {
    "notebooks": ("*.ipynb",),
    "autoremat/_planner": ("README.md",),
    "solvers/autoremat_ilp": ("README.md",),
    "bench/results": ("*.md", "*.png", "*.json", "corpus/*.md", "corpus/*.png", "corpus/*.json",
                      "corpus-default-compile/**/*.md", "corpus-default-compile/**/*.png",
                      "corpus-default-compile/**/*.json",
                      "corpus-no-verify-default-compile/**/*.md",
                      "corpus-no-verify-default-compile/**/*.png",
                      "corpus-no-verify-default-compile/**/*.json", "on-chip-tpu-v5e/*.md",
                      "on-chip-tpu-v5e/zoo-floor/*", "planning-time-before/*",
                      "planning-time-backends/*", "planning-time-ee9a66f/*",
                      "planning-time-f4309e7/**/*", "planning-time-4619239/**/*",
                      "planning-time-presolve/**/*", "zoo-no-verify-tpu/*",
                      "grad-buffer-evidence/*", "memory-space-evidence/*",
                      "no-remat-default-compile/*", "zoo-default-compile/*",
                      "chip-hbm-room/*", "corpus-device-memory/*",
                      "corpus-no-verify-device-memory/**/*",
                      "corpus-device-memory-sweep/**/*", "zoo-device-memory-sweep/*",
                      "fidelity-device-memory/**/*"),
    "solvers/bench/results": ("*.md", "*.png", "*.json", "exact/**/*.md", "exact/**/*.png",
                              "exact/**/*.json", "zoo/*.md", "zoo/*.png", "zoo/*.json"),
}
RESULTS_SECTION = "Results"

# Reference pages: (page, module, source of its __all__, title, intro, groups).
# Groups are (heading, names); names no longer public are skipped.
GROUPS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "autoremat": [
        ("Planning", ("plan", "optimize", "Plan", "Placement", "PlanOptions", "parse_budget")),
        ("Policy files", ("save_plan", "load_plan", "PolicyFile")),
        ("The real compiler", ("measure_step", "fits", "Measurement", "TARGETS")),
        ("Host offload", ("OffloadConfig",)),
        ("Measured operation costs", ("measure_op_times", "OpTimes")),
        ("Errors", ("AutorematError", "InfeasibleBudgetError", "SolverTimeoutError",
                    "BudgetNotVerifiedError", "CompilerUnavailableError", "UnsupportedProgramError",
                    "PlanMismatchError", "PolicyFileError", "PolicyMismatchError")),
    ],
    "autoremat.zoo": [
        ("Models", ("get", "ZOO", "ZooModel")),
        ("MaxText presets", ("MAXTEXT_PRESETS", "preset_policy", "presets_for")),
    ],
    "autoremat_solvers": [
        ("Solvers", ("SOLVERS", "BASELINES", "SolverResult", "Status")),
        ("Graphs", ("ComputeGraph", "chain_training_graph", "random_layered_training_graph",
                    "load_graph_json")),
        ("Schedules and the simulator", ("Schedule", "SimResult", "simulate")),
    ],
    "autoremat_ilp": [
        ("The problem", ("Problem", "Solution", "Status")),
        ("Solving", ("solve", "solve_min_peak")),
        ("The memory model", ("stage_bytes", "evaluate", "host_bytes", "violations", "prune")),
        ("The integer program", ("build_model", "Model")),
        ("The MILP front end", ("Milp", "MilpResult", "solve_milp", "Progress")),
    ],
}
PAGES = {
    "reference/autoremat.md": (
        "autoremat", "autoremat/__init__.py", "autoremat",
        "Every name in `autoremat.__all__` (this page is generated from it). "
        "Framework helpers are in [Integrations](integrations.md), the bundled models in "
        "[Zoo](zoo.md)."),
    "reference/zoo.md": (
        "autoremat.zoo", "autoremat/zoo/__init__.py", "autoremat.zoo",
        "The bundled models (every name in `autoremat.zoo.__all__`)."),
    "reference/solvers.md": (
        "autoremat_solvers", "solvers/autoremat_solvers/__init__.py", "autoremat_solvers",
        "The framework-free solvers over plain graphs (every name in "
        "`autoremat_solvers.__all__`); see [Solvers on one interface]"
        "(../research/solvers.md)."),
    "reference/ilp.md": (
        "autoremat_ilp", "solvers/autoremat_ilp/__init__.py", "autoremat_ilp",
        "The integer program autoremat plans with (every name in `autoremat_ilp.__all__`); "
        "see [its design](../solvers/autoremat_ilp/README.md)."),
}


def public_names(source: str | pathlib.Path) -> list[str]:
    """The names in a module's ``__all__`` (a literal list or tuple), read from its source."""
    tree = ast.parse((ROOT / source).read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return list(ast.literal_eval(node.value))
    raise ValueError(f"{source} has no literal __all__")


def reference_page(module: str, source: str, title: str, intro: str) -> str:
    """The markdown of a reference page: one mkdocstrings block per public name."""
    names = public_names(source)
    groups = [(h, [n for n in members if n in names]) for h, members in GROUPS[module]]
    grouped = {n for _, members in groups for n in members}
    groups.append(("More", [n for n in names if n not in grouped]))
    lines = [f"# `{title}`", "", intro, ""]
    for heading, members in groups:
        if not members:
            continue
        lines += [f"## {heading}", ""]
        for name in members:
            lines += [f"::: {module}.{name}", "    options:", "      heading_level: 3", ""]
    return "\n".join(lines)


def _external_files(config) -> list[File]:
    found = []
    for folder, patterns in EXTERNAL.items():
        seen = set()
        for pattern in patterns:
            for path in sorted((ROOT / folder).glob(pattern)):
                if path.is_file() and path not in seen:
                    seen.add(path)
                    found.append(File(path.relative_to(ROOT).as_posix(), src_dir=str(ROOT),
                                      dest_dir=config.site_dir,
                                      use_directory_urls=config.use_directory_urls))
    return found


def _nav_pages(nav) -> set[str]:
    """Every page path named in a ``nav`` configuration."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, dict):
        return set().union(*(_nav_pages(v) for v in nav.values()))
    if isinstance(nav, list):
        return set().union(set(), *(_nav_pages(v) for v in nav))
    return set()


def on_config(config):
    """Adds result pages that ``nav`` does not name to its Results section."""
    if not config.nav:
        return config
    named = _nav_pages(config.nav)
    missing = [f.src_uri for f in _external_files(config)
               if f.src_uri.endswith(".md") and "/results/" in f.src_uri
               and f.src_uri not in named]
    if missing:
        section = next((e for e in config.nav
                        if isinstance(e, dict) and RESULTS_SECTION in e), None)
        if section is None:
            section = {RESULTS_SECTION: []}
            config.nav.append(section)
        section[RESULTS_SECTION].extend(missing)
    return config


@event_priority(100)  # before mkdocs-jupyter's on_files, so that it sees the notebooks
def on_files(files: Files, config) -> Files:
    for file in _external_files(config):
        files.append(file)
    for page, (module, source, title, intro) in PAGES.items():
        files.append(File.generated(config, page,
                                    content=reference_page(module, source, title, intro)))
    return files


_HELP = re.compile(r"<!-- autoremat-help:([\w\s-]*)-->")


def command_help(commands: list[str]) -> str:
    """Markdown: the ``--help`` of ``autoremat`` and of each of ``commands``."""
    from click.testing import CliRunner

    from autoremat._cli import main

    parts = []
    for command in ["", *commands]:
        args = [command, "--help"] if command else ["--help"]
        result = CliRunner().invoke(main, args, prog_name="autoremat", terminal_width=80)
        if result.exit_code != 0:
            raise RuntimeError(f"autoremat {' '.join(args)} failed: {result.output}")
        title = f"autoremat {command} --help" if command else "autoremat --help"
        parts.append(f"### `{title}`\n\n```text\n{result.output.rstrip()}\n```\n")
    return "\n".join(parts)


def _beside(src_uri: str) -> str:
    """Markdown for the plot and JSON next to a result page, if any."""
    path = ROOT / src_uri
    if not any(src_uri.startswith(f + "/") for f in EXTERNAL if "results" in f):
        return ""
    stems = [path.stem] if path.stem not in ("results", "README") else ["overhead", "results"]
    extra = []
    for stem in stems:
        if (path.parent / f"{stem}.png").is_file():
            extra.append(f"![{stem}]({stem}.png)")
        if (path.parent / f"{stem}.json").is_file():
            extra.append(f"The data: [`{stem}.json`]({stem}.json).")
    return "\n\n" + "\n\n".join(extra) + "\n" if extra else ""


def on_page_markdown(markdown: str, page, config, files) -> str:
    markdown = _HELP.sub(lambda m: command_help(m.group(1).split()), markdown)
    return markdown + _beside(page.file.src_uri)
