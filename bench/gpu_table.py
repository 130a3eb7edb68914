"""bench/gpu.sh's table: ours against PyTorch per configuration, the median over
rounds of each round's median step, their ratio, the fraction of the card's bf16
product rate ours reached, and GPU memory (ours: the driver's, PyTorch: its caching
allocator's reserved peak). Then ours against the footprint model (issue 50, point 6):
the pool's used peak over the prediction (within 15% is the target), what the pool
held at most beyond it, and what the device held before the model (the context).

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

    print(f"\n{'config':>8} {'ckpt':>4} {'predicted':>9} {'used peak':>9} {'used/pred':>9} {'reserved':>9} {'context':>8}  (GiB)")
    for name, ckpt in names:
        for r in (r for r in runs[(name, ckpt, "ours")] if not r.get("failed") and r.get("gpu_used_peak_bytes")):
            used, pred = r["gpu_used_peak_bytes"], r["predicted_peak_bytes"]
            print(f"{name:>8} {'on' if ckpt else 'off':>4} {gib(pred):>9} {gib(used):>9} {used / pred:>9.3f} "
                  f"{gib(r.get('gpu_reserved_peak_bytes')):>9} {gib(r.get('gpu_outside_pool_bytes')):>8}")


if __name__ == "__main__":
    main(sys.argv[1])
