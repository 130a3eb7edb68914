"""5 Hz audio codes -> 25 Hz hints (ACE-Step's detokenizer) for the tiny model folders,
and a song conditioned on them (see make-hints-fixtures).

Not run in CI; the files it writes are committed. Run it after make-real-fixtures and
make-xl-model-fixtures (they rewrite the weights it adds to):

  real/model/acestep-v15-turbo/model.safetensors
      gains `tokenizer.*` and `detokenizer.*` (random, at the 2B sizes: the 2B fixture
      had no audio tokenizer); every tensor already there is kept as it was
  real_xl/model/acestep-v15-xl-turbo/model-00002-of-00002.safetensors (+ index)
      gains `detokenizer.*` at the encoder_* sizes, as XL builds its (de)tokenizer
  real/hints.safetensors, real_xl/hints.safetensors
      codes (fixed ids, the codebook's ends among them), the quantizer's output for them
      (vector_quantize_pytorch's ResidualFSQ.get_output_from_indices with the checkpoint's
      projections, as upstream's handler calls it) and the detokenizer's hints (diffusers
      0.42.1 AceStepAudioTokenDetokenizer)
  real/hints_song.safetensors + .json
      diffusers' AceStepPipeline given those codes on the 2B tiny model (turbo, 8 steps,
      shift 3, given noise), as make_real_fixtures.py --text2music: the context latents
      its DiT gets, the condition, and the latents. With codes the pipeline turns
      text2music into cover, as upstream's handler does: the cover instruction, the
      hints as source latents, a ones chunk mask, 5 frames per code.
"""

import importlib.metadata
import json
import math
import os
import platform

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from diffusers.pipelines.ace_step.modeling_ace_step import AceStepAudioTokenDetokenizer, AceStepAudioTokenizer
from vector_quantize_pytorch import ResidualFSQ

from make_real_fixtures import LATENT, META, diffusers_names, original_names, randomize, tiny_pipeline

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FIXTURES = os.path.join(ROOT, "engine", "tests", "fixtures")
MODELS = {
    "real": os.path.join(FIXTURES, "real", "model", "acestep-v15-turbo"),
    "real_xl": os.path.join(FIXTURES, "real_xl", "model", "acestep-v15-xl-turbo"),
}
LEVELS = [8, 8, 8, 5, 5, 5]
# 9 codes: both ends of the codebook, each level's ends, and a spread between.
CODES = [0, 63999, 7, 56, 448, 2240, 11200, 31415, 52001]
torch.set_grad_enabled(False)


def encoder_sizes(cfg):
    """The (de)tokenizer's sizes: the condition encoder's (XL's encoder_*)."""
    e = lambda k: cfg.get("encoder_" + k, cfg[k])
    return dict(hidden_size=e("hidden_size"), intermediate_size=e("intermediate_size"),
                num_attention_heads=e("num_attention_heads"), num_key_value_heads=e("num_key_value_heads"),
                head_dim=cfg["head_dim"], rope_theta=cfg["rope_theta"], rms_norm_eps=cfg["rms_norm_eps"],
                sliding_window=cfg["sliding_window"], layer_types=cfg["layer_types"],
                num_attention_pooler_hidden_layers=cfg.get("num_attention_pooler_hidden_layers", 2),
                audio_acoustic_hidden_dim=cfg["audio_acoustic_hidden_dim"],
                pool_window_size=cfg.get("pool_window_size", 5))


def weight_files(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        return sorted(set(json.load(open(index))["weight_map"].values()))
    return ["model.safetensors"]


def read_weights(folder):
    out = {}
    for name in weight_files(folder):
        out.update(load_file(os.path.join(folder, name)))
    return out


def add_weights(folder, new):
    """`new` written into the folder's last weight file (and its index), the tensors
    already there untouched."""
    name = weight_files(folder)[-1]
    path = os.path.join(folder, name)
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    state = load_file(path)
    state.update({k: v.contiguous() for k, v in new.items()})
    save_file(state, path, metadata=metadata)
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        doc = json.load(open(index))
        doc["weight_map"].update({k: name for k in new})
        doc["weight_map"] = dict(sorted(doc["weight_map"].items()))
        with open(index, "w") as f:
            json.dump(doc, f, indent=2)


def build(folder, seed):
    """The folder's tokenizer and detokenizer, made (random) where its weights lack them."""
    cfg = json.load(open(os.path.join(folder, "config.json")))
    sizes = encoder_sizes(cfg)
    tokenizer = AceStepAudioTokenizer(fsq_dim=sizes["hidden_size"], fsq_input_levels=LEVELS,
                                      fsq_input_num_quantizers=1, **sizes).eval()
    detokenizer = AceStepAudioTokenDetokenizer(**sizes).eval()
    weights = read_weights(folder)
    torch.manual_seed(seed)
    new = {}
    for prefix, module in [("tokenizer.", tokenizer), ("detokenizer.", detokenizer)]:
        if not any(k.startswith(prefix) for k in weights):
            randomize(module, 0.3)
            with torch.no_grad():
                for name, p in module.named_parameters():
                    if name == "special_tokens":  # randomize's generator is fixed: set apart from embed_tokens
                        p.copy_(torch.randn(p.shape) * 0.5)
            new.update(original_names(module.state_dict(), prefix))
    if new:
        add_weights(folder, new)
        weights = read_weights(folder)
        print(f"{folder}: added {len(new)} tensors ({sorted({k.split('.')[0] for k in new})})")
    part = lambda prefix: diffusers_names({k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)})
    tokenizer.load_state_dict(part("tokenizer."), strict=True)
    detokenizer.load_state_dict(part("detokenizer."), strict=True)
    return tokenizer, detokenizer


def upstream_quantizer_output(tokenizer, codes):
    """What upstream's handler gets: vector_quantize_pytorch's ResidualFSQ with the
    checkpoint's projections, get_output_from_indices of [1, N, 1] indices."""
    q = tokenizer.quantizer
    fsq = ResidualFSQ(dim=q.project_in.in_features, levels=LEVELS, num_quantizers=1).eval()
    fsq.load_state_dict({k: v for k, v in q.state_dict().items() if k.startswith("project_")})
    indices = torch.tensor(codes, dtype=torch.long)[None, :, None]
    out = fsq.get_output_from_indices(indices)
    mine = q.get_output_from_indices(indices)
    err = float((out - mine).abs().max())
    print(f"quantizer output, vector_quantize_pytorch vs diffusers: max abs {err:.2e}")
    assert err < 1e-5
    return out


def hints_fixture(name, seed):
    tokenizer, detokenizer = build(MODELS[name], seed)
    quantized = upstream_quantizer_output(tokenizer, CODES)
    hints = detokenizer(quantized)
    save_file({"codes": torch.tensor(CODES, dtype=torch.int64), "quantized": quantized[0].contiguous(),
               "hints": hints[0].contiguous()}, os.path.join(FIXTURES, name, "hints.safetensors"))
    print(f"{name}: {len(CODES)} codes -> quantized {list(quantized.shape[1:])} -> hints {list(hints.shape[1:])}, "
          f"norm {float(hints.norm()):.4f}")
    return tokenizer, detokenizer


def song_fixture(tokenizer, detokenizer):
    """diffusers' pipeline given the codes: cover with the hints as source latents."""
    pipe = tiny_pipeline()
    pipe.register_modules(audio_tokenizer=tokenizer, audio_token_detokenizer=detokenizer)
    codes = "".join(f"<|audio_code_{c}|>" for c in CODES)
    frames = 5 * len(CODES)
    rec = {}
    hook_enc = pipe.condition_encoder.register_forward_hook(
        lambda m, a, kw, o: rec.update(states=o[0][0].clone(), mask=o[1][0].clone()), with_kwargs=True)

    def first_context(module, args, kwargs):
        rec.setdefault("context", kwargs["context_latents"][0].clone())

    hook_dit = pipe.transformer.register_forward_pre_hook(first_context, with_kwargs=True)
    noise = torch.randn(1, frames, LATENT, generator=torch.Generator().manual_seed(60))
    # The duration given, as upstream's handler gives the plan's: diffusers' default
    # (60 s) would reach the prompt's metas while the song keeps the codes' length.
    seconds = frames / pipe.latents_per_second
    case = dict(prompt=META["caption"], lyrics=META["lyrics"], vocal_language="en", audio_duration=seconds)
    (latents,) = pipe(**case, audio_codes=codes, num_inference_steps=8, shift=3.0, guidance_scale=1.0,
                      latents=noise.clone(), output_type="latent", return_dict=False)
    hook_enc.remove()
    hook_dit.remove()
    tensors = {"codes": torch.tensor(CODES, dtype=torch.int64), "noise": noise[0],
               "encoder_hidden_states": rec["states"], "encoder_attention_mask": rec["mask"].to(torch.float32),
               "context_latents": rec["context"], "latents": latents[0]}
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(FIXTURES, "real", "hints_song.safetensors"))
    doc = dict(case, frames=frames, steps=8, shift=3.0,
               source="diffusers 0.42.1 AceStepPipeline.__call__ with audio_codes (text2music turned cover, turbo, "
                      "8 steps, shift 3, output_type latent, latents = the given noise) on the committed tiny 2B "
                      "model; hooks captured the condition encoder's output and the DiT's first context_latents",
               versions={p: importlib.metadata.version(p) for p in ["torch", "diffusers", "vector-quantize-pytorch"]}
               | {"python": platform.python_version()})
    with open(os.path.join(FIXTURES, "real", "hints_song.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"hints song: {frames} frames ({seconds} s), latents norm {float(latents.norm()):.4f}")


def main():
    hints_fixture("real_xl", 41)
    song_fixture(*hints_fixture("real", 42))


if __name__ == "__main__":
    main()
