#!/usr/bin/env python3
"""Runs benchmark commands alternately (A B A B ...) and compares their medians.

    bench/interleave.py --rounds 3 \
        --run 'ours=target/release/ostinato bench --preset small-30s --json' \
        --run 'torch=bench/reference/.venv/bin/python bench/reference/bench_torch.py --preset small-30s --json'

Each command is one configuration in a fresh process (peak RSS is per process) and
must print one JSON object as its last stdout line with at least `median_s_per_step`
and `peak_rss_bytes` (`activation_bytes` optional). Round order alternates direction
(A B, B A, ...) so neither side always runs first. Prints per-round numbers, the median
of each label's per-step times over all rounds, and ratios against the first label.
Prints the host's CPU first (the ratios depend on it); with --out FILE the raw JSON of
every run is saved with it.
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time


def host():
    """The CPU the ratios were measured on: they depend on it (which vector width each
    side's GEMMs run, bench/NOTES.md run 15)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = (x.strip() for x in line.partition(":"))
                if key in ("vendor_id", "model name", "cpu family", "model") and key not in info:
                    info[key] = value
                if key == "flags":
                    info["avx512f"] = "avx512f" in value.split()
                    break
    except OSError as e:
        info["cpu"] = f"unknown ({e})"
    return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", action="append", required=True, help="LABEL=COMMAND")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("--env", action="append", default=[], help="LABEL:VAR=VALUE extra environment")
    args = ap.parse_args()
    runs = []
    for r in args.run:
        label, _, cmd = r.partition("=")
        runs.append((label, cmd))
    extra = {}
    for e in args.env:
        label, _, kv = e.partition(":")
        k, _, v = kv.partition("=")
        extra.setdefault(label, {})[k] = v

    import os
    machine = host()
    print("host: " + ", ".join(f"{k} {v}" for k, v in machine.items()), flush=True)
    results = {label: [] for label, _ in runs}
    for rnd in range(args.rounds):
        order = runs if rnd % 2 == 0 else list(reversed(runs))
        for label, cmd in order:
            env = dict(os.environ, **extra.get(label, {}))
            start = time.time()
            p = subprocess.run(cmd, shell=True, capture_output=True, text=True, env=env)
            if p.returncode != 0:
                print(f"[{label}] failed ({p.returncode}):\n{p.stderr[-2000:]}", file=sys.stderr)
                sys.exit(1)
            line = [l for l in p.stdout.strip().splitlines() if l.startswith("{")][-1]
            rep = json.loads(line)
            rep["_label"], rep["_round"], rep["_wall_s"] = label, rnd, time.time() - start
            results[label].append(rep)
            print(f"round {rnd} {label:>12}: median {rep['median_s_per_step']:.4f} s/step, "
                  f"peak {rep['peak_rss_bytes'] / 2**20:.0f} MiB, "
                  f"activation {rep.get('activation_bytes', 0) / 2**20:.0f} MiB, "
                  f"steps {[round(t, 3) for t in rep.get('step_times_s', [])]}", flush=True)

    print()
    base_label = runs[0][0]
    summary = {}
    for label, _ in runs:
        reps = results[label]
        all_steps = [t for r in reps for t in r.get("step_times_s", [r["median_s_per_step"]])]
        summary[label] = {
            "median_s_per_step": statistics.median(all_steps),
            "median_of_run_medians": statistics.median(r["median_s_per_step"] for r in reps),
            "peak_rss_bytes": statistics.median(r["peak_rss_bytes"] for r in reps),
            "activation_bytes": statistics.median(r.get("activation_bytes", 0) for r in reps),
        }
    b = summary[base_label]
    print(f"{'label':>14} {'s/step':>9} {'x ' + base_label:>10} {'peak MiB':>9} {'act MiB':>9} {'act x':>7}")
    for label, s in summary.items():
        act_ratio = s["activation_bytes"] / b["activation_bytes"] if b["activation_bytes"] else float("nan")
        print(f"{label:>14} {s['median_s_per_step']:9.4f} {s['median_s_per_step'] / b['median_s_per_step']:10.3f} "
              f"{s['peak_rss_bytes'] / 2**20:9.0f} {s['activation_bytes'] / 2**20:9.0f} {act_ratio:7.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"host": machine, "summary": summary, "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
