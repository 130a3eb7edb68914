"""A tiny ACE-Step 1.5 XL DiT folder and what its condition encoder makes of the shared
tiny song (see make-xl-model-fixtures).

Not run in CI; the files it writes are committed: engine/tests/fixtures/real_xl/
  model/acestep-v15-xl-turbo/
                         config.json (XL's fields, auto_map naming upstream's XL code),
                         model-0000{1,2}-of-00002.safetensors + model.safetensors.index.json
                         (sharded, as the XL repositories ship), silence_latent.pt
  expected.safetensors   the condition encoder's packed output for tests/fixtures/real's
                         song, a timbre embedding of a longer reference, and the audio
                         tokenizer's 5 Hz codes and quantized states of 23 latent frames
  expected.json          sizes, versions, notes

  model/vae, model/Qwen3-Embedding-0.6B
                         links to tests/fixtures/real/model's: the text states and lyric
                         embeddings here are that Qwen3's

XL's condition encoder is upstream's 2B one built from the encoder_* sizes (its lyric
encoder, text projector and packing are the same code) except the timbre encoder, which
prepends its learned special_token and pools that token's output
(acestep/models/xl_base/modeling_acestep_v15_xl_base.py @ 664445ba, AceStepTimbreEncoder;
in the 2B code the prepend is commented out). diffusers 0.42.1's AceStepConditionEncoder
is the 2B code: built at the encoder sizes it is XL's but for that line, so the timbre
forward below is a transcription of upstream's XL one over diffusers' own layers.
"""

import importlib.metadata
import json
import os
import platform
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

from diffusers.models.transformers.ace_step_transformer import AceStepTransformer1DModel
from diffusers.pipelines.ace_step.modeling_ace_step import (
    AceStepAudioTokenizer,
    AceStepConditionEncoder,
    _ace_step_rotary_freqs,
    _create_4d_mask,
)

from vector_quantize_pytorch import ResidualFSQ

from make_real_fixtures import LATENT, TEXT_DIM, original_names, randomize

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
REAL = os.path.join(ROOT, "engine", "tests", "fixtures", "real")
OUT = os.path.join(ROOT, "engine", "tests", "fixtures", "real_xl")
MODEL = os.path.join(OUT, "model")
DIT_DIR = os.path.join(MODEL, "acestep-v15-xl-turbo")

# XL's relations at a tiny size: the DiT (40 wide, attention 4 x 16 = 64) is wider than
# its encoders (32 wide, 2 heads x 16, intermediate 48), whose heads, KV heads and MLP
# all differ from the DiT's. Real XL: 2560 / 32 x 128 / 9728 against 2048 / 16 / 8 / 6144.
LAYER_TYPES = ["sliding_attention", "full_attention"]
SHARED = dict(head_dim=16, rope_theta=1000000.0, rms_norm_eps=1e-6, sliding_window=16)
DIT = dict(hidden_size=40, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2)
ENCODER = dict(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1)
TIMBRE_FRAMES = 7
# The audio tokenizer: windows of 5 latent frames, one residual FSQ of levels 8,8,8,5,5,5
# (64000 codes) over the encoder width, 2 pooler layers; 23 frames leave a part window.
TOKENIZER = dict(pool_window_size=5, fsq_dim=ENCODER["hidden_size"], fsq_input_levels=[8, 8, 8, 5, 5, 5],
                 fsq_input_num_quantizers=1, num_attention_pooler_hidden_layers=2)
TOKENIZED_FRAMES = 23


def xl_timbre(timbre, packed):
    """Upstream XL's AceStepTimbreEncoder.forward for one reference: embed, prepend the
    special token, the layers (no padding mask: full layers unmasked, sliding layers the
    band), RMSNorm, the special token's row."""
    x = timbre.embed_tokens(packed)
    x = torch.cat([timbre.special_token.expand(x.shape[0], 1, -1), x], dim=1)
    n = x.shape[1]
    cos_sin = _ace_step_rotary_freqs(n, timbre.head_dim, timbre.rope_theta, x.device, x.dtype)
    band = _create_4d_mask(seq_len=n, dtype=x.dtype, device=x.device, attention_mask=None,
                           sliding_window=timbre.sliding_window, is_sliding_window=True, is_causal=False)
    for kind, layer in zip(LAYER_TYPES, timbre.layers):
        x = layer(hidden_states=x, position_embeddings=cos_sin,
                  attention_mask=band if kind == "sliding_attention" else None)
    return timbre.norm(x)[:, 0, :]


def check_quantizer(tokenizer):
    """diffusers' residual FSQ against upstream's (vector_quantize_pytorch's ResidualFSQ)
    with the same projections, on inputs spread over the levels."""
    ours = tokenizer.quantizer
    theirs = ResidualFSQ(dim=TOKENIZER["fsq_dim"], levels=TOKENIZER["fsq_input_levels"],
                         num_quantizers=TOKENIZER["fsq_input_num_quantizers"]).eval()
    theirs.load_state_dict({k: v for k, v in ours.state_dict().items() if k.startswith("project_")})
    x = 3 * torch.randn(1, 64, TOKENIZER["fsq_dim"])
    (a, ia), (b, ib) = ours(x), theirs(x)
    err = float((a - b).abs().max())
    same = torch.equal(ia.long(), ib.long())
    print(f"residual FSQ, diffusers vs vector_quantize_pytorch: codes {'equal' if same else 'DIFFER'}, "
          f"output max abs {err:.2e}")
    if not same or err > 1e-5:
        sys.exit(1)


def write_sharded(state, out_dir):
    """Two shards and their index, as transformers' save_pretrained splits a big model."""
    keys = sorted(state)
    half = len(keys) // 2
    names = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    weight_map = {}
    for name, part in zip(names, [keys[:half], keys[half:]]):
        save_file({k: state[k].contiguous() for k in part}, os.path.join(out_dir, name))
        weight_map.update({k: name for k in part})
    total = sum(t.numel() * t.element_size() for t in state.values())
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def main():
    torch.manual_seed(38)
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(DIT_DIR)
    for shared in ["vae", "Qwen3-Embedding-0.6B"]:
        os.symlink(os.path.join("..", "..", "real", "model", shared), os.path.join(MODEL, shared))
    real = load_file(os.path.join(REAL, "expected.safetensors"))
    qwen = load_file(os.path.join(REAL, "model", "Qwen3-Embedding-0.6B", "model.safetensors"))

    encoder = AceStepConditionEncoder(
        text_hidden_dim=TEXT_DIM, timbre_hidden_dim=LATENT, num_lyric_encoder_hidden_layers=2,
        num_timbre_encoder_hidden_layers=2, layer_types=LAYER_TYPES, **ENCODER, **SHARED,
    ).eval()
    randomize(encoder, 0.3)
    dit = AceStepTransformer1DModel(
        num_hidden_layers=2, in_channels=3 * LATENT, audio_acoustic_hidden_dim=LATENT, patch_size=2,
        layer_types=LAYER_TYPES, encoder_hidden_size=ENCODER["hidden_size"], is_turbo=True,
        model_version="turbo", **DIT, **SHARED,
    ).eval()
    randomize(dit, 0.1)
    state = original_names(dit.state_dict(), "decoder.")
    state.update(original_names({k: v for k, v in encoder.state_dict().items() if k != "silence_latent"}, "encoder."))
    state["null_condition_emb"] = torch.randn(1, 1, ENCODER["hidden_size"])
    tokenizer = AceStepAudioTokenizer(audio_acoustic_hidden_dim=LATENT, layer_types=LAYER_TYPES, **TOKENIZER,
                                      **ENCODER, **SHARED).eval()
    randomize(tokenizer, 0.3)
    state.update(original_names(tokenizer.state_dict(), "tokenizer."))
    write_sharded(state, DIT_DIR)
    config = dict(
        DIT, **SHARED,
        encoder_hidden_size=ENCODER["hidden_size"],
        encoder_intermediate_size=ENCODER["intermediate_size"],
        encoder_num_attention_heads=ENCODER["num_attention_heads"],
        encoder_num_key_value_heads=ENCODER["num_key_value_heads"],
        num_hidden_layers=2, in_channels=3 * LATENT, audio_acoustic_hidden_dim=LATENT, patch_size=2,
        use_sliding_window=True, layer_types=LAYER_TYPES, attention_bias=False,
        text_hidden_dim=TEXT_DIM, timbre_hidden_dim=LATENT,
        num_lyric_encoder_hidden_layers=2, num_timbre_encoder_hidden_layers=2,
        model_version="xl_turbo", is_turbo=True, timestep_mu=-0.4, timestep_sigma=1.0, **TOKENIZER,
        auto_map={"AutoModel": "modeling_acestep_v15_xl_turbo.AceStepConditionGenerationModel"},
    )
    with open(os.path.join(DIT_DIR, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    silence = torch.randn(1, LATENT, 120)
    torch.save(silence, os.path.join(DIT_DIR, "silence_latent.pt"))

    # The shared song's condition, as ACE-Step's run_encoder makes it (a zero timbre
    # reference of one frame), with XL's timbre forward in place of the 2B one.
    encoder.timbre_encoder.forward = lambda packed, order: (xl_timbre(encoder.timbre_encoder, packed)[None],
                                                            torch.ones(1, 1, dtype=torch.long))
    lyric_embeds = qwen["embed_tokens.weight"][real["lyric_input_ids"]][None]
    states, mask = encoder(
        text_hidden_states=real["text_hidden_states"][None],
        text_attention_mask=real["text_attention_mask"][None],
        lyric_hidden_states=lyric_embeds,
        lyric_attention_mask=real["lyric_attention_mask"][None],
        refer_audio_acoustic_hidden_states_packed=torch.zeros(1, 1, LATENT),
        refer_audio_order_mask=torch.zeros(1, dtype=torch.long),
    )
    reference = torch.randn(TIMBRE_FRAMES, LATENT)
    latents = torch.randn(TOKENIZED_FRAMES, LATENT)
    quantized, codes = tokenizer.tokenize(latents[None], silence.transpose(1, 2))
    check_quantizer(tokenizer)
    frames = real["vae_mean"].shape[0]
    sil = silence.transpose(1, 2)
    expected = {
        "encoder_hidden_states": states[0],
        "encoder_attention_mask": mask[0].to(torch.float32),
        "timbre_reference": reference,
        "timbre": xl_timbre(encoder.timbre_encoder, reference[None]),
        "context_latents": torch.cat([sil[:, :frames, :], torch.ones(1, frames, LATENT)], dim=-1)[0],
        "tokenizer_latents": latents,
        "tokenizer_quantized": quantized[0],
        "tokenizer_codes": codes[0, :, 0].to(torch.int64),
    }
    save_file({k: v.contiguous() for k, v in expected.items()}, os.path.join(OUT, "expected.safetensors"))
    doc = {
        "model": "model/acestep-v15-xl-turbo/ (sharded); model/vae and model/Qwen3-Embedding-0.6B link to "
                 "tests/fixtures/real/model's",
        "song": "tests/fixtures/real/expected.json's meta; its text states, masks and lyric ids",
        "dit": DIT | SHARED | {"encoder_hidden_size": ENCODER["hidden_size"]},
        "encoder": ENCODER | SHARED,
        "expected": {k: list(v.shape) for k, v in expected.items()},
        "notes": [
            "encoder_hidden_states: the packed condition (valid lyric rows, the timbre row, valid text "
            "rows, padding), the timbre from one zero frame as ACE-Step's training encoder makes it",
            "timbre: the timbre encoder's output for timbre_reference (7 frames): the special token's row",
            "context_latents: the silence latent's first frames beside ones, as for the 2B fixture",
            "tokenizer_*: the audio tokenizer of tokenizer_latents (23 frames; the last window completed with "
            "the silence latent's first 2 frames, as AceStepAudioTokenizer.tokenize): one code per 5 frames "
            "and the quantized states [5, 32]",
            "Reference: diffusers 0.42.1 AceStepConditionEncoder at the encoder_* sizes, its timbre forward "
            "replaced by the transcription of upstream XL's (special token prepended).",
        ],
        "versions": {p: importlib.metadata.version(p) for p in ["torch", "diffusers", "safetensors", "vector-quantize-pytorch"]}
        | {"python": platform.python_version()},
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"wrote {OUT}: {total / 1e3:.0f} kB; condition {list(states[0].shape)}, timbre norm "
          f"{float(expected['timbre'].norm()):.4f}")


if __name__ == "__main__":
    main()
