"""Array layouts: the bytes a value takes in the target's memory (a planning option).

``"dense"`` counts an array's data: ``elements x itemsize``.

``"tpu"`` counts the tiled layout the TPU compiler stores it in (measured from the buffer
assignment of ahead-of-time compiles for TPU v5e, libtpu 0.0.42.1):

* An array of rank 2 or more is stored in tiles of ``rows x 128`` elements over its two
  most minor dimensions: the minor one is padded to a multiple of 128, the second-minor
  one to a multiple of ``rows``, the least power of two at least its size, from
  ``512 / (128 x itemsize)`` (1 for 32-bit, 2 for 16-bit, 4 for 8-bit types) to 8, for
  every type (``f32[9,128]`` takes 16 rows, ``bf16[9,128]`` 16 rows too, not 32:
  bfloat16 tiles are ``(8,128)(2,1)``).
* A vector is padded to a multiple of the least power of two at least its length, from
  ``512 / itemsize`` to 1024 elements (``f32[1025]`` takes 2048 elements).
* Every array takes at least 512 bytes, a scalar too.

Which dimensions are minor is the compiler's choice. An argument of the step (and its
gradient) gets the one of least padding over all pairs of minor dimensions, as the compiler
lays out a step's parameters (``bf16[32,224,224,3]`` images are stored ``{2,1,3,0}``,
10.5 MiB, not 392 MiB with the 3 channels padded to 128). An intermediate value keeps its
last dimension minor: convolutions and dots keep the feature dimension there (a ResNet's
``bf16[32,112,112,64]`` activations take 98 MiB, twice their data), and of the others the
one that pads least is second-minor (a convolution's batch dimension:
``bf16[32,14,14,1024]`` is not padded to 16 rows). Dimensions of size 1 are dropped first:
the compiler lays them out anywhere (a ``(2048, 1)`` norm statistic is stored as
``f32[2048]``). In an array of rank 3 or more, a minor dimension below 128 whose product
with the one before is at most 512 is taken for a split of one minor dimension and merged
with it: a U-Net's group norm reshapes ``(8,64,64,256)`` activations to
``(8,64,64,32,8)``, and the compiler keeps no such array (it counts as ``(8,64,64,256)``,
not 16 times its data). This last rule is fitted to the U-Net, not read off a layout.
Copies the compiler makes to change a layout (an image read by a convolution with its
batch dimension minor) are not values of the program, and not counted.

``"tiled"`` counts the TPU tiles of the layout that pads an array least, over every pair of
minor dimensions (dimensions of size 1 dropped and a split minor dimension merged first, as
for ``"tpu"``): what the array takes whichever layout the compiler gives it. It counts the
padding no layout avoids, the data alone where one layout has none. A CNN's activations of
64 channels on 32x32 or 64x64 images are padded in every order of their dimensions, and
take twice their data as the compiler stores them, channels-last or channels-first
(``bf16[32,64,32,32]`` from an ``NCHW`` convolution: 8 MiB, stored ``{1,0,3,2}``); a
transformer's ``bf16[8,1024,768]`` takes its data.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import Literal, get_args

Layout = Literal["dense", "tpu", "tiled"]
#: The accepted layouts.
LAYOUTS: tuple[str, ...] = get_args(Layout)

_LANES = 128  # a tile's minor extent
_MAX_ROWS = 8  # a tile's largest second-minor extent
_MAX_VECTOR_TILE = 1024
_MIN_BYTES = 512
# The most elements of a minor dimension split in two that is still taken for a split (a
# group norm's 32 groups of up to 16 channels; a 112-wide row of 64 channels is not one).
_SPLIT_LANES = 4 * _LANES


def of_target(target: str | None) -> Layout:
    """The layout planning counts in for the compiler ``target`` (``verify``'s): ``"tiled"``
    for a TPU, ``"dense"`` otherwise (a GPU stores arrays unpadded, and without a target
    nothing is known of one)."""
    return "tiled" if target is not None and target.startswith("tpu") else "dense"


def check(layout: object, accepted: tuple[str, ...] = LAYOUTS) -> None:
    """Whether ``layout`` is one of ``accepted`` (:data:`LAYOUTS` by default).

    Raises:
      ValueError: it is not; the message names the accepted values.
    """
    if layout not in accepted:
        raise ValueError(f"layout must be one of {', '.join(map(repr, accepted))}; "
                         f"got {layout!r}")


def array_bytes(shape: Sequence[int], itemsize: int, layout: Layout, *,
                argument: bool = False) -> int:
    """Bytes of an array of ``shape`` and ``itemsize`` under ``layout``; ``argument``: an
    argument of the step, laid out by the compiler with the least padding."""
    elements = math.prod(shape)
    if layout == "dense" or not elements or not itemsize:
        return elements * itemsize
    if argument:
        return _least_padded(tuple(shape), itemsize)
    dims = _merge_minor(tuple(d for d in shape if d != 1))
    return (_least_padded if layout == "tiled" else _feature_minor)(dims, itemsize)


def _tiled(dims: Sequence[int], itemsize: int) -> int:
    """Bytes of an array whose dimensions, major to minor, are ``dims``, in TPU tiles."""
    if not dims:
        return _MIN_BYTES
    if len(dims) == 1:
        tile = min(_MAX_VECTOR_TILE, max(_MIN_BYTES // itemsize, _power_of_two(dims[0])))
        return _round_up(dims[0], tile) * itemsize
    *major, second, minor = dims
    rows = min(_MAX_ROWS, max(_MIN_BYTES // (_LANES * itemsize), _power_of_two(second)))
    return math.prod(major) * _round_up(second, rows) * _round_up(minor, _LANES) * itemsize


@functools.cache
def _least_padded(shape: tuple[int, ...], itemsize: int) -> int:
    """The fewest tiled bytes over every choice of the two minor dimensions."""
    if len(shape) < 2:
        return _tiled(shape, itemsize)
    return min(_tiled(_with_minor(shape, second, minor), itemsize)
               for second, minor in itertools.permutations(range(len(shape)), 2))


@functools.cache
def _feature_minor(dims: tuple[int, ...], itemsize: int) -> int:
    """Tiled bytes with the last dimension minor and the second-minor padded least."""
    if len(dims) < 2:
        return _tiled(dims, itemsize)
    minor = len(dims) - 1
    return min(_tiled(_with_minor(dims, second, minor), itemsize) for second in range(minor))


def _merge_minor(dims: tuple[int, ...]) -> tuple[int, ...]:
    """``dims`` of rank 3 or more with a minor dimension below 128 merged into the one
    before while the two hold at most :data:`_SPLIT_LANES` elements (a split of the minor
    dimension)."""
    while len(dims) >= 3 and dims[-1] < _LANES and dims[-2] * dims[-1] <= _SPLIT_LANES:
        dims = (*dims[:-2], dims[-2] * dims[-1])
    return dims


def _with_minor(dims: tuple[int, ...], second: int, minor: int) -> list[int]:
    """``dims`` reordered with ``second`` and ``minor`` as the two most minor."""
    return [*(d for k, d in enumerate(dims) if k not in (second, minor)),
            dims[second], dims[minor]]


def _power_of_two(n: int) -> int:
    """The least power of two at least ``n``."""
    return 1 << max(0, n - 1).bit_length()


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
