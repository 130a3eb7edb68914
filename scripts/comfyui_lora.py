"""ComfyUI's adapter loading for ACE-Step 1.5, rewritten from reading its source (ComfyUI
is not on PyPI): which file keys it maps to which model weight, which keys it reads, and
the weight it merges at strength 1. Read in Comfy-Org/ComfyUI:

  comfy/lora.py @ ec93dcacb96b922f7cb1417b3ba22bccb082df32: model_lora_keys_unet (the
      generic `diffusion_model.` keys, and the ACEStep15 branch's `base_model.model.` and
      `lycoris_` keys for the decoder; unet_to_diffusers adds none for a DiT, its config has
      no num_res_blocks) and load_lora (`.alpha`, `.dora_scale`, then each adapter's load);
  comfy/weight_adapter/lora.py @ 6f98b150e065f1ffc788558574a887835068bd40 (LoRAAdapter);
  comfy/weight_adapter/lokr.py @ 2bffe2f4ce5763dcb83df6a670657b6d5c8f85a5 (LoKrAdapter);
  comfy/weight_adapter/base.py @ 9c0cf36cd7964978850fd40f8cf76ac2cf9f9e15 (weight_decompose).

Only the LoRA and LoKr adapters are reproduced, without LoRA's `lora_mid` / `reshape_weight`
and LoKr's Tucker `lokr_t2` / `row_offset`: a key only those would read counts as unread
here, so a check built on this can fail where ComfyUI would not, never pass where it would not.
"""

import torch

# (up, down) key suffixes LoRAAdapter.load tries, in its order.
LORA_NAMES = [
    (".lora_up.weight", ".lora_down.weight"),
    ("_lora.up.weight", "_lora.down.weight"),
    (".lora_B.weight", ".lora_A.weight"),
    (".lora.up.weight", ".lora.down.weight"),
    (".lora_B", ".lora_A"),
    (".lora_linear_layer.up.weight", ".lora_linear_layer.down.weight"),
    (".lora_B.default.weight", ".lora_A.default.weight"),
]
LOKR_NAMES = ["lokr_w1", "lokr_w2", "lokr_w1_a", "lokr_w1_b", "lokr_w2_a", "lokr_w2_b"]


def model_keys(checkpoint_keys):
    """ComfyUI's state-dict keys of an ACE-Step 1.5 model: the checkpoint's (`decoder.`,
    `encoder.`, ...) under `diffusion_model.`; its modules carry the checkpoint's names."""
    return ["diffusion_model." + k for k in checkpoint_keys]


def key_map(sdk):
    """model_lora_keys_unet for an ACEStep15 model: adapter key prefix -> model key."""
    keys = {}
    for k in sdk:
        if not k.startswith("diffusion_model."):
            continue
        if k.endswith(".weight"):
            path = k[len("diffusion_model."):-len(".weight")]
            keys["lora_unet_" + path.replace(".", "_")] = k
            keys[k[:-len(".weight")]] = k
        else:
            keys[k] = k
    for k in sdk:
        if k.startswith("diffusion_model.decoder.") and k.endswith(".weight"):
            path = k[len("diffusion_model.decoder."):-len(".weight")]
            keys["base_model.model." + path] = k
            keys["lycoris_" + path.replace(".", "_")] = k
    return keys


def load(lora, keys):
    """load_lora: ({model key: (kind, tensors, alpha, dora_scale)}, the file keys it read)."""
    patches, read = {}, set()
    for x, target in keys.items():
        alpha = dora_scale = None
        if f"{x}.alpha" in lora:
            alpha = lora[f"{x}.alpha"].item()
            read.add(f"{x}.alpha")
        if f"{x}.dora_scale" in lora:
            dora_scale = lora[f"{x}.dora_scale"]
            read.add(f"{x}.dora_scale")
        for up, down in LORA_NAMES:
            if x + up in lora:
                patches[target] = ("lora", {"up": lora[x + up], "down": lora[x + down]}, alpha, dora_scale)
                read |= {x + up, x + down}
                break
        lokr = {n: lora[f"{x}.{n}"] for n in LOKR_NAMES if f"{x}.{n}" in lora}
        read |= {f"{x}.{n}" for n in lokr}
        if any(n in lokr for n in ["lokr_w1", "lokr_w2", "lokr_w1_a", "lokr_w2_a"]):
            patches[target] = ("lokr", lokr, alpha, dora_scale)
    return patches, read


def merged_weight(patch, weight):
    """calculate_weight at strength 1 in float32: the weight ComfyUI runs the model with."""
    kind, t, alpha, dora_scale = patch
    weight = weight.float()
    if kind == "lora":
        down = t["down"].float()
        diff = t["up"].float().flatten(1) @ down.flatten(1)
        scale = alpha / down.shape[0] if alpha is not None else 1.0
    else:
        dim = None
        if "lokr_w1" in t:
            w1 = t["lokr_w1"].float()
        else:
            dim = t["lokr_w1_b"].shape[0]
            w1 = t["lokr_w1_a"].float() @ t["lokr_w1_b"].float()
        if "lokr_w2" in t:
            w2 = t["lokr_w2"].float()
        else:
            dim = t["lokr_w2_b"].shape[0]
            w2 = t["lokr_w2_a"].float() @ t["lokr_w2_b"].float()
        scale = alpha / dim if alpha is not None and dim is not None else 1.0
        diff = torch.kron(w1, w2)
    diff = diff.reshape(weight.shape)
    if dora_scale is None:
        return weight + scale * diff
    return weight_decompose(dora_scale.float(), weight, diff, scale)


def weight_decompose(dora_scale, weight, diff, scale):
    """DoRA: W + scale * diff rescaled by dora_scale over the row norms of the *base* weight
    when dora_scale is [out, 1], else over the column norms of W + scale * diff, plus eps."""
    adapted = weight + scale * diff
    if dora_scale.shape[0] == adapted.shape[0]:
        norm = weight.reshape(weight.shape[0], -1).norm(dim=1, keepdim=True)
    else:
        norm = adapted.transpose(0, 1).reshape(adapted.shape[1], -1).norm(dim=1, keepdim=True).transpose(0, 1)
    return adapted * (dora_scale / (norm + torch.finfo(weight.dtype).eps))
