"""The heap of a TPU step against the most bytes live in it at once, from an XLA dump.

    PYTHONPATH=.:solvers python bench/results/memory-space-evidence/dump_variant.py MODEL MIB default OUT
    python bench/results/fidelity-device-memory/heap_packing.py /tmp/dump-MODEL-MIB-default

Reads the step's buffer assignment (the heap: the ``preallocated-temp`` allocation of
color 0, each value's offset and size) and its live ranges (each value's first and last
position in the schedule), and prints the heap's size, the most bytes of its values live
at one position, and the difference: what the packing of the heap loses.
"""
import collections
import pathlib
import re
import sys

MIB = 2**20


def main(dump: pathlib.Path) -> None:
    assignment = next(dump.glob("*jit_loss*after_optimizations-buffer-assignment.txt")).read_text()
    live_range = next(dump.glob("*jit_loss*after_optimizations-live-range.txt")).read_text()
    heaps = (re.match(r"\d+: size (\d+), preallocated-temp:", b)
             for b in re.split(r"\nallocation ", assignment))
    heap = next(h for h in heaps if h is not None)
    size = int(heap.group(1))
    values = re.findall(r"value: <\d+ (\S+) @0> \(size=(\d+),offset=\d+\)",
                        heap.string)
    ranges = {name + index: (int(a), int(b)) for name, index, a, b in
              re.findall(r"^\s+(\S+?)(\{[^}]*\}):(\d+)-(\d+)", live_range, re.M)}
    change: dict[int, int] = collections.defaultdict(int)
    for name, nbytes in values:
        first, last = ranges[name if "{" in name else name + "{}"]
        change[first] += int(nbytes)
        change[last + 1] -= int(nbytes)
    live = most = 0
    for position in sorted(change):
        live += change[position]
        most = max(most, live)
    print(f"heap {size / MIB:.1f} MiB, most live at once {most / MIB:.1f} MiB, "
          f"lost to packing {(size - most) / MIB:.1f} MiB ({len(values)} values)")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
