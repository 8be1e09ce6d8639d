"""What the corpus files share: the :class:`~autoremat.zoo.ZooModel` record, its parameter
count, and a loss on logits."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from autoremat.zoo import ZooModel

Init = Callable[[jax.Array], tuple[Any, Any]]


def corpus_model(name: str, description: str, make_loss: Callable[..., Callable], init: Init,
                 param_shapes: Callable[[], Any] | None = None,
                 batch_shapes: Callable[[], Any] | None = None, jit_init: bool = True
                 ) -> ZooModel:
    """A :class:`~autoremat.zoo.ZooModel` with ``, <n>M params`` added to ``description``.

    Args:
      name: the registry key.
      description: architecture, layers, shapes and dtype, one line.
      make_loss: ``make_loss(layer_policy=None) -> loss(params, batch)``.
      init: ``key -> (params, batch)`` of random concrete arrays.
      param_shapes, batch_shapes: the trees as ``jax.ShapeDtypeStruct`` leaves; by default
        ``jax.eval_shape`` of ``init`` (nothing allocated), computed once.
      jit_init: run ``init`` as one compiled function (:func:`jit_fast`); eagerly, Flax's
        and Equinox's initializers compile one small program per parameter (seconds).
    """
    abstract = functools.cache(lambda: jax.eval_shape(init, jax.random.key(0)))
    param_shapes = param_shapes or (lambda: abstract()[0])
    batch_shapes = batch_shapes or (lambda: abstract()[1])
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(param_shapes()))
    return ZooModel(name=name, description=f"{description}, {n_params / 1e6:.1f}M params",
                    make_loss=make_loss, param_shapes=param_shapes, batch_shapes=batch_shapes,
                    init=jit_fast(init) if jit_init else init, names=())


def registered(configs: dict[str, Any], module: Any, *, shapes_of_config: bool = False,
               jit_init: bool = True) -> list[ZooModel]:
    """:func:`corpus_model` for each ``name: config`` from a corpus file ``module``, which
    defines ``describe``, ``make_loss`` and ``init`` of a config (and, with
    ``shapes_of_config``, ``param_shapes`` and ``batch_shapes`` of one)."""

    def model(name: str, c: Any) -> ZooModel:
        shapes = ((lambda: module.param_shapes(c)), (lambda: module.batch_shapes(c))
                  ) if shapes_of_config else (None, None)
        return corpus_model(name, module.describe(c),
                            lambda layer_policy=None: module.make_loss(c, layer_policy),
                            lambda key: module.init(c, key), *shapes, jit_init=jit_init)

    return [model(name, c) for name, c in configs.items()]


def jit_fast(fn: Callable) -> Callable:
    """``jax.jit(fn)``, compiled without LLVM's expensive optimizations on the CPU (their
    random initializers compile for seconds otherwise, and run once)."""
    fast = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}

    on_cpu, elsewhere = jax.jit(fn, compiler_options=fast), jax.jit(fn)

    @functools.wraps(fn)
    def run(*args: Any) -> Any:
        return (on_cpu if jax.default_backend() == "cpu" else elsewhere)(*args)

    return run


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy of integer ``labels`` under ``logits`` (classes last), in float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, labels[..., None], axis=-1).mean()


def is_float_leaf(x: Any) -> bool:
    """Float arrays, concrete or abstract (``jax.ShapeDtypeStruct``): ``eqx.is_inexact_array``
    for a model made by ``eqx.filter_eval_shape`` too."""
    return isinstance(x, jax.Array | jax.ShapeDtypeStruct) and jnp.issubdtype(x.dtype,
                                                                              jnp.inexact)


def dtype_name(dtype: Any) -> str:
    """``"bfloat16"`` for ``jnp.bfloat16`` and the like."""
    return jnp.dtype(dtype).name
