"""Tracing: a function and abstract arguments to a :class:`Graph` of intermediate values.

The forward program is traced with :func:`jax.make_jaxpr`, flattened
(:mod:`autoremat._program`) and split into remat regions: each top-level ``scan`` is one
region per iteration (or, split into pieces by :func:`autoremat._program.split_scans`,
each piece is), and the unrolled code between scans is cut into segments where few
bytes cross (see :func:`segment_cuts`), so that recomputation happens close to where the
backward pass uses it.

Which values the backward pass reads is not guessed from a table: for every region JAX
itself is asked. Every value of the region is named, the region is wrapped in a
``jax.checkpoint`` that may save every name, and the residuals of its VJP are read off.
With names, each operation's backward reads only its (named) inputs, or its named
output where its JVP reads the output (``exp``, ``tanh``; see
:func:`autoremat._program.region_fn`), so this set does not depend on the plan; the plan
only decides whether each read value is saved or recomputed. What JAX recomputes even so
(values no name reaches) is measured the same way and counted in every plan
(:attr:`autoremat._graph.Graph.fixed_flops`).
"""

from autoremat._errors import UnsupportedProgramError as UnsupportedProgramError
from autoremat._trace._boundaries import candidate_cuts as candidate_cuts
from autoremat._trace._boundaries import crossing_bytes as crossing_bytes
from autoremat._trace._boundaries import layer_cuts as layer_cuts
from autoremat._trace._boundaries import layer_placement as layer_placement
from autoremat._trace._boundaries import layer_regions as layer_regions
from autoremat._trace._boundaries import segment_cuts as segment_cuts
from autoremat._trace._facts import ProgramFacts as ProgramFacts
from autoremat._trace._facts import program_facts as program_facts
from autoremat._trace._graph_builder import graph_of as graph_of
from autoremat._trace._memory import cotangent_holders as _cotangent_holders  # noqa: F401
from autoremat._trace._residuals import saved_bytes_as_written as saved_bytes_as_written
from autoremat._trace._tracing import split_program as split_program
from autoremat._trace._tracing import trace as trace
from autoremat._trace._tracing import trace_program as trace_program
