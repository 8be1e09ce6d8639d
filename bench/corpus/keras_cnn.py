"""A residual CNN classifier in Keras 3 on JAX (``Conv2D``, ``BatchNormalization``,
``GlobalAveragePooling2D``, ``Dense``), a functional ``keras.Model``, NHWC.

A 3x3 stem convolution, then stages of residual blocks (two 3x3 convolutions with batch
norm and ReLU, a 1x1 projection shortcut where the shape changes), the first block of each
later stage striding by 2; global average pooling and a dense head with few classes; Keras's
sparse categorical cross-entropy. Batch norm runs in training mode (``training=True``:
statistics of the batch; the updated moving statistics are dropped). The loss runs
``model.stateless_call`` with the trainable variables (by path) as the parameters. With a
layer policy every block is rematerialized through Keras's ``RematScope`` hook with that
policy (see :mod:`bench.corpus._keras`).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from bench.corpus import _keras
from bench.corpus._common import dtype_name, registered
from bench.corpus._keras import keras


@dataclasses.dataclass(frozen=True)
class KerasCNNConfig:
    """Stage ``i`` has ``blocks_per_stage`` blocks of ``widths[i]`` channels."""

    widths: tuple[int, ...] = (64, 128, 256)
    blocks_per_stage: int = 2
    image_size: int = 32
    n_classes: int = 10
    batch: int = 32
    dtype: str = "bfloat16"


FULL = KerasCNNConfig()
TINY = KerasCNNConfig(widths=(8, 16), blocks_per_stage=1, image_size=8, n_classes=5, batch=4,
                      dtype="float32")


class ResidualBlock(_keras.RematBlock):
    """conv-BN-ReLU-conv-BN plus the (projected) input, then ReLU."""

    def __init__(self, filters: int, strides: int, project: bool, **kwargs: Any):
        super().__init__(**kwargs)
        kw: dict[str, Any] = {"use_bias": False, "padding": "same", "dtype": self.dtype_policy}
        self.conv1 = keras.layers.Conv2D(filters, 3, strides, name="conv1", **kw)
        self.bn1 = keras.layers.BatchNormalization(name="bn1", dtype=self.dtype_policy)
        self.conv2 = keras.layers.Conv2D(filters, 3, 1, name="conv2", **kw)
        self.bn2 = keras.layers.BatchNormalization(name="bn2", dtype=self.dtype_policy)
        self.proj = self.bn_proj = None
        if project:
            self.proj = keras.layers.Conv2D(filters, 1, strides, name="proj", **kw)
            self.bn_proj = keras.layers.BatchNormalization(name="bn_proj", dtype=self.dtype_policy)

    def call(self, x: Any, training: bool = False) -> Any:
        y = keras.ops.relu(self.bn1(self.conv1(x), training=training))
        y = self.bn2(self.conv2(y), training=training)
        if self.proj is not None and self.bn_proj is not None:
            x = self.bn_proj(self.proj(x), training=training)
        return keras.ops.relu(x + y)


def build(c: KerasCNNConfig, layer_policy: Callable | str | None = None) -> keras.Model:
    """The functional model, its blocks rematerialized under ``layer_policy``."""
    specs = [(f"stage{i}_block{j}", width, 2 if i > 0 and j == 0 else 1)
             for i, width in enumerate(c.widths) for j in range(c.blocks_per_stage)]
    images = keras.Input((c.image_size, c.image_size, 3), batch_size=c.batch, dtype=c.dtype,
                         name="images")
    x = keras.layers.Conv2D(c.widths[0], 3, padding="same", use_bias=False, name="stem",
                            dtype=c.dtype)(images)
    x = keras.layers.BatchNormalization(name="stem_bn", dtype=c.dtype)(x)
    x = keras.layers.ReLU(name="stem_relu", dtype=c.dtype)(x)
    with _keras.remat_scope(layer_policy, [name for name, _, _ in specs]):
        blocks, c_in = [], c.widths[0]
        for name, width, strides in specs:
            blocks.append(ResidualBlock(width, strides, strides != 1 or width != c_in,
                                        remat_policy=layer_policy, name=name, dtype=c.dtype))
            c_in = width
    for block in blocks:
        x = block(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool", dtype=c.dtype)(x)
    logits = keras.layers.Dense(c.n_classes, name="head", dtype=c.dtype)(x)
    return keras.Model(images, logits, name="resnet")


def make_loss(c: KerasCNNConfig, layer_policy: Callable | str | None = None) -> Callable:
    """``loss(params, batch)``: mean cross-entropy of the labels (Keras's, in float32)."""
    apply = _keras.stateless_apply(_keras.abstract(lambda: build(c, layer_policy)),
                                   training=True)

    def loss(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> jax.Array:
        logits = apply(params, batch["images"]).astype(jnp.float32)
        nll: Any = keras.losses.sparse_categorical_crossentropy(batch["labels"], logits,
                                                                from_logits=True)
        return jnp.mean(nll)

    return loss


def param_shapes(c: KerasCNNConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """The trainable variables by path, from a model built without values."""
    return dict(_param_shapes(c))


@functools.cache
def _param_shapes(c: Any) -> dict[str, jax.ShapeDtypeStruct]:
    return _keras.param_shapes(_keras.abstract(lambda: build(c)))


def batch_shapes(c: KerasCNNConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """NHWC images and integer labels."""
    return {"images": jax.ShapeDtypeStruct((c.batch, c.image_size, c.image_size, 3),
                                           jnp.dtype(c.dtype)),
            "labels": jax.ShapeDtypeStruct((c.batch,), jnp.int32)}


def init(c: KerasCNNConfig, key: jax.Array) -> tuple[dict[str, jax.Array], dict]:
    """Keras's initializers for the parameters; normal images and random labels."""
    k_params, k_images, k_labels = jax.random.split(key, 3)
    shapes = batch_shapes(c)
    return _keras.init_params(lambda: build(c), k_params), {
        "images": jax.random.normal(k_images, shapes["images"].shape, shapes["images"].dtype),
        "labels": jax.random.randint(k_labels, (c.batch,), 0, c.n_classes)}


def describe(c: KerasCNNConfig) -> str:
    """Architecture, shapes and dtype."""
    n = c.image_size
    stages = " -> ".join(f"{n >> i}x{n >> i}x{w}" for i, w in enumerate(c.widths))
    return (f"Keras 3 residual CNN (functional keras.Model), {len(c.widths) * c.blocks_per_stage} "
            f"blocks (Conv2D + BatchNormalization), stages {stages}, {c.n_classes}-class head, "
            f"batch {c.batch}, {dtype_name(c.dtype)}")


def models() -> list:
    """``keras-cnn`` and ``keras-cnn-tiny``."""
    return registered({"keras-cnn": FULL, "keras-cnn-tiny": TINY}, sys.modules[__name__],
                      shapes_of_config=True, jit_init=False)
