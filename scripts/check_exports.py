"""Checks Ostinato's exports with the real loaders (not CI; run through scripts/check-exports).

For an adapter with alpha != r, and one with rsLoRA, trained for a few steps by the
`ostinato` binary on the tiny real model folder (engine/tests/fixtures/real/model), and
the first again on the tiny XL one (engine/tests/fixtures/real_xl/model: a DiT wider
than its condition, attention wider than the DiT, weights in shards):

1. the PEFT file's header: `format: pt` and `lora_adapter_metadata` equal, key by key,
   to what diffusers' own `AceStepLoraLoaderMixin.save_lora_weights` writes for the
   same LoRA config with dropout 0 (the runs train with dropout 0.1; see 2);
2. diffusers: `AceStepLoraLoaderMixin.lora_state_dict` + `load_lora_into_transformer`
   (what `AceStepPipeline.load_lora_weights` runs) into `AceStepTransformer1DModel`
   already in eval mode, as a user's pipeline is (not put in eval mode again: the
   loader adds its LoRA layers in training mode, so a dropout in the metadata would
   run); two forwards must be identical and equal the forward of the merged weights
   to 1e-5; fused, its weights must equal `--format merged` to 1e-5;
3. PEFT as ACE-Step loads it, `PeftModel.from_pretrained(decoder, dir)`: ACE-Step's
   model code is not on PyPI, so the decoder is rebuilt as modules under ACE-Step's
   own names (`layers.N.{self,cross}_attn.{q,k,v,o}_proj`) holding the checkpoint's
   weights; merged by PEFT, they must equal `--format merged` to 1e-5;
4. `--format merged --full`: the folder's model.safetensors holds every tensor of the
   source's (one file where the source's were shards) in its dtype, the decoder equal
   to `--format merged`, the rest unchanged, and the folder's other files; diffusers'
   transformer loads its decoder;
5. every exported file is mode 0644.

LoKr, DoRA and ComfyUI: check_adapters.py. Prints each measured difference; exits
non-zero on the first failure.
"""

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from diffusers.loaders.lora_pipeline import AceStepLoraLoaderMixin
from diffusers.models.transformers.ace_step_transformer import AceStepTransformer1DModel
from peft import LoraConfig, PeftModel, get_peft_model_state_dict

# One table of diffusers/ACE-Step name pairs, the fixture script's.
from make_real_fixtures import NAME_PAIRS

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MODEL = os.path.join(ROOT, "engine", "tests", "fixtures", "real", "model")
DIT = os.path.join(MODEL, "acestep-v15-turbo")
XL_MODEL = os.path.join(ROOT, "engine", "tests", "fixtures", "real_xl", "model")
XL_DIT = os.path.join(XL_MODEL, "acestep-v15-xl-turbo")
INDEX = "model.safetensors.index.json"
TOL = 1e-5
TARGETS = {"q_proj": "to_q", "k_proj": "to_k", "v_proj": "to_v", "o_proj": "to_out.0"}
torch.manual_seed(0)
torch.set_grad_enabled(False)


def diffusers_name(key):
    for diffusers, original in NAME_PAIRS:
        key = key.replace(original, diffusers)
    return key


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        sys.exit(1)


def max_diff(a, b):
    return float((a.float() - b.float()).abs().max())


def dit_config(dit=DIT):
    cfg = json.load(open(os.path.join(dit, "config.json")))
    keys = [
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "in_channels", "audio_acoustic_hidden_dim", "patch_size", "sliding_window", "rope_theta",
        "rms_norm_eps", "layer_types",
    ]
    return {k: cfg[k] for k in keys} | {"encoder_hidden_size": cfg.get("encoder_hidden_size", cfg["hidden_size"])}


def weight_files(dit):
    """model.safetensors, or the shards its index lists."""
    if os.path.exists(os.path.join(dit, "model.safetensors")):
        return ["model.safetensors"]
    return sorted(set(json.load(open(os.path.join(dit, INDEX)))["weight_map"].values()))


def source_weights(dit):
    state = {}
    for f in weight_files(dit):
        state.update(load_file(os.path.join(dit, f)))
    return state


def transformer(decoder_state, dit=DIT):
    """diffusers' ACE-Step transformer holding `decoder_state` (original names, no prefix)."""
    model = AceStepTransformer1DModel(**dit_config(dit), is_turbo=True, model_version="turbo").eval()
    model.load_state_dict({diffusers_name(k): v.float() for k, v in decoder_state.items()}, strict=True)
    return model


def decoder_of(state):
    return {k[len("decoder."):]: v for k, v in state.items() if k.startswith("decoder.")}


def forward(model, inputs):
    return model(**inputs, return_dict=False)[0]


def inputs(dit=DIT):
    cfg = dit_config(dit)
    t, latent = 37, cfg["audio_acoustic_hidden_dim"]
    time = torch.tensor([0.7])
    return dict(
        hidden_states=torch.randn(1, t, latent),
        timestep=time,
        timestep_r=time,
        encoder_hidden_states=torch.randn(1, 11, cfg["encoder_hidden_size"]),
        context_latents=torch.randn(1, t, cfg["in_channels"] - latent),
    )


TRIGGER = "ostn style"


def train(ostinato, work, name, args, model=MODEL):
    """Trains run `name` for 4 steps at a high rate, so the adapter moves; `args`: its
    adapter's flags, or `--config` with them. With a trigger word, so every loader below
    reads files that carry it (`trigger_word`, `tag_position`)."""
    run = [ostinato, "train", os.path.join(ROOT, "assets", "demo"), "--model", model, *args, "--trigger", TRIGGER,
           "--runs-dir", os.path.join(work, "runs"), "--name", name, "--max-steps", "4", "--lr", "0.05",
           "--crop-seconds", "2", "--no-cache", "--save-every-steps", "2", "--quiet"]
    subprocess.run(run, check=True, stdout=subprocess.DEVNULL)
    return os.path.join(work, "runs", name)


def export(ostinato, run_dir, fmt, path, *extra):
    subprocess.run([ostinato, "export", run_dir, "--format", fmt, "--to", path, *extra], check=True, stdout=subprocess.DEVNULL)
    return path


def config_args(work, name, lora):
    """`--config` with a run config whose [lora] table holds `lora`."""
    config = os.path.join(work, f"{name}.toml")
    with open(config, "w") as f:
        f.write("[lora]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in lora.items()))
    return ["--config", config]


def train_and_export(ostinato, work, name, args, model=MODEL):
    run_dir = train(ostinato, work, name, args, model)
    out = {"run": run_dir}
    for fmt, to, extra in [("peft", "peft", []), ("merged", "merged.safetensors", []), ("merged", "acestep-v15-merged", ["--full"])]:
        out[to] = export(ostinato, run_dir, fmt, os.path.join(work, name, to), *extra)
    return out


def diffusers_own_metadata(lora):
    """The header diffusers' own save writes for the same LoRA on its ACE-Step transformer."""
    model = AceStepTransformer1DModel(**dit_config()).eval()
    # Dropout 0 whatever the run trained with: the metadata is for inference.
    config = LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], target_modules=list(TARGETS.values()),
                        use_rslora=lora["use_rslora"], use_dora=lora.get("use_dora", False), lora_dropout=0.0)
    model.add_adapter(config)
    with tempfile.TemporaryDirectory() as d:
        AceStepLoraLoaderMixin.save_lora_weights(
            d, transformer_lora_layers=get_peft_model_state_dict(model),
            transformer_lora_adapter_metadata=model.peft_config["default"].to_dict(),
        )
        with safe_open(os.path.join(d, "pytorch_lora_weights.safetensors"), "pt") as f:
            return f.metadata()


def ace_step_decoder(decoder_state):
    """ACE-Step's decoder attention projections under its own module names."""
    layers = torch.nn.ModuleList()
    n = 1 + max(int(k.split(".")[1]) for k in decoder_state if k.startswith("layers."))
    for i in range(n):
        layer = torch.nn.Module()
        for attn in ["self_attn", "cross_attn"]:
            block = torch.nn.Module()
            for proj in TARGETS:
                w = decoder_state[f"layers.{i}.{attn}.{proj}.weight"].float()
                linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
                with torch.no_grad():  # callers may have gradients on (the fixture scripts)
                    linear.weight.copy_(w)
                setattr(block, proj, linear)
            setattr(layer, attn, block)
        layers.append(layer)
    decoder = torch.nn.Module()
    decoder.layers = layers
    return decoder


def check_case(ostinato, work, name, lora, flags=None, model=MODEL, dit=DIT):
    """The checks above for a run of `model` (its DiT folder `dit`) trained with `flags`,
    or else with `lora` as its config (`lora` describes the adapter either way); returns
    the run's and exports' paths."""
    print(f"\n== {name}: r {lora['r']}, alpha {lora['alpha']}, rsLoRA {lora['use_rslora']}, DoRA {lora.get('use_dora', False)}"
          + (f" ({' '.join(flags)})" if flags else "") + f", {os.path.basename(dit)}")
    paths = train_and_export(ostinato, work, name, flags if flags is not None else config_args(work, name, lora), model)
    peft_file = os.path.join(paths["peft"], "adapter_model.safetensors")
    source = source_weights(dit)
    merged = load_file(paths["merged.safetensors"])
    base = decoder_of(source)
    ours = decoder_of(merged)
    delta = max(max_diff(ours[k], base[k]) for k in ours)
    check(delta > 1e-3, f"the adapter changes the weights (max |merged - base| {delta:.3e})")

    # 1. Header.
    with safe_open(peft_file, "pt") as f:
        header = f.metadata() or {}
    theirs = diffusers_own_metadata(lora)
    check(header.get("format") == "pt", "format: pt")
    ours_meta, theirs_meta = json.loads(header["lora_adapter_metadata"]), json.loads(theirs["lora_adapter_metadata"])
    differing = {k: (v, theirs_meta.get(k)) for k, v in ours_meta.items()
                 if (sorted(v) if isinstance(v, list) else v) != (sorted(theirs_meta.get(k)) if isinstance(theirs_meta.get(k), list) else theirs_meta.get(k))}
    check(not differing, f"lora_adapter_metadata: our {len(ours_meta)} keys equal diffusers' own save's ({differing or 'no difference'})")
    print(f"     keys diffusers also writes (peft's defaults): {sorted(set(theirs_meta) - set(ours_meta))}")

    # 2. diffusers, into a model in eval mode (transformer() sets it) and left as loaded.
    x = inputs(dit)
    reference = forward(transformer(ours, dit), x)
    model = transformer(base, dit)
    state, metadata = AceStepLoraLoaderMixin.lora_state_dict(peft_file, return_lora_metadata=True)
    AceStepLoraLoaderMixin.load_lora_into_transformer(state, transformer=model, metadata=metadata)
    first, second = forward(model, x), forward(model, x)
    check(torch.equal(first, second), f"diffusers + LoRA: two forwards identical (max abs {max_diff(first, second):.3e})")
    err = max_diff(first, reference)
    check(err <= TOL, f"diffusers + LoRA forward vs merged weights' forward: max abs {err:.3e}")
    trained = transformer(base, dit)
    again, _ = AceStepLoraLoaderMixin.lora_state_dict(peft_file, return_lora_metadata=True)
    with_dropout = dict(metadata, **{"transformer.lora_dropout": lora["dropout"]})
    AceStepLoraLoaderMixin.load_lora_into_transformer(again, transformer=trained, metadata=with_dropout)
    a, b = forward(trained, x), forward(trained, x)
    print(f"     (with the run's dropout {lora['dropout']} in the metadata: two forwards differ by {max_diff(a, b):.3e}, "
          f"the merged weights' forward by {max_diff(a, reference):.3e})")
    model.fuse_lora(lora_scale=1.0)
    fused = {k.replace(".base_layer", ""): v for k, v in model.state_dict().items() if "lora_" not in k}
    err = max(max_diff(fused[diffusers_name(k)], v) for k, v in ours.items())
    check(err <= TOL, f"diffusers' fused weights vs --format merged: max abs {err:.3e}")
    bare = transformer(base, dit)
    stripped, _ = AceStepLoraLoaderMixin.lora_state_dict(peft_file, return_lora_metadata=True)
    AceStepLoraLoaderMixin.load_lora_into_transformer(stripped, transformer=bare, metadata=None)
    print(f"     (without the metadata diffusers applies alpha = r: forward off by {max_diff(forward(bare, x), reference):.3e})")

    # 3. PEFT, as ACE-Step loads it (the trigger word in its config passed over).
    with open(os.path.join(paths["peft"], "adapter_config.json")) as f:
        saved = json.load(f)
    check(saved.get("trigger_word") == TRIGGER and saved.get("tag_position") == "prepend",
          f"adapter_config.json carries the trigger word: {saved.get('trigger_word')!r}, {saved.get('tag_position')!r}")
    peft_model = PeftModel.from_pretrained(ace_step_decoder(base), paths["peft"]).merge_and_unload()
    err = max(max_diff(w, ours[k]) for k, w in peft_model.state_dict().items())
    check(err <= TOL, f"PeftModel.from_pretrained(decoder).merge_and_unload() vs --format merged: max abs {err:.3e}")

    # 4. The drop-in model folder.
    full_dir = paths["acestep-v15-merged"]
    full = load_file(os.path.join(full_dir, "model.safetensors"))
    check(set(full) == set(source), f"merged --full holds all {len(source)} tensors of {', '.join(weight_files(dit))}")
    check(all(full[k].dtype == v.dtype for k, v in source.items()), "each in the source dtype")
    err = max(max_diff(full["decoder." + k], v) for k, v in ours.items())
    check(err <= TOL, f"its decoder vs --format merged: max abs {err:.3e}")
    same = all(torch.equal(full[k], v) for k, v in source.items() if not k.startswith("decoder."))
    check(same, "every other tensor unchanged")
    weights = set(weight_files(dit)) | {INDEX}
    others = sorted(f for f in os.listdir(dit) if f not in weights)
    copied = all(open(os.path.join(dit, f), "rb").read() == open(os.path.join(full_dir, f), "rb").read() for f in others)
    check(copied, f"the folder's other files copied: {others}")
    check(sorted(os.listdir(full_dir)) == sorted(others + ["model.safetensors"]), "and nothing else (no shards, no index)")
    err = max_diff(forward(transformer(decoder_of(full), dit), x), reference)
    check(err <= TOL, f"diffusers' transformer from the merged folder: forward max abs {err:.3e}")

    # 5. Modes.
    files = [peft_file, os.path.join(paths["peft"], "adapter_config.json"), paths["merged.safetensors"]]
    files += [os.path.join(full_dir, f) for f in os.listdir(full_dir)]
    for sub in ["final/adapter"] + [f"checkpoints/{c}/adapter" for c in os.listdir(os.path.join(paths["run"], "checkpoints"))]:
        d = os.path.join(paths["run"], sub)
        files += [os.path.join(d, f) for f in os.listdir(d)]
    modes = {os.path.relpath(f, work): oct(stat.S_IMODE(os.stat(f).st_mode)) for f in files}
    check(all(m == "0o644" for m in modes.values()), f"mode 0644: {len(modes)} files ({sorted(set(modes.values()))})")
    return paths


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ostinato", default=os.path.join(ROOT, "target", "debug", "ostinato"))
    args = parser.parse_args()
    import diffusers, peft
    print(f"torch {torch.__version__}, diffusers {diffusers.__version__}, peft {peft.__version__}")
    work = tempfile.mkdtemp(prefix="ostinato-exports-")
    try:
        for name, lora in [
            # Dropout 0.1, ACE-Step's and Ostinato's default: the export must not carry it.
            ("alpha-ne-r", dict(r=4, alpha=12.0, use_rslora=False, dropout=0.1)),
            ("rslora", dict(r=4, alpha=12.0, use_rslora=True, dropout=0.1)),
        ]:
            check_case(args.ostinato, work, name, lora)
        check_case(args.ostinato, work, "xl", dict(r=4, alpha=12.0, use_rslora=False, dropout=0.1), model=XL_MODEL, dit=XL_DIT)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\nall checks passed")


if __name__ == "__main__":
    main()
