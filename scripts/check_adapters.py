"""Checks Ostinato's LoKr and DoRA adapters with the real loaders (not CI; run through
scripts/check-exports, after check_exports.py).

For runs trained for a few steps by the `ostinato` binary on the tiny real model folder
(engine/tests/fixtures/real/model), and LoKr + DoRA and DoRA again on the tiny XL one
(engine/tests/fixtures/real_xl/model, its weights in shards):

1. LoKr (upstream's defaults; rank 4, alpha 8, factor 2; decompose-both with DoRA at rank 1,
   the rank at which the tiny model's smaller Kronecker half is factorized too):
   `final/adapter/lokr_weights.safetensors` (equal to `--format lycoris`) loaded as upstream
   ACE-Step loads it (acestep/core/generation/handler/lora/lifecycle.py, _load_lokr_adapter,
   ace-step/ACE-Step-1.5 @ 46d5b880a7db9701549133cc666835d6b631d55a): LyCORIS's
   apply_preset + create_lycoris on the decoder with the header's `lokr_config`, apply_to,
   load_weights (its scale comes from the header: LyCORIS does not read the alpha tensors
   back into it); and by LyCORIS's create_lycoris_from_weights (scale from the alpha
   tensors). Upstream's call names targets that match no module path, so LyCORIS adapts
   every Linear: the decoder is built of the projections only. Each must consume every
   tensor of the file, and the weight each adapted Linear applies (its output on the
   identity: W + scale * kron(w1, w2), DoRA rescaled) must equal `--format merged` to 1e-5.
   LyCORIS's own merge (get_merged_weight) applies scale twice, so it is printed, not checked.
2. DoRA LoRA (rank 4, alpha 12): check_exports.py's checks (diffusers' header, diffusers'
   loader forward and fuse, PEFT's merge_and_unload as ACE-Step loads it, the merged model
   folder, modes), all against `--format merged`.
3. ComfyUI (comfyui_lora.py, its key map and loaders rewritten from reading ComfyUI): every
   key of the LoKr files, of the `--format comfyui` files and of the DoRA PEFT file must be
   read and map to one of the decoder's adapted weights, and ComfyUI's merge of the
   comfyui files must equal `--format merged` to 1e-5. Known limitations are printed, not
   failed: ComfyUI ignores PEFT's `lora_magnitude_vector` (it reads only `dora_scale`) and
   a PEFT file's alpha (adapter_config.json), and its DoRA divides by the norms of W, not
   W + delta, so upstream's LoKr+DoRA file merges differently there.

Prints each count and measured difference; exits non-zero on the first failure.
"""

import argparse
import collections
import importlib.metadata
import json
import logging
import os
import re
import shutil
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from lycoris import LycorisNetwork, create_lycoris, create_lycoris_from_weights

import comfyui_lora
from check_exports import (DIT, MODEL, ROOT, TOL, XL_DIT, XL_MODEL, ace_step_decoder, check, check_case, decoder_of,
                           export, max_diff, source_weights, train)

logging.getLogger("LyCORIS").setLevel(logging.WARNING)
ADAPTED = re.compile(r"layers\.\d+\.(self|cross)_attn\.[qkvo]_proj\.weight")
# name, flags, the lokr_config they must write.
LOKR_CASES = [
    # Upstream's defaults (dim 64, alpha 128): both Kronecker halves whole matrices, scale 1.
    ("lokr-default", ["--adapter", "lokr"],
     dict(linear_dim=64, linear_alpha=128.0, factor=-1, decompose_both=False, weight_decompose=False)),
    ("lokr-factor2", ["--adapter", "lokr", "--rank", "4", "--alpha", "8", "--factor", "2"],
     dict(linear_dim=4, linear_alpha=8.0, factor=2, decompose_both=False, weight_decompose=False)),
    ("lokr-both-dora", ["--adapter", "lokr", "--decompose-both", "--dora", "--rank", "1", "--alpha", "2"],
     dict(linear_dim=1, linear_alpha=2.0, factor=-1, decompose_both=True, weight_decompose=True)),
]
DORA = ("dora", dict(r=4, alpha=12.0, use_rslora=False, dropout=0.1, use_dora=True),
        ["--dora", "--rank", "4", "--alpha", "12"])


def effective_weights(decoder):
    """The weight each Linear applies, as its output on the identity (bias-free)."""
    return {f"{name}.weight": m(torch.eye(m.in_features)).T
            for name, m in decoder.named_modules() if isinstance(m, torch.nn.Linear)}


def upstream_load(decoder, path):
    """ACE-Step's _load_lokr_adapter: the LyCORIS network the file's header describes."""
    with safe_open(path, "pt") as f:
        config = json.loads(f.metadata()["lokr_config"])
    LycorisNetwork.apply_preset({"unet_target_name": config["target_modules"], "target_name": config["target_modules"]})
    net = create_lycoris(
        decoder, 1.0, linear_dim=config["linear_dim"], linear_alpha=config["linear_alpha"], algo="lokr",
        factor=config["factor"], decompose_both=config["decompose_both"], use_tucker=config["use_tucker"],
        use_scalar=config["use_scalar"], full_matrix=config["full_matrix"], bypass_mode=config["bypass_mode"],
        rs_lora=config["rs_lora"], unbalanced_factorization=config["unbalanced_factorization"],
        # Upstream creates the network again with dora_wd=True when weight_decompose is set.
        **({"dora_wd": True} if config["weight_decompose"] else {}),
    )
    net.apply_to()
    return net, net.load_weights(path)


def check_network(what, net, decoder, tensors, merged):
    state = net.state_dict()
    check(len(net.loras) == len(merged), f"{what}: {len(net.loras)} modules, all {len(merged)} projections")
    # With both Kronecker halves whole, LyCORIS uses scale 1 whatever alpha is: it saves
    # alpha = dim, and create_lycoris_from_weights, which cannot know dim, sets 1.
    whole = {f"{lora.lora_name}.alpha" for lora in net.loras if lora.use_w1 and lora.use_w2}
    differing = sorted(k for k in tensors if k in state and not torch.equal(state[k].float(), tensors[k].float()))
    check(set(state) == set(tensors) and set(differing) <= whole,
          f"{what}: holds every tensor of the file, and only those ({len(state)} of {len(tensors)}"
          + (f"; LyCORIS replaced the alpha of {len(differing)} modules with whole halves, "
             f"{float(tensors[differing[0]])} -> {float(state[differing[0]])}, scale 1 either way" if differing else "")
          + ")")
    net.eval()
    applied = effective_weights(decoder.eval())
    err = max(max_diff(applied[k], merged[k]) for k in merged)
    check(err <= TOL, f"{what}: the weight each adapted Linear applies vs --format merged: max abs {err:.3e}")


def check_lokr_case(ostinato, work, name, flags, expected, model=MODEL, dit=DIT):
    print(f"\n== {name}: {' '.join(flags)}, {os.path.basename(dit)}")
    run = train(ostinato, work, name, flags, model)
    out = os.path.join(work, name)
    lycoris_dir = export(ostinato, run, "lycoris", os.path.join(out, "lycoris"))
    merged_file = export(ostinato, run, "merged", os.path.join(out, "merged.safetensors"))
    comfyui_file = export(ostinato, run, "comfyui", os.path.join(out, "comfyui.safetensors"))
    path = os.path.join(run, "final", "adapter", "lokr_weights.safetensors")

    base = decoder_of(source_weights(dit))
    ours = decoder_of(load_file(merged_file))
    merged = {k: v for k, v in ours.items() if ADAPTED.fullmatch(k)}
    delta = max(max_diff(merged[k], base[k]) for k in merged)
    check(delta > 1e-3, f"the adapter changes the weights (max |merged - base| {delta:.3e})")
    check(all(torch.equal(v, base[k]) for k, v in ours.items() if k not in merged),
          f"--format merged: the other {len(ours) - len(merged)} decoder tensors unchanged")

    tensors = load_file(path)
    with safe_open(path, "pt") as f:
        header = f.metadata()
    exported = os.path.join(lycoris_dir, "lokr_weights.safetensors")
    with safe_open(exported, "pt") as f:
        same = f.metadata() == header and sorted(f.keys()) == sorted(tensors)
        same = same and all(torch.equal(f.get_tensor(k), tensors[k]) for k in tensors)
    check(same, "--format lycoris writes the run's final/adapter/lokr_weights.safetensors (tensors and header)")
    config = json.loads(header["lokr_config"])
    check(header["algo"] == "lokr" and header["format"] == "lycoris", "header: algo lokr, format lycoris")
    differing = {k: (config.get(k), v) for k, v in expected.items() if config.get(k) != v}
    check(not differing, f"lokr_config has the run's settings ({differing or expected})")
    kinds = collections.Counter(k.split(".", 1)[1] for k in tensors)
    print(f"     {len(tensors)} tensors: {dict(sorted(kinds.items()))}")

    # 1. As upstream ACE-Step loads it.
    decoder = ace_step_decoder(base)
    net, state = upstream_load(decoder, path)
    check(not state, f"upstream's create_lycoris + load_weights: no missing or unexpected keys ({state or 'none'})")
    check_network("upstream's load", net, decoder, tensors, merged)
    scales = sorted({float(lora.scale) for lora in net.loras})
    lib_merge = {f"{lora.lora_name[len('lycoris_'):]}": lora.get_merged_weight(multiplier=1)[0] for lora in net.loras}
    applied = effective_weights(decoder)
    off = max(max_diff(lib_merge[k[:-len(".weight")].replace(".", "_")], applied[k]) for k in merged)
    print(f"     (LyCORIS scale {scales}; its get_merged_weight, which applies scale twice, is off the forward's by {off:.3e})")

    decoder = ace_step_decoder(base)
    net, _ = create_lycoris_from_weights(1.0, path, decoder)
    net.apply_to()
    check_network("create_lycoris_from_weights", net, decoder, tensors, merged)

    # 3. ComfyUI.
    dora = expected["weight_decompose"]
    check_comfyui("lokr_weights.safetensors", path, base, merged,
                  "ComfyUI's DoRA divides by |W|, LyCORIS's by |W + delta|" if dora else None)
    check_comfyui("--format comfyui", comfyui_file, base, merged, None)


def check_comfyui(what, path, base, merged, known_merge_difference, known_unread=()):
    """Every key of the file read by ComfyUI's loaders and mapped to an adapted decoder weight
    of `base` (the decoder's tensors); ComfyUI's merge equal to `merged` unless
    `known_merge_difference` says why not."""
    lora = load_file(path)
    model = comfyui_lora.model_keys(["decoder." + k for k in base])
    patches, read = comfyui_lora.load(lora, comfyui_lora.key_map(model))
    unread = set(lora) - read
    known = {k for k in unread if k.endswith(known_unread)} if known_unread else set()
    kinds = collections.Counter(re.sub(r"^.*?\.(?=(alpha|dora_scale|lora_|lokr_))", "", k) for k in read)
    print(f"     ComfyUI, {what}: {len(lora)} keys, {len(read)} read {dict(sorted(kinds.items()))}")
    if known:
        print(f"     known limitation: ComfyUI leaves {len(known)} keys unread ({sorted({k.rsplit('.', 1)[1] for k in known})}), "
              f"e.g. {sorted(known)[0]}")
    check(unread == known, f"ComfyUI, {what}: every other key read ({len(unread - known)} unread"
          + (f": {sorted(unread - known)[:4]}" if unread - known else "") + ")")
    targets = sorted(patches)
    expected = sorted("diffusion_model.decoder." + k for k in merged)
    check(targets == expected, f"ComfyUI, {what}: patches the {len(expected)} adapted decoder weights, only those "
          f"({len(targets)})")
    err = max(max_diff(comfyui_lora.merged_weight(patches["diffusion_model.decoder." + k], base[k]), w)
              for k, w in merged.items())
    if known_merge_difference:
        print(f"     (known: ComfyUI's merge of {what} is off --format merged by {err:.3e}: {known_merge_difference})")
    else:
        check(err <= TOL, f"ComfyUI, {what}: its merge vs --format merged: max abs {err:.3e}")


def check_dora(ostinato, work, model=MODEL, dit=DIT):
    name, lora, flags = DORA
    name = f"{name}-{os.path.basename(dit)}"
    paths = check_case(ostinato, work, name, lora, flags, model, dit)
    base = decoder_of(source_weights(dit))
    merged = {k: v for k, v in decoder_of(load_file(paths["merged.safetensors"])).items() if ADAPTED.fullmatch(k)}
    comfyui_file = export(ostinato, paths["run"], "comfyui", os.path.join(work, name, "comfyui.safetensors"))
    check_comfyui("--format comfyui", comfyui_file, base, merged, None)
    check_comfyui("PEFT adapter_model.safetensors", os.path.join(paths["peft"], "adapter_model.safetensors"), base,
                  merged, "no lora_magnitude_vector read, and no alpha in the file: scale 1, not alpha / r "
                  f"= {lora['alpha'] / lora['r']:g}", known_unread=(".lora_magnitude_vector",))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ostinato", default=os.path.join(ROOT, "target", "debug", "ostinato"))
    args = parser.parse_args()
    versions = {p: importlib.metadata.version(p) for p in ["torch", "lycoris-lora", "peft", "diffusers"]}
    print(", ".join(f"{p} {v}" for p, v in versions.items()))
    work = tempfile.mkdtemp(prefix="ostinato-adapters-")
    try:
        for name, flags, expected in LOKR_CASES:
            check_lokr_case(args.ostinato, work, name, flags, expected)
        check_dora(args.ostinato, work)
        name, flags, expected = LOKR_CASES[2]
        check_lokr_case(args.ostinato, work, f"{name}-xl", flags, expected, XL_MODEL, XL_DIT)
        check_dora(args.ostinato, work, XL_MODEL, XL_DIT)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\nall checks passed")


if __name__ == "__main__":
    main()
