"""The user's source lines, found the same way with or without a virtual environment.

JAX guesses which frames of a traceback are the user's code
(``source_info_util.is_user_filename``): not JAX's, not the standard library's, not those a
library excludes. It takes the standard library's folder for library code, and a Python
installed without a virtual environment keeps its site-packages inside that folder: there
JAX hides the source lines of every package (Flax's, Equinox's, penzai's), which it shows
in a virtual environment. The layers found and the sites a policy file names would then
depend on how Python was installed; :func:`user_files` counts site-packages as JAX does in
a virtual environment, in both.
"""

from __future__ import annotations

import functools
import sysconfig
from collections.abc import Callable, Iterator

from jax._src import source_info_util
from jax._src.source_info_util import Frame
from jaxlib._jax import Traceback


def user_files(sites: tuple[str, ...] | None = None) -> Callable[[str], bool]:
    """Whether a file is the user's code, as JAX guesses it in a virtual environment.

    Args:
      sites: the site-packages folders; by default this Python's.
    """
    return _user_files(sites or _site_packages(), tuple(source_info_util._exclude_paths))


@functools.cache
def _site_packages() -> tuple[str, ...]:
    return tuple(sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}))


@functools.cache
def _user_files(sites: tuple[str, ...], exclusions: tuple[str, ...]) -> Callable[[str], bool]:
    """:func:`user_files` for given folders (the exclusions grow as libraries register)."""
    excluded = tuple(p for p in exclusions if not any(site.startswith(p) for site in sites))

    @functools.cache
    def is_user(name: str) -> bool:
        return source_info_util.is_user_filename(name) or (
            name.startswith(sites) and not name.startswith(excluded))

    return is_user


def frames(traceback: Traceback | None, is_user: Callable[[str], bool]) -> Iterator[Frame]:
    """The frames of ``traceback`` in the files ``is_user`` accepts, innermost first."""
    code, lasti = traceback.raw_frames() if traceback else ([], [])
    return (source_info_util.raw_frame_to_frame(c, i) for c, i in zip(code, lasti, strict=True)
            if is_user(c.co_filename))


def user_frame(traceback: Traceback | None) -> Frame | None:
    """The innermost frame of the user's code in ``traceback`` (:func:`user_files`)."""
    return next(frames(traceback, user_files()), None)
