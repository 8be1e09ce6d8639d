"""Host offload: a third choice per residual, besides keeping it on device and recomputing it.

An offloaded residual is named like a saved one and the region's policy becomes
``jax.checkpoint_policies.save_and_offload_only_these_names(..., offload_src="device",
offload_dst="pinned_host")``: JAX's partial evaluation then puts a ``device_put`` to host
memory after the value in the forward pass and one back to the device before the backward
pass reads it, and XLA turns them into asynchronous copies to and from host memory
(memory space ``S(5)`` in the compiled program; ``memory_analysis().host_temp_size_in_bytes``
counts the host buffers).

The planning model (:mod:`autoremat_ilp`): an offloaded value costs no device
memory between its region's forward and backward stage; it is counted on the device in its
region's forward stage and again in its region's backward stage (while it is produced and
copied out, and while it is copied back and read), and in host memory for the whole step
(``held`` bytes, against :attr:`OffloadConfig.host_budget`). In a scan region the host
buffer stacks every iteration's copy, while the device holds only the copies in flight:
:attr:`OffloadConfig.scan_buffers` instances. Its cost is the transfer time the step cannot
hide behind compute, as FLOPs at the target's peak rate::

    2 * held / host_bandwidth * peak_flops * (1 - overlap)

(copied out in the forward pass and back in the backward pass).

What the TPU compiler does (libtpu 0.0.42 with jax 0.10.2, checked ahead of time for v5e;
``bench/results/offload.md``): under ``scan`` each iteration's residual is written into a
stacked buffer in host memory (an asynchronous ``dynamic-update-slice`` in the loop body)
and read back in the backward loop; the host bytes equal the planned ones and the device
peak follows the model as closely as for recompute-only plans. In unrolled code the
scheduler issues the copies to host only after the whole forward pass (and, without a
memory limit, prefetches them back early), so offloading there saves no device memory:
:attr:`OffloadConfig.regions` defaults to ``"scan"``. With ``jax_remat3`` on, jax 0.10.2
ignores offload in policies and recomputes those values instead (gradients are unchanged).
"""

from __future__ import annotations

import dataclasses

import autoremat_ilp as ilp
import numpy as np

from autoremat._budget import Budget, parse_budget
from autoremat._graph import Graph

#: Host-to-device bandwidth per chip and direction, bytes/s. A conservative figure for
#: every TPU generation: "How to Scale Your Model" (jax-ml.github.io/scaling-book, chapter
#: "All About TPUs") gives PCIe host links of about 1.5e10 bytes/s per chip (its v6e
#: example) and 16-32 GB/s across generations. Override with ``host_bandwidth``.
HOST_BANDWIDTH = {
    "tpu-v4": 1.5e10,
    "tpu-v5e": 1.5e10,
    "tpu-v5p": 1.5e10,
    "tpu-v6e": 1.5e10,
}

#: Peak dense bf16 FLOP/s per chip (Cloud TPU system architecture pages: v4 275 TFLOPs,
#: v5e 197, v5p 459, v6e (Trillium) 918).
PEAK_FLOPS = {
    "tpu-v4": 275e12,
    "tpu-v5e": 197e12,
    "tpu-v5p": 459e12,
    "tpu-v6e": 918e12,
}


@dataclasses.dataclass(frozen=True)
class OffloadConfig:
    """Allows :func:`autoremat.plan` to offload residuals to host memory.

    Attributes:
      host_budget: host memory the offloaded residuals may take: bytes (int) or a string
        with a unit (``"8GiB"``).
      target: the hardware whose host bandwidth and peak FLOP/s price the transfers (a key
        of :data:`HOST_BANDWIDTH`), unless both ``host_bandwidth`` and ``peak_flops`` are
        given.
      overlap: the fraction of transfer time hidden behind compute, in [0, 1]: 0.5 counts
        half of every transfer as lost step time.
      host_bandwidth: bytes/s per direction between device and host (default: the
        target's).
      peak_flops: FLOP/s that convert transfer time into recompute-equivalent FLOPs
        (default: the target's).
      regions: ``"scan"`` (default) offloads only values of scan bodies, where the TPU
        compiler overlaps each iteration's copies with compute; ``"all"`` also offloads in
        unrolled regions, where it was seen to issue the copies only after the forward
        pass (see the module doc).
      scan_buffers: device copies of one iteration's value an offloaded scan residual is
        counted for in its region's forward and backward stage (copies in flight).

    Example:
      >>> import autoremat
      >>> autoremat.OffloadConfig(host_budget="8GiB", target="tpu-v5e").host_budget_bytes
      8589934592
    """

    host_budget: Budget
    target: str = "tpu-v5e"
    overlap: float = 0.5
    host_bandwidth: float | None = None
    peak_flops: float | None = None
    regions: str = "scan"
    scan_buffers: int = 2

    def __post_init__(self) -> None:
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"overlap must be in [0, 1], got {self.overlap}")
        if self.regions not in ("scan", "all"):
            raise ValueError(f"regions must be 'scan' or 'all', got {self.regions!r}")
        if self.scan_buffers < 1:
            raise ValueError(f"scan_buffers must be at least 1, got {self.scan_buffers}")
        if (self.host_bandwidth is None or self.peak_flops is None) and (
                self.target not in HOST_BANDWIDTH):
            raise ValueError(f"no host bandwidth figures for target {self.target!r}: use one "
                             f"of {sorted(HOST_BANDWIDTH)} or give host_bandwidth and "
                             "peak_flops")
        for name in ("host_bandwidth", "peak_flops"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.host_budget_bytes  # noqa: B018  (validates the budget)

    @property
    def host_budget_bytes(self) -> int:
        """The host budget in bytes."""
        parsed = parse_budget(self.host_budget)
        if not isinstance(parsed, int):
            raise ValueError(  # noqa: TRY004  (a fraction is a value error, as for budgets)
                "host_budget must be bytes (an int) or a string with a unit, not a "
                f"fraction or 'floor': got {self.host_budget!r}")
        return parsed

    @property
    def flops_per_byte(self) -> float:
        """Recompute-equivalent FLOPs of moving one byte to host and back (both ways)."""
        bandwidth = self.host_bandwidth or HOST_BANDWIDTH[self.target]
        flops = self.peak_flops or PEAK_FLOPS[self.target]
        return 2.0 / bandwidth * flops * (1.0 - self.overlap)


def offload_problem(graph: Graph, problem: ilp.Problem, config: OffloadConfig) -> ilp.Problem:
    """``problem`` (the graph's, made by :func:`autoremat._solve.problem_of`, which calls
    this) with offload allowed as ``config`` says (model in the module doc)."""
    lengths = np.array([r.length for r in graph.regions], dtype=np.int64)
    in_scan = np.array([r.kind == "scan" for r in graph.regions])[graph.array("region")]
    primitive = [v.primitive for v in graph.values]
    # Only values a region computes can carry a name (not a scan body's inputs), and only
    # values read by their own region's backward alone (another region saves its inputs).
    named = np.array([p not in ("carry_in", "xs_in", "scan") for p in primitive])
    # A scalar is no array worth a transfer: the TPU compiler wrote no host copy of a
    # scan's offloaded scalar (a ``sqrt``, the scanned test GPT-2 with offload).
    arrays = np.array([len(v.shape) > 0 for v in graph.values], dtype=bool)
    can = (problem.can_save & ~problem.must_save & named & arrays & (problem.held > 0))
    if config.regions == "scan":
        can &= in_scan
    nbytes = graph.array("nbytes")
    per_stage = np.where(in_scan, np.minimum(problem.held, config.scan_buffers * nbytes),
                         problem.held)
    iterations = lengths[graph.array("region")]
    return dataclasses.replace(
        problem,
        can_offload=can,
        # One unit per instance breaks ties towards saving when both fit.
        offload_cost=np.ceil(problem.held * config.flops_per_byte) + iterations,
        offload_forward=per_stage,
        offload_backward=per_stage,
        host_budget=float(config.host_budget_bytes),
    )
