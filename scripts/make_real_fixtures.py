"""Tiny random ACE-Step model folder + reference preprocessing outputs.

Run through scripts/make-real-fixtures (it sets up the venv). Writes
engine/tests/fixtures/real/:

  model/acestep-v15-turbo/{config.json, model.safetensors, silence_latent.pt}
  model/vae/{config.json, diffusion_pytorch_model.safetensors}
  model/Qwen3-Embedding-0.6B/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json}
  expected.safetensors   reference tensors for one generated clip (see `expected` below)
  expected.json          the clip's metadata, prompt and sizes
  acestep_sample.pt      the same sample as ACE-Step's trainer saves it (bf16, bool mask, metadata)

The clip is a formula both sides compute (see `clip`), so no audio is stored.

With `--generation` it leaves all of that as it is and only adds the generation
fixtures (reading the committed tiny VAE and the shared `dit_tiny` / `sample_tiny`):

  real/text2music.{safetensors,json}   diffusers' `AceStepPipeline` text2music on the
      committed tiny model (turbo, 8 steps, shift 3, given noise): the token ids, the
      condition encoder's output and the context latents it builds, and the latents

  real/vae_decode.safetensors          latents [T, C] and diffusers' `AutoencoderOobleck.decode`
  ../sample_guided_tiny.{safetensors,json}
      diffusers' `AceStepPipeline` denoising loop for a base/SFT model (10 steps, shift
      2.5, APG guidance 5 within cfg interval [0, 0.6]: the last 2 steps unguided) on
      dit_tiny, without and with its LoRA, laid out like the shared `sample_tiny` fixture
"""

import json
import math
import os
import shutil

import numpy as np
import torch
from safetensors.torch import save_file

from diffusers import AutoencoderOobleck
from diffusers.models.transformers.ace_step_transformer import AceStepTransformer1DModel
from diffusers.pipelines.ace_step.modeling_ace_step import AceStepConditionEncoder
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, processors, trainers, Regex
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3Model

OUT = os.path.join(os.path.dirname(__file__), "..", "engine", "tests", "fixtures", "real")
MODEL = os.path.join(OUT, "model")
torch.manual_seed(0)
torch.set_grad_enabled(False)

# ---- sizes (tiny; the real ones in comments) ----
LATENT = 8  # 64
HIDDEN = 32  # 2048
TEXT_DIM = 32  # 1024 (Qwen3-Embedding-0.6B hidden)
RATE = 48000
SECONDS = 2.0
TEXT_LEN, LYRIC_LEN = 256, 512

META = {
    "caption": "warm lo-fi piano with soft brushed drums",
    "lyrics": "[Verse]\nla la la, under the paper moon\nhold the light",
    "bpm": 84,
    "keyscale": "F major",
    "timesignature": "4",
    "duration_seconds": SECONDS,
}


def clip():
    """2 s stereo: a formula the Rust test computes identically (f64, then f32)."""
    n = np.arange(int(RATE * SECONDS), dtype=np.float64)
    t = n / RATE
    left = 0.5 * np.sin(2 * np.pi * 220.0 * t) + 0.25 * np.sin(2 * np.pi * 1234.5 * t + 0.3)
    right = 0.4 * np.sin(2 * np.pi * 330.0 * t) * np.exp(-t) + 0.2 * np.sin(2 * np.pi * 97.0 * t)
    return torch.from_numpy(np.stack([left, right]).astype(np.float32))


def prompt(meta):
    metas = (
        f"- bpm: {meta['bpm']}\n- timesignature: {meta['timesignature']}\n"
        f"- keyscale: {meta['keyscale']}\n- duration: {int(meta['duration_seconds'])} seconds\n"
    )
    return (
        "# Instruction\nFill the audio semantic mask based on the given conditions:\n\n"
        f"# Caption\n{meta['caption']}\n\n# Metas\n{metas}<|endoftext|>\n"
    )


def randomize(module, scale=0.3):
    """Random values everywhere (weight_g, Snake alpha/beta and norms included)."""
    g = torch.Generator().manual_seed(1)
    for name, p in module.named_parameters():
        p.copy_(torch.randn(p.shape, generator=g) * scale + (1.0 if name.endswith("norm.weight") else 0.0))


# ---- tokenizer: a tiny byte-level BPE laid out like Qwen's ----
def build_tokenizer(path):
    tok = Tokenizer(models.BPE())
    qwen_split = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(qwen_split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [prompt(META), META["lyrics"], "[Instrumental]", "the quick brown fox jumps over the lazy dog " * 4]
    tok.train_from_iterator(corpus, trainer)
    os.makedirs(path, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>", padding_side="left")
    fast.save_pretrained(path)
    for extra in ["special_tokens_map.json"]:
        if os.path.exists(os.path.join(path, extra)):
            os.remove(os.path.join(path, extra))
    return PreTrainedTokenizerFast.from_pretrained(path)


# The same tensors under diffusers' names and ACE-Step's checkpoint names.
NAME_PAIRS = [
    ("proj_in_conv.", "proj_in.1."),
    ("proj_out_conv.", "proj_out.1."),
    (".to_q.", ".q_proj."),
    (".to_k.", ".k_proj."),
    (".to_v.", ".v_proj."),
    (".to_out.0.", ".o_proj."),
    (".norm_q.", ".q_norm."),
    (".norm_k.", ".k_norm."),
]


def renamed(key, to_original):
    for diffusers, original in NAME_PAIRS:
        key = key.replace(diffusers, original) if to_original else key.replace(original, diffusers)
    return key


def original_names(state, prefix):
    """diffusers' attention names -> ACE-Step's checkpoint names."""
    return {prefix + renamed(k, True): v.contiguous() for k, v in state.items()}


def main():
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(MODEL)
    expected = {}

    # 1. Tokenizer + Qwen3.
    qdir = os.path.join(MODEL, "Qwen3-Embedding-0.6B")
    tokenizer = build_tokenizer(qdir)
    qcfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=TEXT_DIM,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rope_theta=1000000.0,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    qcfg._attn_implementation = "eager"
    qwen = Qwen3Model(qcfg).eval()
    randomize(qwen, 0.5)
    qcfg.to_json_file(os.path.join(qdir, "config.json"))
    save_file({k: v.contiguous() for k, v in qwen.state_dict().items()}, os.path.join(qdir, "model.safetensors"))

    text = tokenizer(prompt(META), padding="max_length", max_length=TEXT_LEN, truncation=True, return_tensors="pt")
    lyr = tokenizer(META["lyrics"], padding="max_length", max_length=LYRIC_LEN, truncation=True, return_tensors="pt")
    text_hidden = qwen(text.input_ids).last_hidden_state  # no attention mask, as ACE-Step
    lyric_embeds = qwen.embed_tokens(lyr.input_ids)
    expected["text_input_ids"] = text.input_ids[0].to(torch.int64)
    expected["text_attention_mask"] = text.attention_mask[0].to(torch.int64)
    expected["lyric_input_ids"] = lyr.input_ids[0].to(torch.int64)
    expected["lyric_attention_mask"] = lyr.attention_mask[0].to(torch.int64)
    expected["text_hidden_states"] = text_hidden[0]

    # 2. Condition encoder + DiT in one model.safetensors, original names.
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(2)]
    common = dict(
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        sliding_window=16,
    )
    encoder = AceStepConditionEncoder(
        text_hidden_dim=TEXT_DIM,
        timbre_hidden_dim=LATENT,
        num_lyric_encoder_hidden_layers=2,
        num_timbre_encoder_hidden_layers=2,
        layer_types=layer_types,
        **common,
    ).eval()
    randomize(encoder, 0.3)
    for m in encoder.modules():
        if hasattr(m, "set_attention_backend"):
            pass
    dit = AceStepTransformer1DModel(
        num_hidden_layers=2,
        in_channels=3 * LATENT,
        audio_acoustic_hidden_dim=LATENT,
        patch_size=2,
        layer_types=layer_types,
        is_turbo=True,
        model_version="turbo",
        **common,
    ).eval()
    randomize(dit, 0.1)
    tdir = os.path.join(MODEL, "acestep-v15-turbo")
    os.makedirs(tdir)
    state = original_names(dit.state_dict(), "decoder.")
    enc_state = {k: v for k, v in encoder.state_dict().items() if k != "silence_latent"}
    state.update(original_names(enc_state, "encoder."))
    save_file(state, os.path.join(tdir, "model.safetensors"))
    config = dict(
        common,
        num_hidden_layers=2,
        in_channels=3 * LATENT,
        audio_acoustic_hidden_dim=LATENT,
        patch_size=2,
        use_sliding_window=True,
        layer_types=layer_types,
        attention_bias=False,
        text_hidden_dim=TEXT_DIM,
        timbre_hidden_dim=LATENT,
        num_lyric_encoder_hidden_layers=2,
        num_timbre_encoder_hidden_layers=2,
        model_version="turbo",
        is_turbo=True,
        timestep_mu=-0.4,
        timestep_sigma=1.0,
        auto_map={"AutoModel": "modeling_acestep_v15_turbo.AceStepConditionGenerationModel"},
    )
    with open(os.path.join(tdir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    # ACE-Step's run_encoder: a zero timbre reference of one frame.
    states, mask = encoder(
        text_hidden_states=text_hidden,
        text_attention_mask=text.attention_mask,
        lyric_hidden_states=lyric_embeds,
        lyric_attention_mask=lyr.attention_mask,
        refer_audio_acoustic_hidden_states_packed=torch.zeros(1, 1, LATENT),
        refer_audio_order_mask=torch.zeros(1, dtype=torch.long),
    )
    expected["encoder_hidden_states"] = states[0]
    expected["encoder_attention_mask"] = mask[0].to(torch.float32)

    # 3. VAE (whole model, as diffusers saves it).
    vae = AutoencoderOobleck(
        encoder_hidden_size=2 * LATENT,
        downsampling_ratios=[2, 4, 4, 6, 10],
        channel_multiples=[1, 1, 1, 1, 2],
        decoder_channels=8,
        decoder_input_channels=LATENT,
        audio_channels=2,
        sampling_rate=RATE,
    ).eval()
    randomize(vae, 0.2)
    vdir = os.path.join(MODEL, "vae")
    vae.save_pretrained(vdir, safe_serialization=True)
    audio = clip()
    dist = vae.encode(audio[None]).latent_dist
    expected["vae_mean"] = dist.mean[0].T.contiguous()  # (T, C)
    expected["vae_scale"] = dist.scale[0].T.contiguous()
    expected["vae_std"] = dist.std[0].T.contiguous()
    frames = expected["vae_mean"].shape[0]

    # 4. Silence latent, saved like ACE-Step's ([1, C, F]; F = 15000 in the real file).
    silence = torch.randn(1, LATENT, 120)
    torch.save(silence, os.path.join(tdir, "silence_latent.pt"))
    sil = silence.transpose(1, 2)  # ACE-Step transposes after loading
    ctx = torch.cat([sil[:, :frames, :], torch.ones(1, frames, LATENT)], dim=-1)
    expected["context_latents"] = ctx[0]
    expected["target_latents"] = expected["vae_mean"].clone()

    save_file({k: v.contiguous() for k, v in expected.items()}, os.path.join(OUT, "expected.safetensors"))
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"meta": META, "prompt": prompt(META), "frames": frames, "rate": RATE}, f, indent=2)

    # 5. The sample as ACE-Step's trainer writes it (model dtype bf16, bool mask, metadata).
    bf = torch.bfloat16
    torch.save(
        {
            "target_latents": expected["target_latents"].to(bf),
            "attention_mask": torch.ones(frames, dtype=bf),
            "encoder_hidden_states": states[0].to(bf),
            "encoder_attention_mask": mask[0],
            "context_latents": ctx[0].to(bf),
            "metadata": {"filename": "clip.wav", "caption": META["caption"], "bpm": 84, "duration": 2.0, "language": None},
        },
        os.path.join(OUT, "acestep_sample.pt"),
    )

    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"wrote {OUT}: {total / 1e6:.2f} MB; frames {frames}; vocab {len(tokenizer)}")
    print("valid text tokens", int(text.attention_mask.sum()), "lyric tokens", int(lyr.attention_mask.sum()))


def shared_fixtures():
    return os.environ.get("OSTINATO_FIXTURES") or os.path.join(os.path.dirname(__file__), "..", "..", "shared", "fixtures")


def vae_decode_fixture():
    """diffusers' decode of random latents with the committed tiny VAE."""
    vae = AutoencoderOobleck.from_pretrained(os.path.join(MODEL, "vae")).eval()
    g = torch.Generator().manual_seed(5)
    z = torch.randn(1, LATENT, 13, generator=g)
    audio = vae.decode(z).sample[0]
    save_file(
        {"in.latents": z[0].T.contiguous(), "out.audio": audio.contiguous()},
        os.path.join(OUT, "vae_decode.safetensors"),
    )
    print("vae_decode: latents", list(z.shape), "audio", list(audio.shape), "peak", float(audio.abs().max()))


def tiny_pipeline():
    """diffusers' AceStepPipeline over the committed tiny model folder."""
    from safetensors.torch import load_file
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.ace_step.pipeline_ace_step import AceStepPipeline

    qdir, tdir = os.path.join(MODEL, "Qwen3-Embedding-0.6B"), os.path.join(MODEL, "acestep-v15-turbo")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(qdir)
    qcfg = Qwen3Config.from_json_file(os.path.join(qdir, "config.json"))
    qcfg._attn_implementation = "eager"
    qwen = Qwen3Model(qcfg).eval()
    qwen.load_state_dict(load_file(os.path.join(qdir, "model.safetensors")), strict=True)
    cfg = json.load(open(os.path.join(tdir, "config.json")))
    common = {k: cfg[k] for k in [
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "rope_theta", "rms_norm_eps", "sliding_window"]}
    weights = load_file(os.path.join(tdir, "model.safetensors"))
    part = lambda prefix: diffusers_names({k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)})
    dit = AceStepTransformer1DModel(
        num_hidden_layers=cfg["num_hidden_layers"], in_channels=cfg["in_channels"],
        audio_acoustic_hidden_dim=cfg["audio_acoustic_hidden_dim"], patch_size=cfg["patch_size"],
        layer_types=cfg["layer_types"], is_turbo=True, model_version="turbo", **common,
    ).eval()
    dit.load_state_dict(part("decoder."), strict=True)
    encoder = AceStepConditionEncoder(
        text_hidden_dim=cfg["text_hidden_dim"], timbre_hidden_dim=cfg["timbre_hidden_dim"],
        num_lyric_encoder_hidden_layers=cfg["num_lyric_encoder_hidden_layers"],
        num_timbre_encoder_hidden_layers=cfg["num_timbre_encoder_hidden_layers"],
        layer_types=cfg["layer_types"], **common,
    ).eval()
    missing, unexpected = encoder.load_state_dict(part("encoder."), strict=False)
    assert set(missing) <= {"null_condition_emb", "silence_latent"} and not unexpected, (missing, unexpected)
    # ACE-Step's silence_latent.pt is [1, C, F]; the pipeline keeps it as [1, F, C].
    encoder.silence_latent = torch.load(os.path.join(tdir, "silence_latent.pt")).transpose(1, 2).contiguous()
    vae = AutoencoderOobleck.from_pretrained(os.path.join(MODEL, "vae")).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1, shift=1.0)
    return AceStepPipeline(vae=vae, text_encoder=qwen, tokenizer=tokenizer, transformer=dit,
                           condition_encoder=encoder, scheduler=scheduler)


def text2music_fixture():
    """What diffusers' AceStepPipeline feeds its DiT for a text2music request, and
    the latents its turbo loop makes from given noise, for two requests: short lyrics
    with a language, and a caption and lyrics past the 256 / 2048 token limits."""
    pipe = tiny_pipeline()
    long_words = " ".join(f"word{i} la" for i in range(700))
    cases = [
        dict(prompt=META["caption"], lyrics=META["lyrics"], vocal_language="en", audio_duration=1.0),
        dict(prompt="dark ambient drone, " * 60, lyrics="[Chorus]\n" + long_words, vocal_language="unknown",
             audio_duration=1.5),
    ]
    tensors, meta = {}, {"cases": []}
    for i, case in enumerate(cases):
        rec = {}
        calls = []
        h1 = pipe.text_encoder.embed_tokens.register_forward_hook(lambda m, a, o: calls.append(a[0][0].clone()))
        h2 = pipe.condition_encoder.register_forward_hook(
            lambda m, a, kw, o: rec.update(states=o[0][0].clone(), mask=o[1][0].clone(),
                                           timbre=kw["refer_audio_acoustic_hidden_states_packed"][0].clone()),
            with_kwargs=True)
        def first_context(module, args, kwargs):
            rec.setdefault("context", kwargs["context_latents"][0].clone())

        h3 = pipe.transformer.register_forward_pre_hook(first_context, with_kwargs=True)
        frames = math.ceil(case["audio_duration"] * pipe.latents_per_second)
        noise = torch.randn(1, frames, LATENT, generator=torch.Generator().manual_seed(40 + i))
        (latents,) = pipe(**case, num_inference_steps=8, shift=3.0, guidance_scale=1.0, latents=noise.clone(),
                          output_type="latent",
                          return_dict=False)
        for h in (h1, h2, h3):
            h.remove()
        text, lyric = pipe._format_prompt(case["prompt"], case["lyrics"], case["vocal_language"], case["audio_duration"])
        p = f"case{i}."
        tensors.update({
            p + "text_input_ids": calls[0].to(torch.int64), p + "lyric_input_ids": calls[1].to(torch.int64),
            p + "encoder_hidden_states": rec["states"], p + "encoder_attention_mask": rec["mask"].to(torch.float32),
            p + "timbre_reference": rec["timbre"], p + "context_latents": rec["context"], p + "noise": noise[0],
            p + "latents": latents[0],
        })
        meta["cases"].append(dict(case, text_prompt=text, lyrics_prompt=lyric, frames=frames,
                                  text_tokens=len(calls[0]), lyric_tokens=len(calls[1])))
        print(f"text2music case {i}: {len(calls[0])} text tokens, {len(calls[1])} lyric tokens, "
              f"encoder states {list(rec['states'].shape)}, timbre reference {list(rec['timbre'].shape)}, frames {frames}")
    meta["source"] = ("diffusers 0.42.1 AceStepPipeline.__call__ (task text2music, turbo, 8 steps, shift 3, "
                      "output_type latent, latents = the given noise) on the committed tiny model; captured by hooks: "
                      "the ids entering Qwen3's embedding (text, then lyrics), the condition encoder's output and "
                      "timbre input, the DiT's context_latents")
    meta["versions"] = {"torch": torch.__version__, "diffusers": __import__("diffusers").__version__}
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, "text2music.safetensors"))
    with open(os.path.join(OUT, "text2music.json"), "w") as f:
        json.dump(meta, f, indent=1)


def diffusers_names(state):
    """ACE-Step's checkpoint names -> diffusers' (the inverse of `original_names`)."""
    return {renamed(k, False): v for k, v in state.items()}


def guided_sample_fixture():
    """The base/SFT denoising loop of diffusers' AceStepPipeline.__call__ (its own
    schedule, scheduler and APG guidance functions), run on dit_tiny."""
    from safetensors.torch import load_file
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.guiders.adaptive_projected_guidance import MomentumBuffer, normalized_guidance
    from diffusers.pipelines.ace_step.pipeline_ace_step import AceStepPipeline

    shared = shared_fixtures()
    dit_json = json.load(open(os.path.join(shared, "dit_tiny.json")))
    weights = load_file(os.path.join(shared, "dit_tiny.safetensors"))
    sample = load_file(os.path.join(shared, "sample_tiny.safetensors"))
    cfg = dit_json["config"]
    keys = [
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "in_channels", "audio_acoustic_hidden_dim", "patch_size", "sliding_window", "rope_theta",
        "rms_norm_eps", "layer_types",
    ]
    dit = AceStepTransformer1DModel(**{k: cfg[k] for k in keys}, is_turbo=False, model_version="base").eval()
    base = {k[len("decoder."):]: v for k, v in weights.items() if k.startswith("decoder.")}
    dit.load_state_dict(diffusers_names(base), strict=True)
    scaling = dit_json["lora"]["scaling"]

    def merged():
        """The LoRA merged into the base weights: W + scaling * B A."""
        state = dict(base)
        for k, v in weights.items():
            if k.startswith("lora.") and k.endswith(".lora_A.weight"):
                module = k[len("lora."):-len(".lora_A.weight")]
                b = weights[f"lora.{module}.lora_B.weight"]
                state[f"{module}.weight"] = state[f"{module}.weight"] + scaling * (b @ v)
        return diffusers_names(state)

    steps, shift, guidance, interval = 10, 2.5, 5.0, (0.0, 0.6)
    g = torch.Generator().manual_seed(77)
    null_emb = torch.randn(1, 1, cfg["hidden_size"], generator=g) * 0.5
    noise = torch.randn(sample["in.noise"].shape, generator=g)
    ctx, enc = sample["in.context_latents"], sample["in.encoder_hidden_states"]

    def loop(record):
        t_schedule = AceStepPipeline._get_timestep_schedule(None, num_inference_steps=steps, shift=shift, dtype=torch.float32)
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1, shift=1.0)
        scheduler.set_timesteps(sigmas=t_schedule.tolist())
        null = null_emb.expand_as(enc)
        momentum = MomentumBuffer(momentum=-0.75)
        xt, out = noise.clone(), {}
        for k, t_sched in enumerate(scheduler.timesteps):
            t = float(t_sched) * torch.ones((1,), dtype=torch.float32)
            if record:
                out[f"dbg.xt.{k}"] = xt.clone()
            if interval[0] <= 1.0 - float(t_sched) <= interval[1]:
                v = dit(
                    hidden_states=torch.cat([xt, xt]), timestep=torch.cat([t, t]), timestep_r=torch.cat([t, t]),
                    encoder_hidden_states=torch.cat([enc, null]), context_latents=torch.cat([ctx, ctx]), return_dict=False,
                )[0]
                v_cond, v_uncond = v.chunk(2)
                v = normalized_guidance(
                    pred_cond=v_cond, pred_uncond=v_uncond, guidance_scale=guidance - 1.0, momentum_buffer=momentum,
                    eta=0.0, norm_threshold=2.5, use_original_formulation=True, norm_dim=(1,),
                )
            else:
                v = dit(hidden_states=xt, timestep=t, timestep_r=t, encoder_hidden_states=enc, context_latents=ctx, return_dict=False)[0]
            if record:
                out[f"dbg.v.{k}"] = v.clone()
            xt = scheduler.step(v, t_sched, xt, return_dict=False)[0]
        return xt, out, t_schedule

    latents, tensors, t_schedule = loop(True)
    dit.load_state_dict(merged(), strict=True)
    latents_lora, _, _ = loop(False)
    tensors.update({k: v for k, v in weights.items() if k.startswith("decoder.") or k.startswith("lora.")})
    tensors.update({
        "in.noise": noise, "in.context_latents": ctx, "in.encoder_hidden_states": enc, "in.null_condition_emb": null_emb,
        "in.timesteps": t_schedule, "out.latents": latents, "out.latents_lora": latents_lora,
    })
    path = os.path.join(OUT, "..", "sample_guided_tiny")
    save_file({k: v.contiguous() for k, v in tensors.items()}, path + ".safetensors")
    meta = {
        "config": cfg,
        "lora": dit_json["lora"],
        "sampler": {
            "kind": "base/sft with guidance", "steps": steps, "shift": shift, "guidance_scale": guidance,
            "cfg_interval": list(interval), "timesteps": t_schedule.tolist(),
            "source": "diffusers 0.42.1 AceStepPipeline.__call__ denoising loop: _get_timestep_schedule, "
            "FlowMatchEulerDiscreteScheduler(num_train_timesteps=1, shift=1) with set_timesteps(sigmas=...), "
            "APG normalized_guidance(momentum -0.75, eta 0, norm_threshold 2.5, norm_dim (1,), original formulation) "
            "between encoder_hidden_states and null_condition_emb expanded to its shape",
        },
        "notes": [
            "weights, context latents and encoder states are the shared sample_tiny/dit_tiny ones; null_condition_emb and noise are new (seed 77)",
            "out.latents_lora: the same loop with the fixture LoRA merged into the base weights (W + scaling B A)",
        ],
        "versions": {"torch": torch.__version__, "diffusers": __import__("diffusers").__version__},
    }
    with open(path + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    print("sample_guided_tiny: max |latents| %.3f, LoRA effect %.3e" % (latents.abs().max(), (latents_lora - latents).abs().max()))


if __name__ == "__main__":
    import sys

    torch.set_grad_enabled(False)
    if "--text2music" in sys.argv:
        text2music_fixture()
    elif "--generation" in sys.argv:
        vae_decode_fixture()
        guided_sample_fixture()
    else:
        main()
