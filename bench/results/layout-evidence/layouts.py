"""Summarise allocations of a dump's main module by padding: shape, layout, size vs dense."""
import collections
import pathlib
import re
import sys

import numpy as np

d = pathlib.Path(sys.argv[1])
files = sorted(d.glob("*after_optimizations-buffer-assignment.txt"), key=lambda p: p.stat().st_size)
ba = files[-1].read_text()
item = {"f32": 4, "bf16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1, "f16": 2}
rows = []
for m in re.finditer(r"allocation (\d+): size (\d+)([^\n]*)\n((?: value:[^\n]*\n)*)", ba):
    size, kind, vals = int(m[2]), m[3], m[4]
    for v in re.finditer(r"value: <\d+ (\S+) @\d+> \(size=(\d+),offset=\d+\): (\w+)\[([\d,]*)\]\{([^}]*)\}", vals):
        dims = [int(x) for x in v[4].split(",") if x]
        dense = int(np.prod(dims)) * item.get(v[3], 4)
        rows.append((int(v[2]), dense, f"{v[3]}[{v[4]}]{{{v[5]}}}", kind.strip()[:30]))
tot = collections.Counter(); dn = collections.Counter()
seen = set()
big = sorted(set(rows), reverse=True)
for s, dense, sh, kind in big[:int(sys.argv[2]) if len(sys.argv) > 2 else 40]:
    print(f"{s/2**20:9.2f} MiB dense {dense/2**20:9.2f} x{s/max(dense,1):5.2f} {sh} {kind}")
