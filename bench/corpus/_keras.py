"""Keras 3 on its JAX backend, for the Keras corpus files: the import, block-level remat
with a ``jax.checkpoint`` policy, and the functional form of a Keras model.

Import Keras from here: ``KERAS_BACKEND`` must say ``jax`` before Keras is first imported,
so this module sets it (unless it is set) and fails if Keras runs another backend.

Remat: Keras 3.15's own remat is ``keras.remat(f)`` and ``keras.RematScope``, which on the
JAX backend both come down to ``jax.checkpoint(f)``, with no way to pass a policy.
:class:`RematBlock` keeps Keras's mechanism: the blocks are made inside
``keras.RematScope(mode="list_of_layers", layer_names=...)``, so Keras itself routes each
block's call through ``Layer.rematerialized_call``, and the block overrides that hook to
wrap its call in ``jax.checkpoint(..., policy=remat_policy)`` instead of ``keras.remat``'s
bare ``jax.checkpoint``. With ``remat_policy=KERAS_REMAT`` the block leaves the hook alone:
Keras's own ``keras.remat`` (the tests check it saves what ``nothing_saveable`` does).
"""

from __future__ import annotations

import os
import sys

if "keras" not in sys.modules:
    os.environ.setdefault("KERAS_BACKEND", "jax")

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np

from bench.corpus._common import jit_fast

if keras.backend.backend() != "jax":
    raise RuntimeError(
        f"the Keras corpus models need Keras's JAX backend, and Keras runs "
        f"{keras.backend.backend()!r} (KERAS_BACKEND={os.environ.get('KERAS_BACKEND')!r}): set "
        f"KERAS_BACKEND=jax before Keras is first imported")

#: ``remat_policy`` for Keras's own remat (``keras.remat``: ``jax.checkpoint`` without a policy).
KERAS_REMAT = "keras.remat"


class RematBlock(keras.layers.Layer):
    """A layer whose call is checkpointed under ``remat_policy`` when it is made inside
    :func:`remat_scope` (None: no checkpoint; :data:`KERAS_REMAT`: ``keras.remat``)."""

    def __init__(self, remat_policy: Callable | str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.remat_policy = remat_policy

    def rematerialized_call(self, layer_call: Callable, *args: Any, **kwargs: Any) -> Callable:
        if self.remat_policy is None or self.remat_policy == KERAS_REMAT:
            return super().rematerialized_call(layer_call, *args, **kwargs)
        policy = self.remat_policy

        def call(*args: Any, **kwargs: Any) -> Any:
            # Keyword arguments (``training=True``) stay Python values: keras.remat's
            # jax.checkpoint(layer_call) would trace them, and the call could not branch on
            # them (a batch norm's ``if training``).
            return jax.checkpoint(lambda *args: layer_call(*args, **kwargs),
                                  policy=policy)(*args)  # pyright: ignore[reportArgumentType]

        return call


def remat_scope(policy: Callable | str | None, block_names: Sequence[str]) -> Any:
    """The ``keras.RematScope`` to make the blocks in: the named layers rematerialized (none
    when ``policy`` is None)."""
    if policy is None:
        return keras.RematScope(mode=None)  # pyright: ignore[reportArgumentType]
    return keras.RematScope(mode="list_of_layers", layer_names=list(block_names))


def abstract(build: Callable[[], keras.Model]) -> keras.Model:
    """``build()`` inside a ``keras.StatelessScope``: the variables have shapes and dtypes
    but no values (nothing allocated)."""
    with keras.StatelessScope(initialize_variables=False):
        return build()


def param_shapes(model: keras.Model) -> dict[str, jax.ShapeDtypeStruct]:
    """The trainable variables by path."""
    paths = [v.path for v in model.trainable_variables]
    assert len(set(paths)) == len(paths), f"variable paths repeat: {paths}"
    return {v.path: jax.ShapeDtypeStruct(tuple(v.shape), jnp.dtype(v.dtype))
            for v in model.trainable_variables}


def stateless_apply(model: keras.Model, *, training: bool = False) -> Callable:
    """``apply(params, x) -> outputs`` by ``model.stateless_call``, ``params`` the trainable
    variables by path; non-trainable variables (batch norm statistics) are constants at
    their initial values and their updates are dropped."""
    non_trainable = [jnp.asarray(v._initializer(tuple(v.shape), v.dtype))  # pyright: ignore
                     for v in model.non_trainable_variables]

    def apply(params: dict[str, jax.Array], x: Any) -> Any:
        trainable = [params[v.path] for v in model.trainable_variables]
        out, _ = model.stateless_call(trainable, non_trainable, x, training=training)  # pyright: ignore
        return out

    return apply


def init_params(build: Callable[[], keras.Model], key: jax.Array) -> dict[str, jax.Array]:
    """The trainable variables of ``build()`` by path, each made by its own Keras
    initializer, reseeded from ``key``, all in one compiled function (eagerly, every
    initializer compiles programs of its own: tens of seconds)."""
    variables = abstract(build).trainable_variables
    seeds = np.asarray(jax.random.randint(key, (len(variables),), 0, 2**31 - 1)).tolist()

    def reseeded(initializer: Any, seed: int) -> Any:
        config = initializer.get_config() if isinstance(
            initializer, keras.initializers.Initializer) else {}
        return type(initializer).from_config({**config, "seed": seed}) if "seed" in config \
            else initializer

    def make() -> dict[str, jax.Array]:
        return {v.path: jnp.asarray(reseeded(v._initializer, seed)(tuple(v.shape), v.dtype))  # pyright: ignore
                for v, seed in zip(variables, seeds, strict=True)}

    return jit_fast(make)()
