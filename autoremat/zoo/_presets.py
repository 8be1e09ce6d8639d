"""MaxText's name-based remat policies, for the zoo's models.

Reproduced from MaxText's ``Decoder.minimal_policy`` and ``Decoder.get_remat_policy``
(``src/MaxText/layers/decoders.py`` in https://github.com/AI-Hypercomputer/maxtext,
formerly google/maxtext, at commit 02bc28ce534d0423f66ac208008ffb53a7ff32bf). Each
policy is ``jax.checkpoint_policies.save_only_these_names`` over the names MaxText's
layers give their projections; MaxText's ``full`` is a checkpoint with no policy, which
saves nothing: ``nothing_saveable`` here. Left out: the host-offloading policies
(``qkv_proj_offloaded``, ``minimal_offloaded``, ``custom``), which autoremat does not
model, and the quantization variants. Older MaxText versions mapped ``minimal`` to
``checkpoint_dots_with_no_batch_dims`` instead of names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import jax

if TYPE_CHECKING:
    from autoremat.zoo._registry import ZooModel

_QKV = ("query_proj", "value_proj", "key_proj", "qkv_proj")
_MLP = ("mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo")

# Preset name to the checkpoint names it saves.
MAXTEXT_PRESETS: dict[str, tuple[str, ...]] = {
    "minimal_with_context": (*_QKV, "out_proj", *_MLP, "context"),
    "minimal": (*_QKV, "out_proj", *_MLP),
    "save_dot_with_context_except_mlp": (*_QKV, "context", "out_proj"),
    "save_dot_except_mlpwi": (*_QKV, "out_proj", "mlpwo"),
    "save_dot_except_mlp": (*_QKV, "out_proj"),
    "save_qkv_proj": _QKV,
    "save_out_proj": ("out_proj",),
    "full": (),
}


def presets_for(model: ZooModel) -> tuple[str, ...]:
    """The MaxText presets that apply to ``model``.

    Args:
      model: a zoo model.

    Returns:
      ``full``, and the presets that save at least one of the names its tensors carry
      (the others would act as ``full``), in :data:`MAXTEXT_PRESETS` order.

    Example:
      >>> from autoremat import zoo
      >>> zoo.presets_for(zoo.get("mlp-tiny"))
      ('minimal_with_context', 'minimal', 'save_dot_except_mlpwi', 'full')
    """
    return tuple(p for p, saved in MAXTEXT_PRESETS.items()
                 if not saved or set(saved) & set(model.names))


def preset_policy(preset: str, model: ZooModel) -> Callable:
    """The ``jax.checkpoint`` policy of MaxText's ``remat_policy=preset``, for ``model``.

    Args:
      preset: a key of :data:`MAXTEXT_PRESETS`.
      model: the zoo model it is meant for (pass it to ``model.make_loss``).

    Returns:
      The policy, for ``model.make_loss(layer_policy=...)``.

    Raises:
      KeyError: ``preset`` is unknown.
      ValueError: the preset saves none of ``model.names`` (and is not ``full``).

    Example:
      >>> from autoremat import zoo
      >>> m = zoo.get("mlp-tiny")
      >>> loss = m.make_loss(zoo.preset_policy("minimal", m))
    """
    if preset not in MAXTEXT_PRESETS:
        raise KeyError(f"unknown MaxText preset {preset!r}; known: {', '.join(MAXTEXT_PRESETS)}")
    if preset not in presets_for(model):
        raise ValueError(f"preset {preset!r} saves none of {model.name}'s names "
                         f"{model.names}; applicable: {', '.join(presets_for(model))}")
    saved = MAXTEXT_PRESETS[preset]
    if not saved:
        return jax.checkpoint_policies.nothing_saveable
    return jax.checkpoint_policies.save_only_these_names(*saved)
