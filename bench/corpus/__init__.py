"""A corpus of third-party models, each written with its own library and checkpointed with
that library's own remat: Flax Linen, Flax NNX, Equinox, Keras 3 (JAX backend), penzai and
Haiku.

Every model is an :class:`autoremat.zoo.ZooModel` in :data:`CORPUS`; the ``-tiny`` variants
are float32 and small, for tests. ``make_loss(layer_policy)`` wraps every block in the
library's remat (``nn.remat``, ``nnx.remat``, ``eqx.filter_checkpoint``, penzai's
``Checkpointed``, Keras's ``RematScope``, ``hk.remat``) under that ``jax.checkpoint`` policy;
``make_loss(jax.checkpoint_policies.nothing_saveable)`` is the hand baseline.

>>> from bench import corpus
>>> model = corpus.get("linen-cnn-tiny")
>>> params, batch = model.init(jax.random.key(0))                          # doctest: +SKIP
>>> model.make_loss()(params, batch)                                        # doctest: +SKIP

A family whose library is not installed is left out; :data:`MISSING` names it.
"""

from __future__ import annotations

import importlib

from autoremat.zoo import ZooModel

#: The model files, and the top-level library each needs.
FAMILIES = {
    "flax_linen_cnn": "flax",
    "flax_linen_encoder": "flax",
    "flax_nnx_transformer": "flax",
    "equinox_mlp": "equinox",
    "equinox_cnn": "equinox",
    "keras_transformer": "keras",
    "keras_cnn": "keras",
    "penzai_llama": "penzai",
    "haiku_resnet": "haiku",
}

CORPUS: dict[str, ZooModel] = {}
#: Families left out, by file, with the import error.
MISSING: dict[str, str] = {}

for _family, _library in FAMILIES.items():
    try:
        _module = importlib.import_module(f"bench.corpus.{_family}")
    except ModuleNotFoundError as e:
        if e.name != _library:
            raise
        MISSING[_family] = str(e)
        continue
    CORPUS.update((m.name, m) for m in _module.models())


def get(name: str) -> ZooModel:
    """The corpus model called ``name``.

    Raises:
      KeyError: no such model; the message lists the known names.
    """
    try:
        return CORPUS[name]
    except KeyError:
        missing = f" (not installed: {', '.join(MISSING)})" if MISSING else ""
        raise KeyError(f"no corpus model {name!r}; known: {', '.join(CORPUS)}{missing}") from None
