"""Runs of upstream's MetadataConstrainedLogitsProcessor, understand settings, over made-up logits.

Run with the reference venv, ACESTEP_SRC naming a checkout of ace-step/ACE-Step-1.5:
    ACESTEP_SRC=/work/acestep-src /work/refvenv/bin/python scripts/make_lm_constraint_fixture.py
Writes engine/tests/fixtures/lm_tiny/constraint_cases.json, which
engine/tests/understand_constraint.rs replays.

No LM: each step's logits come from a formula the Rust test reproduces bit for bit (an integer
hash of (seed, step, token id) mapped to a multiple of 2^-20 in [-8, 8), then per-token biases
added in f32, first the run's own, then the step's), the processor masks them, the argmax
(first index on ties, as torch) is taken and fed to update_state. The processor is made as
LLMHandler.initialize makes it (plus a genres vocabulary path) and set up by upstream's own
_setup_constrained_processor with understand_audio_from_codes's arguments.

Also recorded: the tokenizer's size and a hash per block of token ids of decode([id]) (the
Rust side's decode must agree), and upstream's value prefix trees.
"""

import json
import os
import sys

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURE = os.path.join(ROOT, "engine", "tests", "fixtures", "lm_tiny")
LM_DIR = os.path.join(FIXTURE, "acestep-5Hz-lm-tiny")
GENRES_PATH = os.path.join(FIXTURE, "genres_vocab.txt")
OUT = os.path.join(FIXTURE, "constraint_cases.json")

ACESTEP_SRC = os.environ.get("ACESTEP_SRC")
if not ACESTEP_SRC or not os.path.isdir(os.path.join(ACESTEP_SRC, "acestep")):
    sys.exit("ACESTEP_SRC must name a checkout of ace-step/ACE-Step-1.5 (the folder holding acestep/)")
sys.path.insert(0, ACESTEP_SRC)

from transformers import AutoTokenizer  # noqa: E402

from acestep.constrained_logits_processor import MetadataConstrainedLogitsProcessor  # noqa: E402
from acestep.llm_inference import LLMHandler  # noqa: E402

MASK64 = (1 << 64) - 1
K_SEED, K_STEP, K_TOKEN = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
HASH_BLOCK = 4096


def base_scores(seed, step, vocab_size):
    """splitmix64's finalizer of seed*K_SEED ^ step*K_STEP ^ id*K_TOKEN; top 24 bits -> [-8, 8)."""
    with np.errstate(over="ignore"):
        x = np.arange(vocab_size, dtype=np.uint64) * np.uint64(K_TOKEN)
        x ^= np.uint64((seed * K_SEED) & MASK64) ^ np.uint64((step * K_STEP) & MASK64)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    top = (x >> np.uint64(40)).astype(np.int64) - (1 << 23)
    return top.astype(np.float32) / np.float32(1 << 20)


def scores_for(run, step, vocab_size):
    base = base_scores(run["seed"], step, vocab_size)
    if run["quantum"]:
        # Coarse steps make ties everywhere: torch's argmax and upstream's set orders break them.
        q = np.float32(run["quantum"])
        base = np.floor(base / q) * q
    s = torch.from_numpy(base)
    for token, bias in run["bias"]:
        s[token] = s[token] + torch.tensor(bias, dtype=torch.float32)
    for at, token, bias in run["step_bias"]:
        if at == step:
            s[token] = s[token] + torch.tensor(bias, dtype=torch.float32)
    return s.unsqueeze(0)


class Handler:
    """What _setup_constrained_processor reads of an LLMHandler."""

    def __init__(self, processor):
        self.constrained_processor = processor


def make_processor(tok, run):
    genres = GENRES_PATH if run["genres"] else os.path.join(FIXTURE, "no_such_genres_vocab.txt")
    proc = MetadataConstrainedLogitsProcessor(
        tokenizer=tok, enabled=True, debug=False, max_duration=run["max_duration"], genres_vocab_path=genres
    )
    # understand_audio_from_codes's settings, through upstream's own setup.
    return LLMHandler._setup_constrained_processor(
        Handler(proc),
        use_constrained_decoding=True,
        constrained_decoding_debug=False,
        target_duration=None,
        user_metadata=None,
        stop_at_reasoning=False,
        skip_genres=False,
        skip_caption=False,
        skip_language=False,
        generation_phase="understand",
        is_batch=False,
    )


def replay(tok, proc, run):
    """The chosen ids, the state before each step and whether the caption had just had a newline."""
    ids, states, after_newline = [], [], []
    vocab_size = len(tok)
    for step in range(run["steps"]):
        states.append(proc.state.name)
        after_newline.append(proc.caption_after_newline)
        scores = proc(torch.zeros(1, 1, dtype=torch.long), scores_for(run, step, vocab_size))
        token = int(torch.argmax(scores[0]).item())
        ids.append(token)
        proc.update_state(token)
    return ids, states, after_newline


def set_orders():
    """list(s) after s.add(x) for each x of a few id sequences (some colliding in the table)."""
    rng = np.random.default_rng(11)
    cases = []
    for n in [3, 5, 19, 51, 77, 400]:
        adds = [int(x) for x in rng.integers(0, 66000, n)]
        cases.append(adds)
        cases.append([int(x) * 128 + 7 for x in rng.integers(0, 500, n)])
    cases.append([5, 5, 13, 5, 21, 0, 8])
    out = []
    for adds in cases:
        s = set()
        for x in adds:
            s.add(x)
        out.append({"adds": adds, "order": list(s)})
    return out


def fnv1a(data, h=0xCBF29CE484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def decode_hashes(tok):
    hashes = []
    for start in range(0, len(tok), HASH_BLOCK):
        h = 0xCBF29CE484222325
        for i in range(start, min(start + HASH_BLOCK, len(tok))):
            h = fnv1a(tok.decode([i]).encode("utf-8") + b"\xff", h)
        hashes.append(f"{h:016x}")
    return hashes


def tree_json(tree):
    return sorted([list(prefix), sorted(int(t) for t in nxt)] for prefix, nxt in tree.items())


def token_ids(tok, pred):
    return [i for i in range(len(tok)) if pred(tok.decode([i]))]


def main():
    tok = AutoTokenizer.from_pretrained(LM_DIR, use_fast=True)
    newline = tok.encode("\n", add_special_tokens=False)[-1]
    has_newline = token_ids(tok, lambda t: "\n" in t)
    has_colon = token_ids(tok, lambda t: ":" in t)
    spaced = token_ids(tok, lambda t: t.startswith(" "))
    digits = token_ids(tok, lambda t: t.strip().isdigit())
    nl = lambda b: [[t, b] for t in has_newline]  # noqa: E731
    think_end = tok.convert_tokens_to_ids("</think>")
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731

    runs = [
        dict(quantum=0, name="plain", seed=1, steps=300, genres=False, max_duration=180, bias=[], step_bias=[]),
        # The caption reaches its 512-token cap (step 522 forces the newline); a colon at step 535
        # ends the free "field name" that follows.
        dict(quantum=0, name="caption_cap", seed=2, steps=620, genres=False, max_duration=600,
             bias=[[t, -3.0] for t in has_newline], step_bias=[[535, enc(":")[0], 30.0]]),
        dict(quantum=0, name="newlines", seed=3, steps=300, genres=False, max_duration=180, bias=nl(6.0), step_bias=[]),
        dict(quantum=0, name="newlines_genres", seed=4, steps=300, genres=True, max_duration=180, bias=nl(6.0), step_bias=[]),
        dict(quantum=0, name="indented_caption", seed=5, steps=300, genres=True, max_duration=600,
             bias=nl(5.0) + [[t, 2.0] for t in spaced], step_bias=[]),
        dict(quantum=0, name="digits_genres", seed=6, steps=300, genres=True, max_duration=240,
             bias=nl(4.0) + [[t, 3.0] for t in digits] + [[newline, 2.0]], step_bias=[]),
        dict(quantum=0, name="colons", seed=7, steps=300, genres=False, max_duration=180,
             bias=nl(4.0) + [[t, 3.0] for t in has_colon], step_bias=[]),
    ]
    # Captions that end in a known field name, written right after the caption's first newline:
    # the FSM goes straight to that field's value.
    for base, name, field in [(2, "caption_to_keyscale", "keyscale:"), (3, "caption_to_genres", "Genres:")]:
        _, states, after = replay(tok, make_processor(tok, runs[base]), runs[base])
        at = next(i for i in range(len(states)) if states[i] == "CAPTION_VALUE" and after[i])
        step_bias = [[at + k, t, 30.0] for k, t in enumerate(enc(field))]
        runs.append({**runs[base], "name": name, "step_bias": step_bias})
    runs += [
        dict(name="ties", seed=8, steps=300, genres=False, max_duration=180, quantum=4.0, bias=nl(8.0), step_bias=[]),
        dict(name="ties_genres", seed=9, steps=300, genres=True, max_duration=180, quantum=4.0, bias=nl(8.0),
             step_bias=[]),
    ]
    cases = []
    for run in runs:
        ids, states, _ = replay(tok, make_processor(tok, run), run)
        visited = list(dict.fromkeys(states))
        print(f"{run['name']}: {len(ids)} steps, states {' '.join(visited)}")
        print("   ", repr(tok.decode(ids))[:400])
        cases.append({**run, "ids": ids, "states": states})

    proc = make_processor(tok, runs[0])
    trees = {
        "bpm": tree_json(proc.bpm_prefix_tree),
        "duration": tree_json(proc.duration_prefix_tree),
        "keyscale": tree_json(proc.keyscale_prefix_tree),
        "language": tree_json(proc.language_prefix_tree),
        "timesignature": tree_json(proc.timesig_prefix_tree),
    }
    out = {
        "formula": {
            "hash": "x = id*K_TOKEN ^ seed*K_SEED ^ step*K_STEP (u64, wrapping); splitmix64 finalizer "
            "(x ^= x>>30; x *= 0xBF58476D1CE4E5B9; x ^= x>>27; x *= 0x94D049BB133111EB; x ^= x>>31); "
            "score = f32((x>>40) - 2^23) / 2^20; where quantum > 0: floor(score / quantum) * quantum; then + each [token, bias] of bias, then of step_bias "
            "at that step, in order, in f32",
            "k_seed": f"{K_SEED:#x}", "k_step": f"{K_STEP:#x}", "k_token": f"{K_TOKEN:#x}",
        },
        "vocab_size": len(tok),
        "newline": newline,
        "decode_hash_block": HASH_BLOCK,
        "decode_hashes": decode_hashes(tok),
        "trees_max_duration": runs[0]["max_duration"],
        "trees": trees,
        "language_first_tokens": [int(t) for t in proc.language_prefix_tree[()]],
        "set_orders": set_orders(),
        "runs": cases,
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
    }
    with open(OUT, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()
