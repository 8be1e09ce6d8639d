"""Where an activation's elementwise op sits in a step's optimized HLO (a dump of
dump_step.py): inside a fusion that is a convolution's operand (recomputed there, not kept)
or in a fusion of its own (materialized). Usage: conv_operands.py DUMPDIR OP_NAME HLO_OP,
e.g. ``jit(relu)/max maximum`` or ``jvp(jit(silu))/mul multiply``."""

import collections
import pathlib
import re
import sys

dump, op_name, hlo_op = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
text = sorted(dump.glob("*jit_loss*after_optimizations.txt"))[0].read_text()
comps: dict[str, list[str]] = {}
current = None
for line in text.split("\n"):
    head = re.match(r"^(?:ENTRY )?%?(\S+) \(.*\) -> .*\{$", line)
    if head:
        current = head[1]
        comps[current] = []
    elif current:
        comps[current].append(line)
callers = collections.defaultdict(list)
for name, lines in comps.items():
    for line in lines:
        for callee in re.findall(r"calls=%?([\w.\-]+)", line):
            callers[callee].append((name, line.split("=")[0].strip()))
where = collections.Counter()
for name, lines in comps.items():
    ops = [re.search(r"= (\w+)\[([\d,]*)\]", line).groups() for line in lines
           if op_name in line and f" {hlo_op}(" in line]
    conv = any(re.search(r"convolution\([^)]*" + re.escape(var) + r"[,)]", "\n".join(comps[c]))
               for c, var in callers.get(name, []))
    for dtype, shape in ops:
        where[("a convolution's operand" if conv else "materialized", f"{dtype}[{shape}]")] += 1
for (kind, shape), n in sorted(where.items()):
    print(f"{n:3d} {kind:24s} {shape}")
