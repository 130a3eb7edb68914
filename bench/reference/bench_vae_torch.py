"""PyTorch reference for `ostinato bench --preset vae-*`: diffusers' AutoencoderOobleck
at ACE-Step's real VAE config (random weights), encode or decode, on the CPU.

One invocation measures one configuration (peak RSS is per process):

    python bench_vae_torch.py --preset vae-encode-30s [--warmup 1] [--steps 3] [--json]

Encode: stereo 48 kHz audio uniform in [-0.5, 0.5) -> `encode(x).latent_dist.mean`.
Decode: latents [1, 64, T] uniform in [-1, 1) -> `decode(z).sample`. Under
`torch.inference_mode()`. diffusers has no tiling for this VAE: 30 s go in one pass;
240 s in one pass would need ~34 GB above the weights (4.2 GB per 30 s, measured), so
the 240 s presets run eight 30 s pieces one after the other, without overlap: less
work than a tiled pass whose result equals the whole song's (ours), so a ratio against
it favours PyTorch.
"""
import argparse
import json
import os
import resource
import statistics
import time

import torch
from diffusers import AutoencoderOobleck
from memory_and_vae import VAE_CONFIG, peak_rss_bytes, rss_bytes  # VAE_CONFIG: ACE-Step 1.5's vae/config.json

# The longest piece diffusers is given at once: 30 s (see the module doc).
PIECE_FRAMES = 750
PRESETS = {"vae-encode-30s": (True, 30), "vae-encode-240s": (True, 240), "vae-decode-30s": (False, 30), "vae-decode-240s": (False, 240)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", os.cpu_count() or 1)))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    encode, seconds = PRESETS[args.preset]
    vae = AutoencoderOobleck(**VAE_CONFIG).eval()
    frames = seconds * 25
    piece = min(frames, PIECE_FRAMES)
    if encode:
        x = torch.rand(1, 2, frames * 1920) - 0.5
        run = lambda: [vae.encode(p).latent_dist.mean for p in x.split(piece * 1920, dim=2)]
    else:
        z = torch.rand(1, 64, frames) * 2 - 1
        run = lambda: [vae.decode(p).sample for p in z.split(piece, dim=2)]
    baseline = rss_bytes()
    times, cpu = [], []
    cpu_now = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])  # user + system
    with torch.inference_mode():
        for i in range(args.warmup + args.steps):
            start, cpu_start = time.perf_counter(), cpu_now()
            run()
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
                cpu.append(cpu_now() - cpu_start)
    peak = peak_rss_bytes()
    report = {
        "preset": args.preset,
        "impl": "diffusers AutoencoderOobleck",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "seconds_of_audio": seconds,
        "pieces_of_frames": piece,
        "runs_s": times,
        "median_s_per_step": statistics.median(times),
        "cpu_s_per_step": statistics.median(cpu),
        "peak_rss_bytes": peak,
        "model_rss_bytes": baseline,
        "activation_bytes": max(0, peak - baseline),
    }
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:20} {v}")


if __name__ == "__main__":
    main()
