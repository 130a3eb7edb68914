"""PyTorch reference for `ostinato bench --preset full-generate-30s`: a 30 s song at
full ACE-Step size with random weights, on the CPU.

    /work/venv-torch/bin/python bench_generate.py [--threads N] [--json]

The DiT is diffusers' AceStepTransformer1DModel (24 layers, hidden 2048, f32) in the
turbo loop of ACE-Step's `generate_audio` (8 steps at shift 3, r = t, Euler
x <- x - v (t_k - t_{k+1}), the last step x0 = x - v t), on random conditions of the
same shapes as ours (context [1, 750, 128], encoder states [1, 256, 2048]); then
AutoencoderOobleck.decode with ACE-Step's VAE config (random weights) on the latents
[1, 64, 750] in one piece. Prints one JSON object (the fields interleave.py reads,
plus sampling_s and decode_s).
"""
import argparse
import json
import os
import statistics
import time

import torch
from diffusers import AceStepTransformer1DModel, AutoencoderOobleck
from memory_and_vae import VAE_CONFIG, peak_rss_bytes, rss_bytes

TURBO_T = [1.0, 0.9545455, 0.9, 0.8333333, 0.75, 0.6428571, 0.5, 0.3]  # shift 3, as f32
FRAMES, ENCODER_LEN = 750, 256


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", os.cpu_count() or 1)))
    ap.add_argument("--layers", type=int, default=24, help="fewer for a quick check of the script")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    torch.set_grad_enabled(False)

    dit = AceStepTransformer1DModel(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=args.layers, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, in_channels=192, audio_acoustic_hidden_dim=64, patch_size=2,
        sliding_window=128, is_turbo=True, model_version="turbo",
    ).eval()
    for name, p in dit.named_parameters():
        if name.endswith("norm.weight") or "norm_q" in name or "norm_k" in name or name.endswith("norm_out.weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        elif "scale_shift_table" not in name:
            p.normal_(0.0, 0.02)
    vae = AutoencoderOobleck(**VAE_CONFIG).eval()

    g = torch.Generator().manual_seed(3)
    ctx = torch.randn(1, FRAMES, 128, generator=g)
    enc = torch.randn(1, ENCODER_LEN, 2048, generator=g)
    x = torch.randn(1, FRAMES, 64, generator=g)
    model_rss = rss_bytes()

    with torch.inference_mode():
        times = []
        start = time.perf_counter()
        for k, t in enumerate(TURBO_T):
            s = time.perf_counter()
            tt = torch.full((1,), t)
            v = dit(hidden_states=x, timestep=tt, timestep_r=tt, encoder_hidden_states=enc,
                    context_latents=ctx, return_dict=False)[0]
            t_next = TURBO_T[k + 1] if k + 1 < len(TURBO_T) else 0.0
            x = x - v * (t - t_next)
            times.append(time.perf_counter() - s)
        sampling_s = time.perf_counter() - start
        sampling_peak = peak_rss_bytes()

        start = time.perf_counter()
        audio = vae.decode(x.transpose(1, 2)).sample
        decode_s = time.perf_counter() - start
    assert audio.shape == (1, 2, FRAMES * 1920), audio.shape

    report = {
        "impl": "pytorch",
        "preset": "full-generate-30s",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "frames": FRAMES,
        "layers": args.layers,
        "encoder_len": ENCODER_LEN,
        "steps": len(times),
        "step_times_s": times,
        "median_s_per_step": statistics.median(times),
        "sampling_s": sampling_s,
        "decode_s": decode_s,
        "model_rss_bytes": model_rss,
        "sampling_peak_rss_bytes": sampling_peak,
        "peak_rss_bytes": peak_rss_bytes(),
    }
    print(json.dumps(report) if args.json else json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
