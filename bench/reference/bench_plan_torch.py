"""transformers reference for `ostinato bench --preset plan-0.6b`: the 5 Hz LM (0.6B,
Qwen3ForCausalLM, tied embeddings, random weights, f32) planning one 30 s song the way
upstream's pt backend decodes text2music with its default LM guidance (cfg_scale 2):
_generate_with_cfg_custom, both phases: the conditional and unconditional prompts
left-padded into one batch of 2 with an attention mask, the whole sequence fed at the
first forward (logits of every position, as upstream asks), then one token per step
over the KV cache, cfg_logits = uncond + 2 * (cond - uncond), greedy. Token counts are
the Rust preset's (engine/src/bench/plan.rs).

    /work/venv-fixtures/bin/python bench_plan_torch.py --threads 2 [--json]
"""
import argparse
import json
import os
import statistics
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from memory_and_vae import peak_rss_bytes

METADATA_PROMPT, METADATA_TOKENS = (160, 130), 60
CODES_PROMPT, CODES_TOKENS = (230, 200), 151
AUDIO_CODE_0 = 151_669
VOCAB = 217_204
CFG = 2.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", os.cpu_count() or 1)))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, tie_word_embeddings=True, max_position_embeddings=40960,
    )
    model = Qwen3ForCausalLM(config).eval()

    def batch(lengths):
        cond, uncond = (torch.randint(0, AUDIO_CODE_0, (n,)) for n in lengths)
        width = max(lengths)
        ids = torch.zeros((2, width), dtype=torch.long)
        mask = torch.zeros((2, width), dtype=torch.long)
        for row, seq in enumerate((cond, uncond)):
            ids[row, width - len(seq):] = seq
            mask[row, width - len(seq):] = 1
        return ids, mask

    prompts = [batch(METADATA_PROMPT), batch(CODES_PROMPT)]

    def phase(ids, mask, tokens):
        start = time.perf_counter()
        with torch.inference_mode():
            past = None
            for _ in range(tokens):
                if past is None:
                    out = model(input_ids=ids, attention_mask=mask, use_cache=True)
                else:
                    out = model(input_ids=ids[:, -1:], attention_mask=mask, past_key_values=past, use_cache=True)
                logits = out.logits[:, -1, :]
                cfg = logits[1].float() + CFG * (logits[0].float() - logits[1].float())
                nxt = cfg.argmax().view(1, 1).repeat(2, 1)
                ids = torch.cat([ids, nxt], dim=1)
                mask = torch.cat([mask, torch.ones((2, 1), dtype=mask.dtype)], dim=1)
                past = out.past_key_values
        return time.perf_counter() - start

    parts = []
    for i in range(args.warmup + args.steps):
        m = phase(*prompts[0], METADATA_TOKENS)
        c = phase(*prompts[1], CODES_TOKENS)
        if i >= args.warmup:
            parts.append((m, c))
    times = [m + c for m, c in parts]
    report = {
        "preset": "plan-0.6b",
        "impl": f"transformers Qwen3ForCausalLM, torch {torch.__version__}, f32, CFG batch of 2",
        "threads": torch.get_num_threads(),
        "runs_s": times,
        "median_s_per_step": statistics.median(times),
        "metadata_s": statistics.median(m for m, _ in parts),
        "codes_s": statistics.median(c for _, c in parts),
        "peak_rss_bytes": peak_rss_bytes(),
    }
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:20} {v}")


if __name__ == "__main__":
    main()
