"""A plan stated per user checkpoint name, as MaxText's ``remat_policy: custom`` configuration.

MaxText (https://github.com/AI-Hypercomputer/maxtext) names the tensors of its decoder
layers with :func:`jax.ad_checkpoint.checkpoint_name` (``decoder_layer_input``,
``query_proj``, ``key_proj``, ``value_proj``, ``qkv_proj``, ``context``, ``out_proj``,
``mlpwi``, ``mlpwi_0``, ``mlpwi_1``, ``mlpwo``, ...). With ``remat_policy: custom`` each
name is a top-level key of its YAML configuration set to ``device`` (kept in device
memory), ``offload`` (kept in host memory) or ``remat`` (recomputed):
``src/MaxText/configs/base.yml`` at commit 09d2025bc52059162c84f05846b15121b2b48eb0.
``Decoder.get_remat_policy`` (``src/MaxText/layers/decoders.py`` at commit
6c01933c4259c73bbfc13cbe543103bbcc045ba5) turns them into
``jax.checkpoint_policies.save_and_offload_only_these_names(names_which_can_be_saved=...,
names_which_can_be_offloaded=..., offload_src="device", offload_dst="pinned_host")``
around every decoder layer: one choice per name, the same in every layer.

A plan decides per traced value. The tensor a name carries is recomputed by the plan when
its backward pass computes it again: the ``name`` equation's output and, naming being
free, what it names (a plan that keeps the unnamed tensor and renames it keeps it). It is
offloaded when the plan offloads it, and kept on the device otherwise (saved, or not read
by the backward pass at all). A name is ``"device"``, ``"offload"`` or ``"remat"`` when the
plan treats all its tensors so, and ``"mixed"`` otherwise: MaxText cannot express a choice
that differs between layers, so the configuration file writes those as ``remat`` and says
so.
"""

from __future__ import annotations

import collections
import json
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import jax

from autoremat._budget import format_bytes

if TYPE_CHECKING:
    from autoremat._graph import Value
    from autoremat._plan import Plan

_CHOICES = ("device", "offload", "remat")

# Plain YAML scalars that YAML 1.1 readers (PyYAML, which MaxText uses) take for
# booleans or null: quoted when a name is one of them.
_YAML_WORDS = frozenset({"y", "yes", "n", "no", "true", "false", "on", "off", "null"})


def name_counts(plan: Plan) -> dict[str, collections.Counter[str]]:
    """For each user checkpoint name, in program order: how many of its tensors the plan
    keeps on the device, offloads and recomputes (a tensor in a scanned layer counts once
    per iteration)."""
    by_id = {v.id: v for v in plan.graph.values}
    lengths = [r.length for r in plan.graph.regions]
    counts: dict[str, collections.Counter[str]] = {}
    for v in plan.graph.values:
        if v.user_name is not None:
            counts.setdefault(v.user_name, collections.Counter())[
                _choice(v, by_id, plan)] += lengths[v.region]
    return counts


def _choice(value: Value, by_id: dict[int, Value], plan: Plan) -> str:
    """What the plan does with the tensor ``value`` (a ``name`` equation's output) names."""
    while value.id in plan.recomputed and value.primitive == "name" and value.inputs:
        value = by_id[value.inputs[0]]
    if value.id in plan.recomputed and value.primitive != "name":
        return "remat"
    return "offload" if value.id in plan.offloaded else "device"


def config(plan: Plan) -> dict[str, str]:
    """Each user checkpoint name's choice: ``"device"``, ``"offload"``, ``"remat"`` or
    ``"mixed"`` (see the module docstring)."""
    return {name: _single(c) for name, c in name_counts(plan).items()}


def _single(counts: collections.Counter[str]) -> str:
    return next(iter(counts)) if len(counts) == 1 else "mixed"


def name_policy(plan: Plan) -> Callable:
    """The ``jax.checkpoint`` policy over the user's names that :func:`config` states: its
    ``device`` names saved (``offload`` names offloaded to host memory), the rest
    recomputed."""
    choices = config(plan)
    device = [n for n, c in choices.items() if c == "device"]
    offload = [n for n, c in choices.items() if c == "offload"]
    if not offload:
        return jax.checkpoint_policies.save_only_these_names(*device)
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=device, names_which_can_be_offloaded=offload,
        offload_src="device", offload_dst="pinned_host")


def to_yaml(plan: Plan) -> str:
    """The MaxText configuration text: ``remat_policy: custom`` and a key per user name.

    Raises:
      ValueError: no tensor of the plan's function carries a user name.
    """
    counts = name_counts(plan)
    if not counts:
        raise ValueError("no tensor of the planned function carries a checkpoint_name, so "
                         "there is no MaxText configuration to state; name tensors with "
                         "jax.ad_checkpoint.checkpoint_name")
    lines = [
        "# MaxText remat configuration of an autoremat plan:",
        (f"# budget {format_bytes(plan.budget_bytes)}, predicted peak "
         f"{format_bytes(plan.peak_bytes)}, recompute overhead {plan.overhead:.1%}."),
        "# Each name is kept in device memory ('device'), offloaded to host memory ('offload')",
        "# or recomputed ('remat') in every decoder layer; other names keep their setting.",
        "remat_policy: custom",
    ]
    for name, c in counts.items():
        choice = _single(c)
        if choice == "mixed":
            kept = ", ".join(f"{k} {c[k]}" for k in _CHOICES if c[k])
            lines.append(f"{_yaml_key(name)}: remat  # mixed ({kept} of its {c.total()} "
                         "tensors): MaxText sets one choice for every layer")
        else:
            lines.append(f"{_yaml_key(name)}: {choice}")
    unnamed = _unnamed_kept(plan)
    if unnamed:
        lines.append(f"# The plan also keeps {len(unnamed)} tensors that carry no name "
                     f"({format_bytes(sum(v.nbytes * v.multiplicity for v in unnamed))}, "
                     "region boundaries aside);")
        lines.append("# a policy over names recomputes them, or keeps a named tensor they "
                     "are computed from.")
    return "\n".join(lines) + "\n"


def _yaml_key(name: str) -> str:
    """``name`` plain when YAML reads it as that string, else quoted (a JSON string is a
    YAML double-quoted scalar)."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", name) and name.lower() not in _YAML_WORDS:
        return name
    return json.dumps(name)


def _unnamed_kept(plan: Plan) -> list[Value]:
    """Saved or offloaded values without a user name, other than region boundaries (values
    another region reads, and a scanned layer's carried inputs)."""
    kept = plan.saved | plan.offloaded
    return [v for v in plan.graph.values if v.id in kept and v.user_name is None
            and not v.needed_across and v.primitive != "carry_in"]


def write(plan: Plan, path: str | os.PathLike) -> None:
    """Writes :func:`to_yaml` to ``path``."""
    text = to_yaml(plan)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
