#!/usr/bin/env python3
"""Side by side: two `bench_gpu --kernel-times` outputs (a baseline and a new run).

For each bench point in both, the device time per step by phase and by kernel, in ms, with the
ratio new/baseline, so that a short GPU run shows at once which change gained and which lost.
Rows a run left out (under 0.5 % of its step) show as "-".

    compare_kernel_times.py BASELINE.txt NEW.txt
"""
import re
import sys

HEADER = re.compile(r"^\[(?P<point>[^\]]+)\] device time per step by (?P<kind>phase|kernel) "
                    r"\(sum (?P<sum>[0-9.]+) ms")
ROW = re.compile(r"^    (?P<name>.+?)\s+(?P<ms>[0-9.]+) ms\s+[0-9.]+%$")


def parse(path):
    """{(point, kind): (sum_ms, {name: ms})}, names in the file's order."""
    tables, current = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            m = HEADER.match(line)
            if m:
                current = {}
                tables[(m["point"], m["kind"])] = (float(m["sum"]), current)
                continue
            r = ROW.match(line)
            if r and current is not None:
                current[r["name"].strip()] = float(r["ms"])
            elif line.strip() and not line.startswith("    "):
                current = None
    return tables


def cell(x):
    return "-" if x is None else f"{x:.2f}"


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: compare_kernel_times.py BASELINE.txt NEW.txt")
    base, new = parse(argv[1]), parse(argv[2])
    shared = [k for k in new if k in base]
    if not shared:
        sys.exit(f"compare_kernel_times.py: no bench point in both {argv[1]} and {argv[2]}")
    for key in shared:
        (bsum, b), (nsum, n) = base[key], new[key]
        point, kind = key
        print(f"\n{point}, device time per step by {kind} (ms): baseline {bsum:.2f}, "
              f"new {nsum:.2f} ({nsum / bsum:.3f}x)")
        print(f"| {kind} | baseline | new | new/baseline |")
        print("|---|---|---|---|")
        names = list(n) + [x for x in b if x not in n]
        for name in sorted(names, key=lambda x: -max(b.get(x, 0.0), n.get(x, 0.0))):
            bm, nm = b.get(name), n.get(name)
            ratio = f"{nm / bm:.2f}" if bm and nm is not None else "-"
            print(f"| {name} | {cell(bm)} | {cell(nm)} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
