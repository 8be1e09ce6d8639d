"""Array layouts: tiled TPU sizes, and the ``layout`` option through planning."""

from __future__ import annotations

import importlib.util

import autoremat_ilp as ilp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autoremat
from autoremat import _layout, _measure, _rewrite, _solve, _trace
from autoremat._policy_file import PolicyFile

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason='the TPU compiler is not installed: pip install "autoremat[tpu]"')


# Allocation sizes of parameters in the buffer assignment of a TPU v5e compile (libtpu
# 0.0.42.1), with the layouts the compiler chose.
@pytest.mark.parametrize("shape, dtype, compiled", [
    ((), jnp.float32, 512),  # f32[]{:T(128)}
    ((), jnp.int8, 512),  # s8[]{:T(512)}
    ((64,), jnp.float32, 512),  # f32[64]{0:T(128)}
    ((129,), jnp.float32, 1024),  # f32[129]{0:T(256)}
    ((1025,), jnp.float32, 8192),  # f32[1025]{0:T(1024)}
    ((1000,), jnp.bfloat16, 2048),  # bf16[1000]{0:T(1024)(128)(2,1)}
    ((3, 5), jnp.float32, 2048),  # f32[3,5]{1,0:T(4,128)}
    ((3, 5), jnp.bfloat16, 1024),  # bf16[3,5]{1,0:T(4,128)(2,1)}
    ((9, 128), jnp.bfloat16, 4096),  # bf16[9,128]{1,0:T(8,128)(2,1)}: 16 rows, not 32
    ((17, 64), jnp.int8, 3072),  # s8[17,64]{1,0:T(8,128)(4,1)}
    ((7, 1, 1), jnp.float32, 512),  # f32[7,1,1]{0,2,1:T(1,128)}
    ((5, 1, 128), jnp.float32, 2560),  # f32[5,1,128]{2,1,0:T(1,128)}
    ((2, 9, 64), jnp.float32, 9216),  # f32[2,9,64]{2,0,1:T(2,128)}
    ((2, 16, 16, 3), jnp.bfloat16, 24576),  # bf16[2,16,16,3]{2,1,3,0:T(8,128)(2,1)}
    ((2, 16, 16, 64), jnp.float32, 262144),  # f32[2,16,16,64]{3,2,1,0:T(8,128)}
])
def test_argument_bytes_are_the_compilers(shape, dtype, compiled):
    itemsize = jnp.dtype(dtype).itemsize
    assert _layout.array_bytes(shape, itemsize, "tpu", argument=True) == compiled
    assert _layout.array_bytes(shape, itemsize, "dense", argument=True) == \
        np.prod(shape, dtype=int) * itemsize


@pytest.mark.parametrize("shape, itemsize, ratio", [
    ((16, 64), 4, 2),  # a 64-wide minor dimension is padded to 128
    ((32, 112, 112, 64), 2, 2),  # ResNet's first activations: 98 MiB for 49 of data
    ((32, 14, 14, 1024), 2, 1),  # the batch is second-minor, not the 14
    ((8, 64, 64, 32, 8), 4, 1),  # a group norm's split of 256 channels counts as 256
    ((8, 256, 256, 32, 2), 2, 2),  # and one of 64 channels as 64, padded
])
def test_intermediate_bytes_pad_the_feature_dimension(shape, itemsize, ratio):
    dense = int(np.prod(shape)) * itemsize
    assert _layout.array_bytes(shape, itemsize, "tpu") == ratio * dense


# Activations of the corpus CNNs as the TPU v5e compiler stores them (buffer assignment,
# libtpu 0.0.42.1): 64 channels padded to 128 whichever dimension is minor.
@pytest.mark.parametrize("shape, stored, ratio", [
    ((32, 64, 32, 32), "{1,0,3,2}", 2),  # eqx-cnn, NCHW under vmap: the channels minor
    ((16, 64, 64, 64), "{3,0,2,1}", 2),  # linen-cnn, NHWC
    ((32, 128, 16, 16), "{1,0,3,2}", 1),
    ((32, 256, 8, 8), "{1,0,3,2}", 1),  # "tpu" puts the 8 minor: twice its data
    ((8, 1024, 768), "{2,1,0}", 1),
])
def test_tiled_bytes_are_the_least_padded_tiles(shape, stored, ratio):
    dense = int(np.prod(shape)) * 2
    assert _layout.array_bytes(shape, 2, "tiled") == ratio * dense, stored
    assert _layout.array_bytes(shape, 2, "tiled") <= _layout.array_bytes(shape, 2, "tpu")


def test_unit_dimensions_are_dropped():
    assert _layout.array_bytes((2048, 1), 4, "tpu") == _layout.array_bytes((2048,), 4, "tpu")
    assert _layout.array_bytes((2048, 1), 4, "tpu") == 8192


def _graph(fn, *args, layout, placement=None):
    flat_fn, _, avals, _ = _rewrite.flat_function(fn, args, {})
    return _trace.trace(flat_fn, avals, placement, layout=layout)[2]


def _mlp_loss(w, x):
    h = jnp.tanh(x @ w)
    return jnp.sum(jnp.tanh(h @ w) ** 2)


W, X = jax.ShapeDtypeStruct((64, 64), jnp.float32), jax.ShapeDtypeStruct((512, 64), jnp.float32)


def _deep_loss(w, x):
    for _ in range(6):
        x = jnp.tanh(x @ w)
    return jnp.sum(x ** 2)


@pytest.mark.parametrize("layout, row, scalar, args", [
    ("dense", 512 * 64 * 4, 4, (64 + 512) * 64 * 4),
    # x is stored with its 512 rows minor, unpadded; w's 64 lanes are padded to 128
    ("tpu", 512 * 128 * 4, 512, 64 * 128 * 4 + 512 * 64 * 4),
])
def test_exact_bytes_of_a_small_function(layout, row, scalar, args):
    graph = _graph(_mlp_loss, W, X, layout=layout)
    assert graph.layout == layout
    assert graph.arg_bytes == args
    assert graph.grad_bytes == args  # both arguments are floating-point
    assert {(v.shape, v.nbytes) for v in graph.values} == {((512, 64), row), ((), scalar)}


def test_tpu_plan_fits_its_budget_under_the_model_and_is_deterministic():
    plans = [autoremat.plan(_deep_loss, W, X, budget=0.8, layout="tpu") for _ in range(2)]
    p = plans[0]
    assert p == plans[1] and p.layout == "tpu" and p.recomputed
    problem = _solve.problem_of(p.graph)
    ids = p.graph.array("id")
    save, recompute = np.isin(ids, list(p.saved)), np.isin(ids, list(p.recomputed))
    _, peak = ilp.evaluate(problem, save, recompute)
    assert peak == p.peak_bytes <= p.budget_bytes
    dense = autoremat.plan(_deep_loss, W, X, budget=0.8)
    assert dense.layout == "dense" and dense.no_remat_peak_bytes < p.no_remat_peak_bytes


@pytest.mark.parametrize("call", [
    lambda: autoremat.plan(_mlp_loss, W, X, budget=0.5, layout="packed"),
    lambda: autoremat.optimize(_mlp_loss, budget=0.5, layout="packed"),
])
def test_bad_layout_names_the_accepted_values(call):
    with pytest.raises(ValueError,
                       match="layout must be one of 'dense', 'tpu', 'tiled', 'auto'; got 'packed'"):
        call()


@pytest.mark.parametrize("layout", ["tpu", "tiled"])
def test_policy_file_keeps_the_layout(tmp_path, layout):
    p = autoremat.plan(_deep_loss, W, X, budget=0.8, layout=layout)
    p.save(tmp_path / "plan.json")
    loaded = autoremat.load_plan(tmp_path / "plan.json", _deep_loss, W, X)
    assert loaded.layout == layout and loaded.peak_bytes == p.peak_bytes
    _, differences = PolicyFile.read(tmp_path / "plan.json").locate(
        _graph(_deep_loss, W, X, layout="dense", placement=p.placement))
    assert f"layout: {layout} in the file, dense in the function's trace" in differences


@needs_libtpu
def test_tpu_argument_and_gradient_bytes_are_the_compilers():
    image = jax.ShapeDtypeStruct((2, 16, 16, 3), jnp.uint8)  # stored {2,1,3,0}
    w = jax.ShapeDtypeStruct((512, 64), jnp.float32)  # stored {0,1}: 512 lanes, 64 rows

    def loss(w, image):
        return jnp.sum(jnp.tanh(image.astype(jnp.float32)[..., :1] @ w[:1]))

    graph = _graph(loss, w, image, layout="tpu")
    measured = _measure.measure_step(loss, w, image, target="tpu-v5e")
    assert graph.arg_bytes == measured.argument_bytes == 12288 + 131072
    assert graph.grad_bytes == measured.output_bytes == 131072
