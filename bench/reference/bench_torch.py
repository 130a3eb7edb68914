"""PyTorch reference for `ostinato bench`: the same shapes and the same training step
with diffusers' AceStepTransformer1DModel + PEFT LoRA, on the CPU or a CUDA GPU.

One invocation measures one configuration (peak RSS is per process):

    .venv/bin/python bench_torch.py --preset small-30s --gradient-checkpointing on [--json]
    python3 bench_torch.py --preset full-240s --device cuda --dtype bf16   # bench/gpu.sh

On CUDA at bf16 the step is upstream ACE-Step's trainer's: base weights in bf16, the
LoRA parameters and AdamW in f32, forward and backward under bf16 autocast, attention
through torch's SDPA (diffusers' default backend); GPU memory is the caching
allocator's peak, allocated and reserved.

Step = flow-matching noise (x1 ~ N(0,1), x_t = t x1 + (1-t) x0, r = t) -> forward ->
MSE(pred, x1 - x0) -> backward -> clip_grad_norm_(1.0) -> AdamW (wd 0.01).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
from diffusers import AceStepTransformer1DModel
from peft import LoraConfig
from memory_and_vae import peak_rss_bytes, rss_bytes

PRESETS = {
    # hidden, intermediate, layers, heads, kv_heads, head_dim, frames, encoder_len, encoder width
    "small-30s": (512, 1536, 8, 8, 4, 64, 750, 128, 512),
    "small-240s": (512, 1536, 8, 8, 4, 64, 6000, 128, 512),
    "full-layer": (2048, 6144, 1, 16, 8, 128, 750, 256, 2048),
    "full-pair-240s": (2048, 6144, 2, 16, 8, 128, 6000, 256, 2048),
    # The whole 2B at 30 s (ours: `--preset full-layer --layers 24`) and at 4 minutes.
    "full-30s": (2048, 6144, 24, 16, 8, 128, 750, 256, 2048),
    "full-240s": (2048, 6144, 24, 16, 8, 128, 6000, 256, 2048),
    # XL: a 2560-wide DiT over the 2048-wide condition (HOT-Step's setting at 30 s).
    "xl-30s": (2560, 9728, 32, 32, 8, 128, 750, 256, 2048),
}
TURBO_T = [1.0, 0.9545455, 0.9, 0.8333333, 0.75, 0.6428571, 0.5, 0.3]


def blas():
    """The BLAS torch was built with, as its build report names it. MKL takes its
    AVX-512 kernels only on Intel CPUs; on AMD it runs 256-bit ones (NOTES run 15)."""
    lines = [l.strip(" -") for l in torch.__config__.show().splitlines()]
    return next((l for l in lines if "Math Kernel Library" in l or "OpenBLAS" in l), "unknown")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--gradient-checkpointing", choices=["on", "off"], default="off")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", os.cpu_count() or 1)))
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                    help="bf16: bf16 base weights, f32 LoRA and AdamW, bf16 autocast")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    bf16 = args.dtype == "bf16"

    hidden, inter, layers, heads, kv, hd, frames, enc_len, enc_width = PRESETS[args.preset]
    model = AceStepTransformer1DModel(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=hd,
        in_channels=192,
        audio_acoustic_hidden_dim=64,
        patch_size=2,
        sliding_window=128,
        **({"encoder_hidden_size": enc_width} if enc_width != hidden else {}),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "norm_q" in name or "norm_k" in name or name.endswith("norm_out.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            elif "scale_shift_table" not in name:
                p.normal_(0.0, 0.02)
    model.requires_grad_(False)
    model.to(device, torch.bfloat16 if bf16 else torch.float32)
    # ACE-Step's q/k/v/o (self- and cross-attention) under diffusers' names.
    model.add_adapter(
        LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, init_lora_weights=True,
                   target_modules=["to_q", "to_k", "to_v", "to_out.0"])
    )
    if args.gradient_checkpointing == "on":
        model.enable_gradient_checkpointing()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:  # PEFT makes them in the base's dtype; the trainable state is f32
        p.data = p.data.float()
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)

    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(1, frames, 64, generator=g).to(device)
    ctx = torch.randn(1, frames, 128, generator=g).to(device)
    enc = torch.randn(1, enc_len, enc_width, generator=g).to(device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    base_params = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    lora_params = sum(p.numel() for p in params)
    baseline = rss_bytes()

    times, losses = [], []
    for i in range(args.warmup + args.steps):
        t = torch.tensor([TURBO_T[i % len(TURBO_T)]], device=device)
        sync()
        start = time.perf_counter()
        x1 = torch.randn_like(x0)
        xt = t.view(-1, 1, 1) * x1 + (1 - t.view(-1, 1, 1)) * x0
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            pred = model(hidden_states=xt, timestep=t, timestep_r=t, encoder_hidden_states=enc,
                         context_latents=ctx, return_dict=False)[0]
        loss = torch.nn.functional.mse_loss(pred.float(), (x1 - x0).float())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())  # the step's one read-back, as ours
        sync()
        elapsed = time.perf_counter() - start
        if i >= args.warmup:
            times.append(elapsed)

    peak = peak_rss_bytes()
    med = statistics.median(times)
    report = {
        "impl": "pytorch",
        "preset": args.preset,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dtype": args.dtype,
        "gradient_checkpointing": args.gradient_checkpointing == "on",
        "torch": torch.__version__,
        "blas": blas(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "frames": frames,
        "patches": (frames + 1) // 2,
        "layers": layers,
        "warmup": args.warmup,
        "steps": args.steps,
        "step_times_s": times,
        "median_s_per_step": med,
        "samples_per_sec": 1.0 / med,
        "peak_rss_bytes": peak,
        "model_rss_bytes": baseline,
        "activation_bytes": max(0, peak - baseline),
        "base_parameters": base_params,
        "lora_parameters": lora_params,
        "gpu_allocated_peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "gpu_reserved_peak_bytes": torch.cuda.max_memory_reserved() if cuda else None,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            if k != "step_times_s":
                print(f"{k:24} {v}")


if __name__ == "__main__":
    sys.exit(main())
