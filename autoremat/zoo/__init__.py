"""Bundled models for planning and benchmarks, each with a small variant for tests.

Full-size models use bfloat16 parameters and activations: ``gpt2-small`` and
``gpt2-small-scan`` (GPT-2 small, unrolled or scanned layers), ``llama`` (Llama-style,
scanned), ``llama-unrolled``, ``llama-24-unrolled`` (twice as deep, for planning-time
benchmarks), ``mlp`` (deep residual MLP), ``resnet`` (ResNet-50 layout) and ``unet``. Each
but ``llama-24-unrolled`` has a ``-tiny`` float32 variant that runs in seconds. Every model
is a :class:`ZooModel` in :data:`ZOO`; :data:`MAXTEXT_PRESETS` are MaxText's name-based
remat policies, for the models whose tensors carry its names:

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
