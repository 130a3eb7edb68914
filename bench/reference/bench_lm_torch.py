"""transformers reference for `ostinato bench --preset lm-0.6b` / `lm-1.7b`: the 5 Hz LM
(Qwen3ForCausalLM, the real sizes, tied embeddings, random weights, f32) labelling one
4-minute song: a 1240-token prompt prefilled, then greedy decoding over the KV cache
(model(...) with past_key_values) to 200 new tokens, on the CPU.

One invocation measures one configuration (peak RSS is per process):

    /work/refvenv/bin/python bench_lm_torch.py --preset lm-0.6b --threads 2 [--json]

Prefill asks for the last position's logits only (logits_to_keep=1, as generate() does);
every step computes the full vocabulary's, as ours does.
"""
import argparse
import json
import os
import statistics
import time

import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM
from memory_and_vae import peak_rss_bytes, rss_bytes

PRESETS = {"lm-0.6b": (1024, 3072), "lm-1.7b": (2048, 6144)}
PROMPT_TOKENS = 1240
NEW_TOKENS = 200
VOCAB = 217204


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", os.cpu_count() or 1)))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    hidden, inter = PRESETS[args.preset]
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
    )
    model = Qwen3ForCausalLM(config).eval()
    params = sum(p.numel() for p in model.parameters())
    prompt = torch.randint(0, VOCAB, (1, PROMPT_TOKENS))

    def song():
        with torch.inference_mode():
            start = time.perf_counter()
            cache = DynamicCache(config=config)
            out = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
            ids = [int(out.logits[0, -1].argmax())]
            prefill = time.perf_counter() - start
            start = time.perf_counter()
            while len(ids) < NEW_TOKENS:
                out = model(input_ids=torch.tensor([[ids[-1]]]), past_key_values=cache, use_cache=True)
                ids.append(int(out.logits[0, -1].argmax()))
            return prefill, time.perf_counter() - start

    baseline = rss_bytes()
    parts = []
    for i in range(args.warmup + args.steps):
        p, d = song()
        if i >= args.warmup:
            parts.append((p, d))
    times = [p + d for p, d in parts]
    decode = statistics.median(d for _, d in parts)
    peak = peak_rss_bytes()
    report = {
        "preset": args.preset,
        "impl": f"transformers Qwen3ForCausalLM, torch {torch.__version__}, f32, sdpa",
        "threads": torch.get_num_threads(),
        "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": NEW_TOKENS,
        "runs_s": times,
        "median_s_per_step": statistics.median(times),
        "prefill_s": statistics.median(p for p, _ in parts),
        "decode_s": decode,
        "decode_tokens_per_s": (NEW_TOKENS - 1) / decode,
        "parameters": params,
        "weight_bytes": params * 4,
        "peak_rss_bytes": peak,
        "model_rss_bytes": baseline,
        "above_weights_bytes": peak - params * 4,
    }
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:24} {v}")


if __name__ == "__main__":
    main()
