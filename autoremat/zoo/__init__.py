"""Bundled models for planning and benchmarks, each with a small variant for tests.

Full-size models use bfloat16 parameters and activations; their ``-tiny`` variants are
float32 and run in seconds. Every model is a :class:`ZooModel` in :data:`ZOO`:

>>> from autoremat import zoo
>>> model = zoo.get("llama-tiny")
>>> params, batch = model.init(jax.random.key(0))                          # doctest: +SKIP
>>> loss = model.make_loss(zoo.preset_policy("save_qkv_proj", model))      # doctest: +SKIP

The modules (:mod:`~autoremat.zoo.gpt2`, :mod:`~autoremat.zoo.llama`,
:mod:`~autoremat.zoo.mlp`, :mod:`~autoremat.zoo.resnet`, :mod:`~autoremat.zoo.unet`) hold
the configurations and layers.
"""

from autoremat.zoo._presets import MAXTEXT_PRESETS as MAXTEXT_PRESETS
from autoremat.zoo._presets import preset_policy as preset_policy
from autoremat.zoo._presets import presets_for as presets_for
from autoremat.zoo._registry import ZOO as ZOO
from autoremat.zoo._registry import ZooModel as ZooModel
from autoremat.zoo._registry import get as get

__all__ = [
    "MAXTEXT_PRESETS",
    "ZOO",
    "ZooModel",
    "get",
    "preset_policy",
    "presets_for",
]
