"""The ``autoremat`` command line: ``plan``, ``report``, ``bench`` and ``demo``."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import json
import math
import os
import pathlib
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import click
import rich.console
import rich.live
import rich.spinner
import rich.text
from autoremat_ilp import Progress

import autoremat
from autoremat import _benchmark, _plots, zoo
from autoremat._budget import parse_budget
from autoremat._errors import AutorematError, CompilerUnavailableError, PolicyFileError
from autoremat._planner import PlanOptions, plan_with
from autoremat._planner._options import AUTO, LAYOUT_CHOICES, NODE_LIMIT
from autoremat._policy_file import PolicyFile
from autoremat._report import format_report

_BUDGET_HELP = ("Peak bytes of the training step: '8GiB', 8000000000, or 0.4 (fraction of "
                "the no-remat activation memory).")
_LAYOUT_HELP = ("How planning counts a value's bytes: 'dense' (its data), 'tpu' (its "
                "tiled TPU layout, feature dimension minor, padded to 128), 'tiled' (the "
                "TPU tiles of its least padded layout), or 'auto': 'tiled' where the "
                "closed loop compiles for a TPU, else 'dense'.")
_PROGRESS_HELP = ("Show the solver's best plan, bound and gap while it runs: on a terminal by "
                  "default, as lines of text elsewhere with --progress.")


def _number_or_text(text: str) -> int | float | str:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


class _BudgetType(click.ParamType):
    name = "budget"

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return parse_budget(_number_or_text(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


class _ObjectType(click.ParamType):
    """``MODULE:NAME``: a callable imported from a module, the working directory first."""

    name = "module:name"

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        module_name, _, attr = value.partition(":")
        if not module_name or not attr:
            self.fail(f"{value!r} is not MODULE:NAME (for example 'train:loss').", param, ctx)
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            obj = importlib.import_module(module_name)
        except ImportError as e:
            self.fail(f"cannot import {module_name!r}: {e}.", param, ctx)
        for part in attr.split("."):
            if not hasattr(obj, part):
                self.fail(f"module {module_name!r} has no attribute {attr!r}.", param, ctx)
            obj = getattr(obj, part)
        if not callable(obj):
            self.fail(f"{value} is not callable ({type(obj).__name__}).", param, ctx)
        return obj


class _PolicyFileType(click.ParamType):
    """A policy file's path, read and validated."""

    name = "file"

    def convert(self, value, param, ctx):
        if isinstance(value, PolicyFile):
            return value
        try:
            return PolicyFile.read(value)
        except OSError as e:
            self.fail(f"cannot read {value!r}: {e.strerror}.", param, ctx)
        except PolicyFileError as e:
            self.fail(str(e), param, ctx)


def _takes_no_arguments(fn: Callable) -> bool:
    try:
        inspect.signature(fn).bind()
    except TypeError:
        return False
    except ValueError:  # no signature to inspect (some builtins): let the call decide
        pass
    return True


def _not_loss_and_args(made: object) -> str | None:
    """What is wrong with ``made`` as a ``(loss, args)`` pair, or ``None``."""
    if not isinstance(made, tuple):
        return f"it returned a {type(made).__name__}"
    if len(made) != 2:
        return f"it returned a tuple of {len(made)} items"
    if not callable(made[0]):
        return f"its first item is a {type(made[0]).__name__}, not a function"
    if not isinstance(made[1], tuple):
        return f"its second item is a {type(made[1]).__name__}, not a tuple"
    return None


# Seconds between two lines of progress when it is written to a file, unless the best plan
# improved.
_PROGRESS_LINE_S = 5.0


@contextlib.contextmanager
def _progress(label: str, stream: TextIO | None = None, show: bool | None = None
              ) -> Iterator[Progress | None]:
    """Shows ``label`` while the block runs and yields where to send the solver's progress
    (``autoremat.plan``'s ``progress``), or ``None`` when it is not shown.

    On a terminal: a spinner, the elapsed time and the solver's best plan, bound and gap,
    erased at the end. Elsewhere: the label once, then, when ``show`` is true, a line for
    each better plan and every few seconds. ``show=False`` prints the label once whatever
    the stream. Tracing runs in Python and the solver releases the GIL, so the spinner
    keeps turning through both.
    """
    out: TextIO = sys.stderr if stream is None else stream
    if show is False or not out.isatty():
        click.echo(f"{label} ...", file=out)
        yield _progress_lines(out) if show else None
        return
    spinner = rich.spinner.Spinner("dots")
    start = time.perf_counter()
    figures = ""

    def line() -> rich.text.Text:  # one line, cut at the terminal's width
        now = time.perf_counter()
        frame = spinner.render(now)
        assert isinstance(frame, rich.text.Text)  # a spinner without text renders as Text
        return rich.text.Text.assemble(frame, f" {label} {now - start:.0f} s",
                                       f"  {figures}" if figures else "", no_wrap=True,
                                       overflow="ellipsis")

    def report(elapsed: float, best: float, bound: float) -> None:
        nonlocal figures
        figures = _figures(best, bound)

    console = rich.console.Console(file=out, force_terminal=True)
    with rich.live.Live(get_renderable=line, console=console, transient=True,
                        redirect_stdout=False):
        yield report


def _progress_lines(stream: TextIO) -> Progress:
    """Progress as lines of text: at each better plan, else at most every few seconds."""
    last_best, last_time = math.inf, -math.inf

    def show(elapsed: float, best: float, bound: float) -> None:
        nonlocal last_best, last_time
        if best < last_best or elapsed - last_time >= _PROGRESS_LINE_S:
            click.echo(f"  {elapsed:.0f} s: {_figures(best, bound)}", file=stream)
            last_best, last_time = best, elapsed

    return show


def _figures(best: float, bound: float) -> str:
    """The solver's best plan, bound and gap, in recomputed FLOPs."""
    if not math.isfinite(bound):
        return f"best {_flops(best)}, no bound yet"
    gap = (best - bound) / best if best > 0 else 0.0
    return f"best {_flops(best)}, bound {_flops(bound)}, gap {gap:.2%}"


def _flops(n: float) -> str:
    prefixes = ("", "k", "M", "G", "T", "P", "E")
    k = min(len(prefixes) - 1, max(0, int(math.log10(max(abs(n), 1))) // 3))
    return f"{n / 1000 ** k:.4g} {prefixes[k]}FLOP"


def _plan_and_report(fn: Callable, args: tuple, budget: float, options: PlanOptions,
                     rows: int, show_progress: bool | None) -> autoremat.Plan:
    """Plans with a progress display, prints the report, and returns the plan."""
    start = time.perf_counter()
    with _progress(f"planning (time limit {options.time_limit_s:g} s)",
                   show=show_progress) as progress:
        try:
            plan = plan_with(fn, args, {}, budget, dataclasses.replace(options, progress=progress))
        except AutorematError as e:
            raise click.ClickException(str(e)) from None
    click.echo(plan.report(max_rows=rows))
    click.echo(f"\nplanned in {time.perf_counter() - start:.1f} s (trace, solve and checks)")
    return plan


# The planning options every command takes, gathered into one PlanOptions.
_PLAN_OPTIONS = (
    click.option("--time-limit", "time_limit_s", type=click.FloatRange(min=0, min_open=True),
                 default=60.0, show_default=True,
                 help="Planning time limit in seconds per plan (per closed-loop round; "
                      "tracing included)."),
    click.option("--node-limit", type=click.IntRange(min=1), default=NODE_LIMIT,
                 show_default=True,
                 help="Branch-and-bound nodes per solve: a search it stops ends at the same "
                      "plan on any machine, unlike the time limit."),
    click.option("--refine-rounds", type=click.IntRange(min=0), default=0, show_default=True,
                 help="With the closed loop, compiles it may spend on cheaper plans once "
                      "one fits."),
    click.option("--layout", type=click.Choice(LAYOUT_CHOICES), default=AUTO,
                 show_default=True,
                 help=_LAYOUT_HELP),
    click.option("--nested-scans", is_flag=True,
                 help="Also consider scans nested in groups of about sqrt(length) iterations "
                      "(lower floors, one more forward pass of the loop)."),
    click.option("--nested-segments", is_flag=True,
                 help="Also consider consecutive segments nested in groups of about "
                      "sqrt(their number) (lower floors, one more forward pass of them)."),
)


def _plan_options(command: Callable) -> Callable:
    """Adds :data:`_PLAN_OPTIONS` to ``command``, which gets them as one ``options``."""

    @functools.wraps(command)
    def with_options(*args, time_limit_s, node_limit, refine_rounds, layout, nested_scans,
                     nested_segments, **kwargs):
        options = PlanOptions(time_limit_s=time_limit_s, node_limit=node_limit,
                              refine_rounds=refine_rounds,
                              layout=layout, nested_scans=nested_scans,
                              nested_segments=nested_segments)
        return command(*args, options=options, **kwargs)

    for option in reversed(_PLAN_OPTIONS):
        with_options = option(with_options)
    return with_options


@click.group()
def main() -> None:
    """Automatic rematerialization for JAX under a memory budget."""


@main.command("plan")
@click.argument("function", type=_ObjectType(), required=False)
@click.option("--args", "make_args", type=_ObjectType(),
              help="MODULE:NAME of a function of no arguments returning the tuple of "
                   "FUNCTION's example arguments.")
@click.option("--model", type=click.Choice(list(zoo.ZOO)), metavar="NAME",
              help="Plan a bundled model (autoremat.zoo) instead of FUNCTION: "
                   f"{', '.join(zoo.ZOO)}.")
@click.option("--budget", type=_BudgetType(), required=True, help=_BUDGET_HELP)
@click.option("--out", type=click.Path(dir_okay=False, writable=True, path_type=pathlib.Path),
              required=True, help="The policy file to write (JSON).")
@click.option("--maxtext", type=click.Path(dir_okay=False, writable=True, path_type=pathlib.Path),
              help="Also write the plan as MaxText's remat configuration (YAML, "
                   "remat_policy: custom): a choice per checkpoint_name of the function.")
@click.option("--rows", type=click.IntRange(min=0), default=25, show_default=True,
              help="Decision rows to print.")
@click.option("--progress/--no-progress", "show_progress", default=None, help=_PROGRESS_HELP)
@click.option("--verify", type=click.Choice(["auto", "none", *sorted(autoremat.TARGETS)]),
              metavar="TARGET", default="auto", show_default=True,
              help="Closed loop: compile the planned step for TARGET "
                   f"({', '.join(sorted(autoremat.TARGETS))}) and re-plan until the "
                   "compiler's peak fits the budget; 'auto': this machine's GPU or TPU "
                   "(none on a CPU); 'none': the model's plan, not compiled.")
@_plan_options
def plan_command(function: Callable | None, make_args: Callable | None, model: str | None,
                 budget: float, out: pathlib.Path, maxtext: pathlib.Path | None,
                 rows: int, show_progress: bool | None, verify: str | None,
                 options: PlanOptions) -> None:
    """Plan remat for a function under a budget, write the policy file, print the report.

    FUNCTION is MODULE:NAME, imported with the working directory on the module path. With
    --args it is the function to plan (a loss); without, a function of no arguments that
    returns (loss, args), args the tuple of the loss's positional arguments. Arguments are
    pytrees of arrays or jax.ShapeDtypeStruct: only shapes and dtypes are used.

    \b
    autoremat plan train:loss --args train:example_args --budget 8GiB --out policy.json
    autoremat plan train:make_loss_and_args --budget 0.4 --out policy.json
    autoremat plan --model gpt2-small --budget 3GiB --out policy.json --maxtext remat.yml
    """
    if (function is None) == (model is None):
        raise click.UsageError("give FUNCTION (MODULE:NAME) or --model NAME, one of the two.")
    if make_args is not None and model is not None:
        raise click.UsageError("--args goes with FUNCTION; a --model brings its own arguments.")
    for path, option in ((out, "'--out'"), (maxtext, "'--maxtext'")):
        if path is not None and not path.parent.is_dir():
            raise click.BadParameter(f"directory '{path.parent}' does not exist.",
                                     param_hint=option)
    if model is not None:
        entry = zoo.get(model)
        click.echo(f"{entry.name}: {entry.description}")
        fn, args = entry.make_loss(), (entry.param_shapes(), entry.batch_shapes())
    elif make_args is not None:
        assert function is not None  # --args goes with FUNCTION (checked above)
        if not _takes_no_arguments(make_args):
            raise click.BadParameter("it must be callable with no arguments.",
                                     param_hint="'--args'")
        fn, args = function, make_args()
        if not isinstance(args, tuple):
            raise click.BadParameter(f"it returned a {type(args).__name__}; it must return the "
                                     "tuple of FUNCTION's positional arguments.",
                                     param_hint="'--args'")
    else:
        assert function is not None  # FUNCTION or --model (checked above)
        if not _takes_no_arguments(function):
            raise click.BadParameter(
                "it takes arguments: give its example arguments with --args MODULE:NAME, or "
                "name a function of no arguments that returns (loss, args).",
                param_hint="'[FUNCTION]'")
        made = function()
        problem = _not_loss_and_args(made)
        if problem:
            raise click.BadParameter(f"without --args it must return (loss, args), args a "
                                     f"tuple; {problem}.", param_hint="'[FUNCTION]'")
        fn, args = made
    target = None if verify == "none" else verify
    plan = _plan_and_report(fn, args, budget, dataclasses.replace(options, verify=target),
                            rows, show_progress)
    try:
        plan.save(out)
    except OSError as e:
        raise click.ClickException(f"cannot write the policy file '{out}': {e.strerror}.") from None
    click.echo(f"wrote {out}")
    if maxtext is not None:
        _write_maxtext(plan, maxtext)


def _write_maxtext(plan: autoremat.Plan, path: pathlib.Path) -> None:
    """Writes the MaxText configuration and says which names it could not state exactly."""
    try:
        plan.save_maxtext(path)
    except ValueError as e:
        raise click.ClickException(f"no MaxText configuration written: {e}.") from None
    except OSError as e:
        raise click.ClickException(f"cannot write '{path}': {e.strerror}.") from None
    mixed = [name for name, choice in plan.maxtext_config().items() if choice == "mixed"]
    note = (f"; {', '.join(mixed)}: treated differently in different layers, which MaxText "
            "cannot express, written as remat" if mixed else "")
    click.echo(f"wrote {path} (MaxText remat_policy: custom{note})")


@main.command("report")
@click.argument("file", type=_PolicyFileType())
@click.option("--rows", type=click.IntRange(min=0), default=25, show_default=True,
              help="Decision rows to print.")
def report_command(file: PolicyFile, rows: int) -> None:
    """Print the report of the plan in a policy FILE (from `autoremat plan` or Plan.save).

    The file alone is read: the function is not imported or traced.
    """
    click.echo(f"made by autoremat {file.autoremat_version} with jax {file.jax_version} for "
               f"program {file.fingerprint}; objective {file.objective}\n")
    click.echo(format_report(file, max_rows=rows))


@main.command()
@click.option("--budget", type=_BudgetType(), default="3GiB", show_default=True,
              help=_BUDGET_HELP)
@click.option("--scan/--unrolled", default=False, show_default=True,
              help="Scan over layers instead of unrolling them.")
@click.option("--rows", type=click.IntRange(min=0), default=25, show_default=True,
              help="Decision rows to print.")
@click.option("--progress/--no-progress", "show_progress", default=None, help=_PROGRESS_HELP)
@_plan_options
def demo(budget: float, scan: bool, rows: int, show_progress: bool | None,
         options: PlanOptions) -> None:
    """Plan remat for the bundled GPT-2-small-style model and print the report.

    The model is traced from shapes only (12 layers, d 768, 12 heads, seq 1024, batch 8,
    bf16): nothing is allocated or run.
    """
    from autoremat.zoo import gpt2

    config = dataclasses.replace(gpt2.GPT2_SMALL, scan_layers=scan)
    click.echo(f"GPT-2-small-style, {'scanned' if scan else 'unrolled'} layers: {config}")
    _plan_and_report(gpt2.make_loss(config), (gpt2.param_shapes(config),
                                              gpt2.batch_shapes(config)),
                     budget, options, rows, show_progress)


@main.command()
@click.option("--model", "model_names", multiple=True, metavar="NAME",
              help=f"Model to sweep (repeatable): a zoo model ({', '.join(zoo.ZOO)}), or with "
                   "--corpus a corpus model. Default: gpt2-small, or the whole corpus.")
@click.option("--corpus", "corpus_dir", is_flag=False, flag_value="bench/corpus", default=None,
              type=click.Path(file_okay=False, exists=True, path_type=pathlib.Path),
              help="Sweep the corpus of third-party models in this directory (a checkout's "
                   "bench/corpus, the default when given bare): every full-size model, or "
                   "those named by --model; writes CORPUS.md/json/png beside a folder of "
                   "sweeps.")
@click.option("--target", type=click.Choice([*autoremat.TARGETS, "none"]), default="tpu-v5e",
              show_default=True,
              help="Compiler to measure with; 'none' for the analytic model alone.")
@click.option("--budgets", "num_budgets", type=click.IntRange(min=2), default=8,
              show_default=True, help="Budgets from the floor to the no-checkpoint peak.")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Plan with the closed loop on the target's compiler.")
@click.option("--out", type=click.Path(file_okay=False, path_type=pathlib.Path),
              default=pathlib.Path("bench/results"), show_default=True,
              help="Directory for MODEL.md, MODEL.json and MODEL.png.")
@_plan_options
def bench(model_names: tuple[str, ...], corpus_dir: pathlib.Path | None, target: str,
          num_budgets: int, verify: bool, out: pathlib.Path, options: PlanOptions) -> None:
    """Sweep budgets for zoo or corpus models beside JAX's built-in policies; write a
    markdown table, JSON and a Pareto plot per model (and, for the corpus, a table and a
    plot of every model against its hand baseline).

    Every plan and built-in policy is compiled for TARGET (the TPU compiler runs ahead of
    time on a CPU machine: pip install "autoremat[tpu]"); a 12-layer model takes a
    minute or more per compile.
    """
    measured = None if target == "none" else target
    options = dataclasses.replace(options, verify=measured if verify else None)
    command = shlex.join(["autoremat", *sys.argv[1:]])
    models = _bench_models(model_names, corpus_dir)
    folder = out / "corpus" if corpus_dir is not None else out
    folder.mkdir(parents=True, exist_ok=True)
    policies = _CORPUS_POLICIES if corpus_dir is not None else tuple(_benchmark.BUILTIN_POLICIES)
    sweeps = []
    for model in models:
        click.echo(f"{model.name}: {model.description}")
        try:
            sweep = _benchmark.sweep(model, target=measured, num_budgets=num_budgets,
                                     options=options, policies=policies, log=click.echo)
        except CompilerUnavailableError as e:
            raise click.ClickException(f"{e} (or use --target none)") from None
        sweeps.append(sweep)
        text = (f"# {model.name} on {target}\n\n{model.description}\n\nMade with `{command}`; "
                f"versions: {json.dumps(sweep.versions)}. Floor plan "
                f"predicted at {sweep.floor_bytes / 2**20:.0f} MiB.\n\n"
                f"{_benchmark.table(sweep)}\n\n"
                f"{_benchmark.accuracy(sweep)}\n")
        (folder / f"{model.name}.md").write_text(text)
        (folder / f"{model.name}.json").write_text(json.dumps(_benchmark.to_json(sweep, command),
                                                            indent=2))
        _plots.pareto(sweep, folder / f"{model.name}.png")
        click.echo(text)
    if corpus_dir is not None:
        _write_corpus_summary(sweeps, out, target, command)


# Beside no remat and the hand baseline (nothing_saveable in the library's own remat), the
# built-in policy a user tries next.
_CORPUS_POLICIES = ("no checkpoint", "dots_saveable", "nothing_saveable")


def _bench_models(names: tuple[str, ...], corpus_dir: pathlib.Path | None
                  ) -> list[zoo.ZooModel]:
    """The models ``autoremat bench`` sweeps."""
    corpus = zoo.ZOO if corpus_dir is None else _load_corpus(corpus_dir)
    if corpus_dir is None:
        names = names or ("gpt2-small",)
    if not names:
        return [m for name, m in corpus.items() if not name.endswith("-tiny")]
    unknown = [n for n in names if n not in corpus]
    if unknown:
        where = "the zoo" if corpus_dir is None else "the corpus"
        raise click.BadParameter(f"not in {where}: {', '.join(unknown)}; known: "
                                 f"{', '.join(corpus)}", param_hint="--model")
    return [corpus[n] for n in names]


def _load_corpus(corpus_dir: pathlib.Path) -> dict[str, zoo.ZooModel]:
    """``CORPUS`` of the package in ``corpus_dir`` (a checkout's ``bench/corpus``, imported
    as ``bench.corpus`` with the checkout on the path)."""
    package = corpus_dir.resolve()
    if not (package / "__init__.py").exists():
        raise click.BadParameter(f"{corpus_dir} has no __init__.py", param_hint="--corpus")
    sys.path.insert(0, str(package.parent.parent))
    return importlib.import_module(f"{package.parent.name}.{package.name}").CORPUS


def _write_corpus_summary(sweeps: list[_benchmark.Sweep], out: pathlib.Path, target: str,
                          command: str) -> None:
    """``corpus.md``, ``corpus.json`` and ``corpus.png`` in ``out`` (also from sweeps read
    back with :func:`autoremat._benchmark.from_json`)."""
    table = _benchmark.hand_table(sweeps)
    lines = [f"# The corpus on {target}: autoremat against the user's hand remat\n",
             f"Made with `{command}`; versions: {json.dumps(sweeps[0].versions if sweeps else {})}."
             " Per model: the compiler's peak without remat, with every block in its library's "
             "own remat and `nothing_saveable` (hand), and of autoremat's verified floor; then "
             "over the swept budgets, how many plans the compiler fits, how many lie at or "
             "below the straight line from the hand baseline to no remat, the compiles per "
             "budget and the model's worst error. Each model's sweep is in `corpus/`.\n",
             table, "", _benchmark.corpus_totals(sweeps), ""]
    (out / "corpus.md").write_text("\n".join(lines))
    (out / "corpus.json").write_text(json.dumps(
        {"command": command,
         "models": {s.model: {"description": s.description,
                              "comparison": _asdict(_benchmark.compare_with_hand(s))}
                    for s in sweeps}}, indent=2))
    found = [(s.model, c) for s in sweeps if (c := _benchmark.compare_with_hand(s)) is not None]
    _plots.hand_bars(found, out / "corpus.png")
    click.echo(table)


def _asdict(x: Any) -> Any:
    return None if x is None else dataclasses.asdict(x)
