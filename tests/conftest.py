"""Test session set-up."""

from __future__ import annotations

import jax
import pytest


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One persistent compilation cache for the session, shared by its workers: the same
    program compiled for the CPU by several tests (a model's reference gradients, a plan's
    step) is compiled once. TPU compiles are not served from it."""
    root = tmp_path_factory.getbasetemp()
    root = root.parent if root.name.startswith("popen-gw") else root
    jax.config.update("jax_compilation_cache_dir", str(root / "jax-cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
