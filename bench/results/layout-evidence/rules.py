"""Compare candidate tiling rules with the sizes the compiler gave each buffer value."""
import collections
import math
import pathlib
import re
import sys

d = pathlib.Path(sys.argv[1])
files = sorted(d.glob("*after_optimizations-buffer-assignment.txt"), key=lambda p: p.stat().st_size)
ba = files[-1].read_text()
item = {"f32": 4, "bf16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1, "f16": 2}
def rup(x, m): return -(-x // m) * m
def rows_tile(d2, isz): return min(8, max(512 // (128 * isz), 1 << max(0, (d2 - 1).bit_length())))
def tiled(dims, order, isz):
    """order: minor_to_major list"""
    if not dims: return 512
    if len(dims) == 1:
        n = dims[0]; t = min(1024, max(512 // isz, 1 << max(0,(n-1).bit_length())))
        return rup(n, t) * isz
    m1, m2 = order[0], order[1]
    rest = math.prod(dims[k] for k in order[2:])
    return rest * rup(dims[m2], rows_tile(dims[m2], isz)) * rup(dims[m1], 128) * isz
def r1(dims, isz): n = len(dims); return tiled(dims, list(range(n - 1, -1, -1)), isz)
def r2(dims, isz):
    n = len(dims)
    if n < 2: return r1(dims, isz)
    return min(tiled(dims, [n - 1, k] + [j for j in range(n - 1) if j != k], isz) for k in range(n - 1))
def r3(dims, isz):
    n = len(dims)
    if n < 2: return r1(dims, isz)
    return min(tiled(dims, [a, b] + [j for j in range(n) if j not in (a, b)], isz) for a in range(n) for b in range(n) if a != b)
rules = {"dense": lambda dims, isz: math.prod(dims) * isz, "R1 row-major": r1, "R2 last minor, best 2nd": r2, "R3 best pair": r3}
err = collections.Counter(); total = 0
seen = set(); worst = collections.defaultdict(list)
stat = collections.Counter()
for m in re.finditer(r"value: <\d+ (\S+) @(\d+)> \(size=(\d+),offset=\d+\): (\w+)\[([\d,]*)\]\{([^}]*)\}", ba):
    name, size, dt, dims, lay = m[1], int(m[3]), m[4], [int(x) for x in m[5].split(",") if x], m[6]
    if (name, size) in seen or dt not in item: continue
    seen.add((name, size))
    isz = item[dt]; total += size
    order = [int(x) for x in lay.split(":")[0].split(",") if x]
    if len(dims) >= 2:
        stat["minor is last"] += (order[0] == len(dims) - 1) * size
        stat["2nd is 2nd-last"] += (order[1] == len(dims) - 2) * size
        stat["rank>=2"] += size
    for k, f in rules.items():
        p = f(dims, isz); err[k] += abs(p - size)
        if abs(p - size) > 2**20: worst[k].append((p - size, f"{dt}[{m[5]}]{{{lay}}}", size))
print(f"total value bytes {total/2**20:.1f} MiB; rank>=2 bytes with minor=last {stat['minor is last']/max(1,stat['rank>=2']):.0%}, 2nd-minor=2nd-last {stat['2nd is 2nd-last']/max(1,stat['rank>=2']):.0%}")
for k in rules:
    print(f"{k:26s} sum|err| {err[k]/2**20:9.1f} MiB ({err[k]/total:.1%})")
    for e, s, size in sorted(worst[k], key=lambda t: -abs(t[0]))[:6]:
        print(f"      {e/2**20:+9.1f} MiB  {s} actual {size/2**20:.1f}")
