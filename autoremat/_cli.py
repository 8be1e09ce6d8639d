"""The ``autoremat`` command line."""

from __future__ import annotations

import dataclasses
import time

import click

from autoremat._budget import parse_budget


def _number_or_text(text: str) -> int | float | str:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


class _BudgetType(click.ParamType):
    name = "budget"

    def convert(self, value, param, ctx):  # noqa: ANN001, ANN201 (click's signature)
        if not isinstance(value, str):
            return value
        try:
            return parse_budget(_number_or_text(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


@click.group()
def main() -> None:
    """Automatic rematerialization for JAX under a memory budget."""


@main.command()
@click.option("--budget", type=_BudgetType(), default="3GiB", show_default=True,
              help="Peak bytes of the training step: '3GiB', 3000000000, or 0.3 (fraction "
                   "of the no-remat activation memory).")
@click.option("--scan/--unrolled", default=False, show_default=True,
              help="Scan over layers instead of unrolling them.")
@click.option("--time-limit", type=float, default=60.0, show_default=True,
              help="Solver time limit in seconds.")
@click.option("--rows", type=int, default=25, show_default=True, help="Decision rows to print.")
def demo(budget: int | float, scan: bool, time_limit: float, rows: int) -> None:
    """Plan remat for the bundled GPT-2-small-style model and print the report.

    The model is traced from shapes only (12 layers, d 768, 12 heads, seq 1024, batch 8,
    bf16): nothing is allocated or run.
    """
    import autoremat
    from autoremat.zoo import gpt2

    config = dataclasses.replace(gpt2.GPT2_SMALL, scan_layers=scan)
    click.echo(f"GPT-2-small-style, {'scanned' if scan else 'unrolled'} layers: {config}")
    start = time.perf_counter()
    try:
        plan = autoremat.plan(gpt2.make_loss(config), gpt2.param_shapes(config),
                              gpt2.batch_shapes(config), budget=budget, time_limit_s=time_limit)
    except autoremat.InfeasibleBudgetError as e:
        raise click.ClickException(str(e)) from None
    click.echo(plan.report(max_rows=rows))
    click.echo(f"\nplanned in {time.perf_counter() - start:.1f} s (trace, solve and checks)")
