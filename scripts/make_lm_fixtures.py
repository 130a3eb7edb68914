"""Tiny random ACE-Step 5 Hz LM folder + what upstream's LLMHandler does with it.

Run through scripts/make-lm-fixtures (it sets up the venv; ACESTEP_SRC must point at a
checkout of ace-step/ACE-Step-1.5). Writes engine/tests/fixtures/lm_tiny/:

  acestep-5Hz-lm-tiny/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json}
  genres_vocab.txt       a small genres vocabulary for the constrained processor's trie
  expected.safetensors   codes, prompt_ids, prompt_logits, step_ids, step_logits,
                         greedy_ids, greedy_ids_genres
  expected.json          prompt, greedy texts and metadata, margins, parser cases, versions

Everything LM-side is upstream's code: the handler is set up by its own initialize()
(backend "pt", device "cpu"), the prompt comes from build_formatted_prompt_for_understanding,
decoding from understand_audio_from_codes and the parser cases from parse_lm_output /
_extract_lyrics_from_output. This script only builds the folder, watches the model's
logits through a forward hook and replays the processor to measure decision margins.
"""

import json
import os
import random
import shutil
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import Qwen3Config, Qwen3ForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "engine", "tests", "fixtures", "lm_tiny")
LM_NAME = "acestep-5Hz-lm-tiny"
LM_DIR = os.path.join(OUT, LM_NAME)
GENRES_PATH = os.path.join(OUT, "genres_vocab.txt")

ACESTEP_SRC = os.environ.get("ACESTEP_SRC")
if not ACESTEP_SRC or not os.path.isdir(os.path.join(ACESTEP_SRC, "acestep")):
    sys.exit("ACESTEP_SRC must name a checkout of ace-step/ACE-Step-1.5 (the folder holding acestep/)")
sys.path.insert(0, ACESTEP_SRC)
os.environ.setdefault("ACESTEP_DISABLE_TQDM", "1")

from acestep.constants import BPM_MAX, BPM_MIN, KEYSCALE_MODES, KEYSCALE_NOTES, VALID_LANGUAGES  # noqa: E402
from acestep.constrained_logits_processor import FSMState, MetadataConstrainedLogitsProcessor  # noqa: E402
from acestep.gpu_config import get_global_gpu_config  # noqa: E402
from acestep.llm_inference import LLMHandler  # noqa: E402

torch.set_grad_enabled(False)

AUDIO_CODES = 65000  # the real vocabulary's count; only codes < 64000 are valid
N_PROMPT_CODES = 40
N_STEPS = 4  # teacher-forced KV-cache steps recorded after the prompt
# Model weights. Seed 27 was picked from a sweep (0-39) as one where both greedy runs walk every
# field, close </think>, write lyrics, and every choice wins by > 1e-3.
SEED = int(os.environ.get("LM_FIXTURE_SEED", "27"))
CODES_SEED = 7
EMBED_STD = float(os.environ.get("LM_FIXTURE_EMBED_STD", "1.0"))
# Gain of the projections that write into the residual stream: large enough that the context,
# not the last token's own (tied) embedding, decides the next token, so greedy runs don't loop.
OUT_GAIN = float(os.environ.get("LM_FIXTURE_OUT_GAIN", "4.0"))
# Larger embeddings for the tokens that hold a newline or a colon: a random model then ends its
# caption line and starts a "name:" line now and then, which walks upstream's FSM through every field.
BOOST = float(os.environ.get("LM_FIXTURE_BOOST", "2.0"))
# Smaller embeddings for the 65000 audio-code tokens: otherwise they outnumber the text tokens so
# much that free text (caption, lyrics) is mostly codes >= 64000, which no processor state blocks.
CODE_SCALE = float(os.environ.get("LM_FIXTURE_CODE_SCALE", "0.5"))
MAX_NEW_TOKENS = int(os.environ.get("LM_FIXTURE_MAX_NEW_TOKENS", "300"))
MIN_MARGIN = 1e-3

GENRES = [
    "pop", "pop rock", "pop punk", "synth pop", "synthwave", "rock", "rock and roll", "indie rock",
    "indie folk", "folk", "folk rock", "jazz", "jazz fusion", "acid jazz", "blues", "blues rock",
    "hip hop", "house", "deep house", "techno", "trance", "ambient", "dream pop", "soul", "neo soul",
    "funk", "disco", "metal", "heavy metal", "lo-fi", "country", "reggae",
]

# Chat template in ChatML form (what Qwen uses), written for minijinja too.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# ---- tokenizer ----
def corpus():
    """Text covering what the 5 Hz LM reads and writes: field lines, keys, languages, lyrics."""
    rng = random.Random(3)
    words = (
        "a warm calm bright dark slow fast gentle driving soft loud female male vocal vocals voice "
        "piano guitar acoustic electric bass drums strings synth pads melody harmony rhythm groove "
        "song track opens with and the of in over under into through night light heart love rain "
        "dream fire road home city sky sea moon sun time world away again together alone forever "
        "energetic melancholic uplifting nostalgic emotional cinematic atmospheric intimate lush "
        "chorus verse bridge hook build drop outro intro instrumental beat tempo feel mood layered"
    ).split()
    keys = [f"{n}{a} {m}" for n in KEYSCALE_NOTES for a in ["", "#", "b", "♯", "♭"] for m in KEYSCALE_MODES]
    lines = [
        "# Instruction\nUnderstand the given musical conditions and describe the audio semantics accordingly:\n\n",
        "# Caption\n", "# Lyric\n", "# Lyrics\n", "[Instrumental]\n",
        "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore.\n",
        " ".join(VALID_LANGUAGES) + "\n",
        " ".join(keys) + "\n",
        ", ".join(GENRES) + "\n",
    ]
    for _ in range(400):
        caption = " ".join(rng.choice(words) for _ in range(rng.randint(6, 16))).capitalize() + "."
        lines.append(
            "<think>\n"
            f"bpm: {rng.randint(BPM_MIN, BPM_MAX)}\n"
            f"caption: {caption}\n"
            f"duration: {rng.randint(10, 600)}\n"
            f"genres: {rng.choice(GENRES)}\n"
            f"keyscale: {rng.choice(keys)}\n"
            f"language: {rng.choice(VALID_LANGUAGES)}\n"
            f"timesignature: {rng.choice([2, 3, 4, 6])}\n"
            "</think>\n"
        )
    for _ in range(150):
        tag = rng.choice(["[Verse]", "[Verse 1]", "[Verse 2]", "[Chorus]", "[Bridge]", "[Intro]", "[Outro]"])
        body = "\n".join(
            " ".join(rng.choice(words) for _ in range(rng.randint(3, 8))).capitalize() for _ in range(rng.randint(2, 4))
        )
        lines.append(f"{tag}\n{body}\n\n")
    return lines


def build_tokenizer(path):
    """Byte-level BPE laid out like Qwen's: BPE vocab, specials, <think>, then the audio codes."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus(), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ["<think>", "</think>"]])
    tok.add_tokens(
        [AddedToken(f"<|audio_code_{c}|>", special=False, normalized=False) for c in range(AUDIO_CODES)]
    )
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"), pretty=False)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "padding_side": "left",
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    return tok.get_vocab_size(with_added_tokens=True)


def check_tokenizer(tokenizer):
    """The layout the Rust side relies on: specials after the BPE, code tokens decode to themselves."""
    first = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    order = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|audio_code_0|>"]
    ids = tokenizer.convert_tokens_to_ids(order)
    assert ids == list(range(first, first + len(order))), ids
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    code0 = ids[-1]
    for c in range(AUDIO_CODES):
        text = f"<|audio_code_{c}|>"
        assert tokenizer.decode([code0 + c]) == text, c
    sample = "<think>\nbpm: 120\nkeyscale: F♯ minor\n</think>\n[Verse]\nla la<|audio_code_12|><|im_end|>"
    assert tokenizer.decode(tokenizer(sample).input_ids) == sample
    return code0


# ---- model ----
def model_config(vocab_size):
    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rope_theta=1000000.0,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        initializer_range=0.2,
        bos_token_id=None,
        eos_token_id=None,
    )
    cfg.architectures = ["Qwen3ForCausalLM"]
    return cfg


def structure_tokens(tokenizer_json):
    """Ids of the BPE tokens whose text holds a newline or a colon (byte-level: 'Ċ' is '\\n')."""
    vocab = json.load(open(tokenizer_json))["model"]["vocab"]
    return sorted(i for t, i in vocab.items() if "Ċ" in t or ":" in t)


def random_state(model, seed, boosted, code0):
    """Random weights with spread-out logits so greedy choices are clear (embeddings are tied)."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, p in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        if name == "model.norm.weight":
            # zero-mean gains: the last token's own embedding no longer votes for itself
            state[name] = torch.randn(p.shape, generator=g)
        elif name.endswith("norm.weight"):
            state[name] = 1.0 + 0.2 * torch.randn(p.shape, generator=g)
        elif name == "model.embed_tokens.weight":
            state[name] = EMBED_STD * torch.randn(p.shape, generator=g)
            state[name][boosted] *= BOOST
            state[name][code0:] *= CODE_SCALE
        else:
            gain = OUT_GAIN if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
            state[name] = gain * torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
    return state


def write_model(path, vocab_size, seed):
    cfg = model_config(vocab_size)
    model = Qwen3ForCausalLM(cfg).eval()
    boosted = structure_tokens(os.path.join(path, "tokenizer.json"))
    code0 = vocab_size - AUDIO_CODES
    model.load_state_dict(random_state(model, seed, boosted, code0), strict=False)
    model.save_pretrained(path, safe_serialization=True)
    # transformers 5 writes rope_parameters only; the real LM folders (transformers 4) carry rope_theta
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        saved = json.load(f)
    saved["rope_theta"] = cfg.rope_parameters["rope_theta"]
    with open(config_path, "w") as f:
        json.dump(saved, f, indent=2)
    return model


def check_reload(model, path):
    """The saved folder has the tensors the brief names (lm_head tied, not stored) and reloads equal."""
    stored = load_file(os.path.join(path, "model.safetensors"))
    assert "lm_head.weight" not in stored, "tied lm_head must not be stored"
    for name, value in model.state_dict().items():
        if name != "lm_head.weight":
            assert torch.equal(stored[name], value), name
    reloaded = Qwen3ForCausalLM.from_pretrained(path).eval()
    assert torch.equal(reloaded.lm_head.weight, stored["model.embed_tokens.weight"])


# ---- upstream's handler ----
def make_handler():
    """LLMHandler as its initialize() leaves it for the "pt" backend on the CPU."""
    handler = LLMHandler()
    status, ok = handler.initialize(checkpoint_dir=OUT, lm_model_path=LM_NAME, backend="pt", device="cpu")
    assert ok and handler.llm_backend == "pt", status
    return handler


def use_genres_vocab(handler, path):
    """The shared processor made as initialize() makes it, reading genres from `path`."""
    handler.constrained_processor = MetadataConstrainedLogitsProcessor(
        tokenizer=handler.llm_tokenizer,
        enabled=True,
        debug=False,
        max_duration=get_global_gpu_config().max_duration_with_lm,
        genres_vocab_path=path,
    )


def prompt_codes():
    rng = random.Random(CODES_SEED)
    return [rng.randrange(64000) for _ in range(N_PROMPT_CODES)]


def codes_string(codes):
    return "".join(f"<|audio_code_{c}|>" for c in codes)


def prompt_ids(handler, prompt):
    """The ids _run_pt_single feeds the model."""
    inputs = handler.llm_tokenizer(prompt, return_tensors="pt", padding=False, truncation=True)
    return inputs["input_ids"]


def teacher_forced_logits(model, ids, next_ids):
    """Logits at the prompt's last position, then after each of next_ids fed with the KV cache."""
    out = model(input_ids=ids, use_cache=True)
    prompt_logits = out.logits[0, -1].clone()
    cache = out.past_key_values
    steps = []
    for t in next_ids:
        out = model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        steps.append(out.logits[0, -1].clone())
    return prompt_logits, torch.stack(steps)


class LogitsRecorder:
    """Forward hook on the model: the raw last-position logits of every forward in a run."""

    def __init__(self, model):
        self.logits = []
        self.handle = model.register_forward_hook(self.hook)

    def hook(self, module, args, output):
        self.logits.append(output.logits[0, -1].clone())

    def close(self):
        self.handle.remove()


def understand(handler, codes_str):
    """upstream's understand_audio_from_codes at temperature 0; returns ids, raw logits, metadata."""
    captured = {}
    original = handler._generate_with_constrained_decoding

    def keep_ids(*args, **kwargs):
        out = original(*args, **kwargs)
        captured["prompt_len"] = kwargs["input_ids"].shape[1]
        captured["ids"] = out[0].tolist()
        return out

    handler._generate_with_constrained_decoding = keep_ids
    recorder = LogitsRecorder(handler.llm)
    try:
        metadata, status = handler.understand_audio_from_codes(codes_str, temperature=0.0)
    finally:
        recorder.close()
        del handler._generate_with_constrained_decoding
    assert status.startswith("✅"), status
    generated = captured["ids"][captured["prompt_len"]:]
    assert len(recorder.logits) == len(generated)
    return generated, recorder.logits, metadata


def space_class(tokenizer):
    """Per token: does its decoded text start a caption continuation (empty, space or tab first)?"""
    flags = torch.zeros(len(tokenizer), dtype=torch.bool)
    for t in range(len(tokenizer)):
        text = tokenizer.decode([t])
        flags[t] = len(text) == 0 or text[0] in " \t"
    return flags


def gap(scores):
    """Best minus runner-up among finite scores; None when at most one token is left."""
    finite = scores[torch.isfinite(scores)]
    if finite.numel() < 2:
        return None
    top = torch.topk(finite, 2).values
    return float(top[0] - top[1])


def replay_margins(handler, generated, raw_logits, space_first):
    """Rerun the processor on the recorded logits (same calls as the decoding loop) and measure,
    at every step, how clearly each logit-dependent choice was made: the greedy pick among the
    allowed tokens and the processor's own decisions (caption end after a newline, the language's
    top-1 first token, the genres fallback's newline test)."""
    proc = handler.constrained_processor
    proc.reset()
    proc.set_generation_phase("understand")  # the rest of the settings stay as the run left them
    ids = torch.tensor([[0]])  # the processor reads input_ids only in the "codes" phase
    margins, states = [], []
    for step, (token, raw) in enumerate(zip(generated, raw_logits)):
        state = proc.state
        states.append(state.name)
        decision = None
        if state == FSMState.CAPTION_VALUE and proc.caption_after_newline:
            best = int(torch.argmax(raw))
            other = raw.masked_fill(space_first == space_first[best], float("-inf"))
            decision = float(raw[best] - other.max())
        elif state == FSMState.LANGUAGE_VALUE and not proc.accumulated_token_ids:
            candidates = sorted(proc.language_prefix_tree.get((), ()))
            decision = gap(raw[candidates]) if len(candidates) > 1 else None
        elif state == FSMState.GENRES_VALUE and not proc.genres_vocab and proc.accumulated_value.strip():
            others = raw.clone()
            others[proc.newline_token] = float("-inf")
            decision = abs(float(raw[proc.newline_token] - others.max()))
        scores = proc(ids, raw.clone().unsqueeze(0))[0]
        assert int(torch.argmax(scores)) == token, f"replay disagrees at step {step}"
        pick = gap(scores)
        proc.update_state(token)
        known = [m for m in (pick, decision) if m is not None]
        margins.append(min(known) if known else None)  # None: the processor left one token
    return margins, states


def stop_reason(tokenizer, generated):
    last = generated[-1] if generated else None
    if last == tokenizer.eos_token_id:
        return "eos <|im_end|>"
    if last == tokenizer.pad_token_id:
        return "pad <|endoftext|> (the loop stops on it too)"
    return "max_new_tokens"


def run_summary(tokenizer, generated, metadata, margins, states):
    text = tokenizer.decode(generated, skip_special_tokens=False)
    fields = [f for f in ["bpm", "caption", "duration", "genres", "keyscale", "language", "timesignature"] if f in metadata]
    think_end = tokenizer.convert_tokens_to_ids("</think>")
    after = generated[generated.index(think_end) + 1:] if think_end in generated else []
    return {
        "text": text,
        "metadata": metadata,
        "n_tokens": len(generated),
        "fields": fields,
        "closed_think": think_end in generated,
        "tokens_after_think": len(after),
        "stopped_by": stop_reason(tokenizer, generated),
        "min_margin": min(m for m in margins if m is not None),
        "states_visited": sorted(set(states), key=states.index),
        "margins": margins,
    }


# LM outputs shaped like upstream's, well-formed and not, for its parser.
PARSER_TEXTS = {
    "well_formed": (
        "<think>\nbpm: 120\ncaption: A bright pop song with piano.\nduration: 180\ngenres: pop rock\n"
        "keyscale: F# minor\nlanguage: en\ntimesignature: 4\n</think>\n\n[Verse]\nHold the light\n<|im_end|>"
    ),
    "no_think_end": "<think>\nbpm: 96\ncaption: A slow ballad\nduration: 21",
    "no_think_at_all": (
        "bpm: 88\ncaption: Warm lo-fi beat\nkeyscale: Bb major\n\n[Verse]\nShe said: stay\n"
        "Duration: 45\n</think>\nafter the tag"
    ),
    "yaml_multiline_caption": (
        "<think>\nbpm: 72\ncaption: An emotional ballad.\n  The track opens with piano,\n\tthen strings "
        "join.\n   \nduration: 200\n</think>\n"
    ),
    "caption_on_next_lines": "<think>\ncaption:\n  soft synth pads\n  and a slow beat\ngenres:\nlanguage: ja\n</think>",
    "bad_numbers": "<think>\nbpm: N/A\nduration: 12O\ntimesignature: 3/4\n</think>\n",
    "duplicated_fields": "<think>\nbpm: 100\nbpm: 128\ncaption: first\ncaption: second\n</think>\nla la",
    "unknown_fields": (
        "<think>\nmood: happy\nbpm: 140\ntempo: fast\n  still tempo\n<note>: skipped\n"
        "caption: Intro: soft piano\n</think>\n# Lyric\n[Intro]\nhum"
    ),
    "lyric_header": "<think>\nbpm: 90\n</think>\n# Lyric\n[Verse 1]\nline one\n\n[Chorus]\nline two\n",
    "lyrics_header_plural": "<think>\nbpm: 90\n</think>\n#Lyrics\n[Verse]\nline one",
    "header_variants": "<think>\nbpm: 91\n</think>\n  # lyri\nfirst\n# Lyric\nsecond",
    "trailing_im_end": "<think>\nlanguage: zh\n</think>\n[Verse]\nend here<|im_end|>  \n",
    "im_end_mid_lyrics": "<think>\nlanguage: ko\n</think>\none<|im_end|>two<|endoftext|>",
    "lyrics_blank_lines": "<think>\nbpm: 60\n</think>\n\n\n[Verse]\n\nfirst\n\n\n[Bridge]\nsecond\n\n",
    "reasoning_tags": "<reasoning>\nbpm: 110\nkeyscale: E minor\n</reasoning>\n</think>\ntail",
    "empty": "",
    "think_only": "<think>\n</think>",
    "extra_spaces": (
        "<think>\nBPM :  96  \n  bpm: 97\ncaption:   Spaced   out   \nkeyscale:   C   major  \n"
        "Language : en \ntimesignature:4\n</think>   \n   [Verse]   \n"
    ),
    "crlf": (
        "<think>\r\nbpm: 120\r\ncaption: A rock song\r\n  with drums\r\nduration: 30\r\n"
        "genres: rock\r\n</think>\r\n# Lyric\r\n[Verse]\r\nline\r\n"
    ),
    "audio_codes_after_think": "<think>\nbpm: 75\n</think>\n<|audio_code_5|><|audio_code_63999|>",
}


def parser_cases(handler):
    """upstream's parse_lm_output metadata and _extract_lyrics_from_output for each text."""
    cases = []
    for name, text in PARSER_TEXTS.items():
        metadata, _ = handler.parse_lm_output(text)
        cases.append({"name": name, "text": text, "metadata": metadata, "lyrics": handler._extract_lyrics_from_output(text)})
    return cases


def coverage(key, summary):
    return (
        f"{key}: {summary['n_tokens']} tokens; FSM states visited {', '.join(summary['states_visited'])}; "
        f"parsed fields {', '.join(summary['fields'])}; {summary['tokens_after_think']} lyric tokens after </think>; "
        f"stopped by {summary['stopped_by']}; min margin {summary['min_margin']:.3e}"
    )


def notes(runs):
    return [
        "Random Qwen3ForCausalLM shaped so greedy decoding walks upstream's FSM (it means nothing): "
        "embeddings N(0, embed_std^2), BPE tokens holding a newline or colon x boost, audio-code tokens "
        "x code_scale, final norm gains N(0, 1) (zero mean), o_proj/down_proj x out_gain; seed picked "
        "from a sweep.",
        "Handler: upstream's LLMHandler.initialize(checkpoint_dir=lm_tiny, lm_model_path=" + LM_NAME + ", "
        "backend='pt', device='cpu'); max_duration is gpu_config's max_duration_with_lm on this CPU-only "
        "machine. Each run then replaces constrained_processor with one made as initialize() makes it "
        "plus genres_vocab_path.",
        "greedy: genres_vocab_path names a missing file (upstream's acestep/genres_vocab.txt is not "
        "shipped here), so genres is free text ended by _should_end_text_field. That branch moves the FSM "
        "to KEYSCALE_NAME inside __call__; update_state then counts the forced newline as the first "
        "character of 'keyscale:', the line comes out as 'eyscale: ...' and parse_lm_output has no keyscale.",
        "greedy_genres: genres_vocab.txt; the trie compares lowercased token text, so the value keeps the "
        f"tokens' own case ({runs['genres'][1]['metadata'].get('genres')!r}).",
        "Tokens <|audio_code_64000|>..<|audio_code_64999|> exist but are not valid codes: the processor's "
        "audio-code masks cover 0..63999 only, so they are not blocked in the caption or the lyrics.",
        "margins[i] (per generated token): the smaller of best minus runner-up among the tokens the "
        "processor left, and the margin of a logit-based decision the processor made at that step "
        "(after a caption newline: raw argmax against the best token of the other leading-space class; "
        "language: top-1 among the first-token candidates; genres fallback: newline against the best "
        "other token); null where it left one token and decided nothing.",
        "step_ids: the first greedy ids; step_logits[i]: the logits after feeding step_ids[i] with the "
        "KV cache of the prompt and step_ids[:i].",
        coverage("greedy", runs["plain"][1]),
        coverage("greedy_genres", runs["genres"][1]),
    ]


def upstream_commit():
    try:
        return subprocess.check_output(
            ["git", "-C", ACESTEP_SRC, "rev-parse", "HEAD"], stderr=subprocess.DEVNULL, text=True
        ).strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return os.environ.get("ACESTEP_COMMIT", "f30aee4")


def main():
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    with open(GENRES_PATH, "w") as f:
        f.write("# genres for the tiny LM fixture, one a line\n" + "\n".join(GENRES) + "\n")

    vocab_size = build_tokenizer(LM_DIR)
    model = write_model(LM_DIR, vocab_size, SEED)
    check_reload(model, LM_DIR)

    handler = make_handler()
    tokenizer = handler.llm_tokenizer
    assert len(tokenizer) == vocab_size
    code0 = check_tokenizer(tokenizer)
    model = handler.llm
    model.config.max_new_tokens = MAX_NEW_TOKENS

    codes = prompt_codes()
    codes_str = codes_string(codes)
    prompt = handler.build_formatted_prompt_for_understanding(codes_str)
    ids = prompt_ids(handler, prompt)

    space_first = space_class(tokenizer)
    runs, loop_logits = {}, {}
    for key, vocab_path in [("plain", os.path.join(OUT, "no-such-genres-vocab.txt")), ("genres", GENRES_PATH)]:
        use_genres_vocab(handler, vocab_path)
        generated, raw_logits, metadata = understand(handler, codes_str)
        margins, states = replay_margins(handler, generated, raw_logits, space_first)
        runs[key] = (generated, run_summary(tokenizer, generated, metadata, margins, states))
        loop_logits[key] = raw_logits
        summary = runs[key][1]
        print(
            f"{key}: {summary['n_tokens']} tokens, fields {summary['fields']}, closed </think> {summary['closed_think']}, "
            f"{summary['tokens_after_think']} after, stopped by {summary['stopped_by']}, min margin {summary['min_margin']:.3e}"
        )
        print(repr(summary["text"][:600]))

    step_ids = runs["plain"][0][:N_STEPS]
    prompt_logits, step_logits = teacher_forced_logits(model, ids, step_ids)
    # the same numbers upstream's decoding loop saw (its forward passes carry an attention mask)
    seen = torch.stack(loop_logits["plain"][: N_STEPS + 1])
    err = (torch.cat([prompt_logits[None], step_logits]) - seen).abs().max().item()
    print(f"teacher-forced vs decoding-loop logits: max |diff| {err:.2e}")
    assert err < 1e-4, err

    tensors = {
        "codes": torch.tensor(codes, dtype=torch.int64),
        "prompt_ids": ids[0].to(torch.int64),
        "prompt_logits": prompt_logits.float().contiguous(),
        "step_ids": torch.tensor(step_ids, dtype=torch.int64),
        "step_logits": step_logits.float().contiguous(),
        "greedy_ids": torch.tensor(runs["plain"][0], dtype=torch.int64),
        "greedy_ids_genres": torch.tensor(runs["genres"][0], dtype=torch.int64),
    }
    save_file(tensors, os.path.join(OUT, "expected.safetensors"))
    expected = {
        "prompt": prompt,
        "codes_string": codes_str,
        "audio_code_0_id": code0,
        "max_new_tokens": MAX_NEW_TOKENS,
        "max_duration": handler.constrained_processor.max_duration,
        "temperature": 0.0,
        "seed": SEED,
        "embed_std": EMBED_STD,
        "boost": BOOST,
        "code_scale": CODE_SCALE,
        "out_gain": OUT_GAIN,
        "greedy": runs["plain"][1],
        "greedy_genres": runs["genres"][1],
        "min_margin": min(runs["plain"][1]["min_margin"], runs["genres"][1]["min_margin"]),
        "notes": notes(runs),
        "parser_cases": parser_cases(handler),
        "upstream": {"repo": "ace-step/ACE-Step-1.5", "commit": upstream_commit()},
        "versions": {
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "tokenizers": __import__("tokenizers").__version__,
            "python": sys.version.split()[0],
        },
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)

    total = 0
    for dirpath, _, files in os.walk(OUT):
        for name in sorted(files):
            size = os.path.getsize(os.path.join(dirpath, name))
            total += size
            print(f"{os.path.relpath(os.path.join(dirpath, name), OUT)}: {size / 1e6:.2f} MB")
    print(f"total {total / 1e6:.2f} MB; vocab {vocab_size}; prompt {ids.shape[1]} tokens")


if __name__ == "__main__":
    main()
