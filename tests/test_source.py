"""The user's source lines: the same with or without a virtual environment."""

from __future__ import annotations

import inspect
import os
import sysconfig

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax._src import source_info_util

from autoremat import _export, _source
from autoremat._trace._common import source_of


def test_package_source_lines_count_with_or_without_a_virtual_environment():
    """Without a virtual environment, site-packages lies inside the standard library's
    folder, all of which JAX takes for library code: the layers found (so the plans)
    would then differ from a virtual environment's, where Flax's LayerNorm lines count."""
    stdlib = sysconfig.get_path("stdlib")
    site = os.path.join(stdlib, "site-packages")
    is_user = _source.user_files(sites=(site,))
    layer_norm = os.path.join(site, "flax", "linen", "normalization.py")
    assert not source_info_util.is_user_filename(layer_norm)  # JAX alone hides it
    assert is_user(layer_norm)
    assert not is_user(os.path.join(stdlib, "functools.py"))
    # JAX's own files, and those a library excludes (Flax's module machinery), stay out.
    assert not is_user(jax.__file__) and not is_user(inspect.getfile(nn.Module))


def test_a_library_s_operation_is_reported_at_the_library_s_line():
    """The source a report and a policy file give for the variance in Flax's LayerNorm is
    Flax's own line in every install, not the line of this file that called the module."""
    norm = nn.LayerNorm()
    x = jnp.ones((4, 8))
    params = norm.init(jax.random.key(0), x)
    program = _export._trace_step(lambda p, x: jnp.sum(norm.apply(p, x)), params, (x,))
    sources = {source_of(e) for e in program.eqns if e.primitive.name == "rsqrt"}
    assert sources and all(os.path.basename(s.rpartition(":")[0]) == "normalization.py"
                           for s in sources), sources
