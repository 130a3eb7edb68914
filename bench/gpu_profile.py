"""One training step's GPU time by kernel class, from two ncu runs (one step and two
steps after the same set-up; their difference is one step's kernels):

    python3 bench/gpu_profile.py ncu-1.csv ncu-2.csv

The classes follow candle's kernel names (and cuBLAS's for the products).
"""
import csv
import sys
from collections import defaultdict

# First match wins: (class, substrings of the kernel's name).
CLASSES = [
    ("products (cuBLAS)", ("gemm", "cutlass", "xmma", "sm90_", "ampere_", "cublas")),
    ("casts", ("cast_",)),
    ("copies", ("copy", "ucopy", "fill", "memset")),
    ("reductions (norms, softmax, sums)", ("fast_sum", "fast_max", "fast_min", "reduce", "sum_", "argm")),
    ("elementwise binary (modulation, residual, masks)", ("badd", "bmul", "bsub", "bdiv", "bmaximum", "bminimum")),
    ("elementwise unary (exp, silu, sqrt, affine)", ("uexp", "usilu", "usqrt", "urecip", "usqr", "uneg", "affine", "powf", "elu", "u")),
    ("index, where, cat", ("index", "where", "gather", "scatter", "cat")),
]


def classify(name):
    low = name.lower()
    return next((c for c, keys in CLASSES if any(k in low for k in keys)), "other")


def load(path):
    by_class, launches = defaultdict(float), defaultdict(int)
    with open(path) as f:
        rows = [r for r in csv.reader(f) if r]
    header = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    cols = rows[header]
    name_at, time_at = cols.index("Kernel Name"), cols.index("gpu__time_duration.sum")
    # The row after the header names the units; times are kept in nanoseconds.
    scale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}[rows[header + 1][time_at]]
    for r in rows[header + 2:]:
        try:
            t = float(r[time_at].replace(",", "")) * scale
        except (ValueError, IndexError):
            continue
        c = classify(r[name_at])
        by_class[c] += t
        launches[c] += 1
    return by_class, launches


def main(one, two):
    t1, n1 = load(one)
    t2, n2 = load(two)
    total = sum(t2.values()) - sum(t1.values())
    print(f"one step's kernels (ncu, each alone): {total / 1e6:.2f} ms, {sum(n2.values()) - sum(n1.values())} launches")
    for c in sorted(set(t1) | set(t2), key=lambda c: t1.get(c, 0) - t2.get(c, 0)):
        t, n = t2.get(c, 0) - t1.get(c, 0), n2.get(c, 0) - n1.get(c, 0)
        print(f"  {c:>48}: {t / 1e6:8.2f} ms {100 * t / total if total else 0:5.1f}%  {n:6d} launches")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
