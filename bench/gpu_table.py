"""bench/gpu.sh's table: ours against PyTorch per configuration, the median over
rounds of each round's median step, their ratio, the fraction of the card's bf16
product rate ours reached, and GPU memory (ours: the driver's, PyTorch: its caching
allocator's reserved peak).

    python3 bench/gpu_table.py bench/results/gpu-<time>.jsonl
"""
import json
import statistics
import sys
from collections import defaultdict


def main(path):
    runs = defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        runs[(r["name"], r["gradient_checkpointing"], r["impl"])].append(r)
    names = sorted({(n, c) for n, c, _ in runs}, key=lambda k: (k[0], not k[1]))
    gib = lambda b: f"{b / 2**30:.2f}" if b else "-"
    print(f"{'config':>8} {'ckpt':>4} {'ours s':>8} {'torch s':>8} {'ours/torch':>10} {'bf16 frac':>9} {'ours GiB':>8} {'torch GiB':>9}")
    for name, ckpt in names:
        ours = [r for r in runs[(name, ckpt, "ours")] if not r.get("failed")]
        torch = [r for r in runs[(name, ckpt, "pytorch")] if not r.get("failed")]
        med = lambda rs: statistics.median(r["median_s_per_step"] for r in rs) if rs else None
        o, t = med(ours), med(torch)
        frac = statistics.median(r["bf16_fraction"] for r in ours) if ours and ours[0].get("bf16_fraction") else None
        o_mem = max((r.get("gpu_used_peak_bytes") or 0 for r in ours), default=0)
        t_mem = max((r.get("gpu_reserved_peak_bytes") or 0 for r in torch), default=0)
        fmt = lambda x, f: f"{x:{f}}" if x is not None else "failed"
        print(f"{name:>8} {'on' if ckpt else 'off':>4} {fmt(o, '8.4f'):>8} {fmt(t, '8.4f'):>8} "
              f"{fmt(o / t if o and t else None, '10.2f'):>10} {fmt(frac, '9.3f'):>9} {gib(o_mem):>8} {gib(t_mem):>9}")


if __name__ == "__main__":
    main(sys.argv[1])
