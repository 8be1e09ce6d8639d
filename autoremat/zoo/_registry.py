"""The zoo: every bundled model behind one interface, by name."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax

from autoremat.zoo import gpt2, llama, mlp, resnet, unet


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """A model and its batch, ready to plan or run.

    Example:
      >>> import autoremat
      >>> m = autoremat.zoo.get("mlp-tiny")
      >>> plan = autoremat.plan(m.make_loss(), m.param_shapes(), m.batch_shapes(),
      ...                       budget="floor")
      >>> plan.peak_bytes <= plan.no_remat_peak_bytes
      True

    Attributes:
      name: the key in :data:`ZOO`; the small float32 test variants end in ``-tiny``.
      description: one line: architecture, layer count, shapes, dtype, parameter count.
      make_loss: ``make_loss(layer_policy=None) -> loss(params, batch)``; the
        ``jax.checkpoint`` policy ``layer_policy`` is applied to every layer or block
        (for scanned layers, to the scan body with ``prevent_cse=False``); None means no
        checkpoint.
      param_shapes: ``() ->`` the parameter pytree as ``jax.ShapeDtypeStruct`` leaves.
      batch_shapes: ``() ->`` the batch pytree as ``jax.ShapeDtypeStruct`` leaves.
      init: ``key -> (params, batch)``, random concrete arrays.
      names: the ``checkpoint_name`` names the model puts on tensors (MaxText's).
    """

    name: str
    description: str
    make_loss: Callable[..., Callable]
    param_shapes: Callable[[], Any]
    batch_shapes: Callable[[], Any]
    init: Callable[[jax.Array], tuple[Any, Any]]
    names: tuple[str, ...]


def _model(name: str, module: ModuleType, config: Any) -> ZooModel:
    """A :class:`ZooModel` for ``config`` from a model module, which defines ``NAMES`` and
    ``describe``, ``param_shapes``, ``batch_shapes``, ``init_params``, ``init_batch`` and
    ``make_loss`` of a config (the last with an optional ``layer_policy``)."""

    def init(key: jax.Array) -> tuple[Any, Any]:
        k_params, k_batch = jax.random.split(key)
        return module.init_params(config, k_params), module.init_batch(config, k_batch)

    n_params = sum(math.prod(s.shape) for s in jax.tree.leaves(module.param_shapes(config)))
    return ZooModel(
        name=name,
        description=f"{module.describe(config)}, {n_params / 1e6:.1f}M params",
        make_loss=lambda layer_policy=None: module.make_loss(config, layer_policy),
        param_shapes=lambda: module.param_shapes(config),
        batch_shapes=lambda: module.batch_shapes(config),
        init=init,
        names=module.NAMES,
    )


_scan = lambda config, scan: dataclasses.replace(config, scan_layers=scan)

ZOO: dict[str, ZooModel] = {m.name: m for m in (
    _model("gpt2-small", gpt2, gpt2.GPT2_SMALL),
    _model("gpt2-small-scan", gpt2, _scan(gpt2.GPT2_SMALL, True)),
    _model("llama", llama, llama.LLAMA),
    _model("llama-unrolled", llama, _scan(llama.LLAMA, False)),
    _model("llama-24-unrolled", llama, _scan(llama.LLAMA_24, False)),
    _model("mlp", mlp, mlp.MLP),
    _model("resnet", resnet, resnet.RESNET50),
    _model("unet", unet, unet.UNET),
    _model("gpt2-small-tiny", gpt2, gpt2.GPT2_TINY),
    _model("gpt2-small-scan-tiny", gpt2, _scan(gpt2.GPT2_TINY, True)),
    _model("llama-tiny", llama, llama.LLAMA_TINY),
    _model("llama-unrolled-tiny", llama, _scan(llama.LLAMA_TINY, False)),
    _model("mlp-tiny", mlp, mlp.MLP_TINY),
    _model("resnet-tiny", resnet, resnet.RESNET_TINY),
    _model("unet-tiny", unet, unet.UNET_TINY),
)}


def get(name: str) -> ZooModel:
    """The zoo model called ``name``.

    Args:
      name: a key of :data:`ZOO` (``"gpt2-small"``, ``"mlp-tiny"``, ...).

    Returns:
      The :class:`ZooModel`.

    Raises:
      KeyError: no such model; the message lists the known names.

    Example:
      >>> import jax
      >>> from autoremat import zoo
      >>> model = zoo.get("mlp-tiny")
      >>> loss = model.make_loss()
      >>> float(loss(*model.init(jax.random.key(0)))) > 0
      True
    """
    try:
        return ZOO[name]
    except KeyError:
        raise KeyError(f"no zoo model {name!r}; known: {', '.join(ZOO)}") from None
