"""Reference numbers for LoKr and DoRA adapters on the tiny DiT (see make-adapter-fixtures).

Not run in CI; the files it writes are committed:
engine/tests/fixtures/adapters_tiny.{safetensors,json}. Made with torch 2.15, peft 0.21.2,
lycoris-lora 4.1.3 and diffusers 0.42.1, float32 on the CPU (the json records the versions).

diffusers' `AceStepTransformer1DModel` is built from the shared `dit_tiny` fixture's
decoder weights and first checked against its `out.base` (to 1e-5). Then, on the q/k/v/o
projections of both attentions of every layer (32 modules), each case adds an adapter the
way ACE-Step 1.5 trains it, replaces every adapter tensor by seeded random values (so the
effect and every gradient are non-trivial) and records:

  lokr_default     LyCORIS LoKr, ACE-Step's defaults: dim 64, alpha 128, factor -1
                   (both Kronecker halves full matrices here, so LyCORIS uses scale 1)
  lokr_factor2     dim 4, alpha 8, factor 2: w1 full, w2 = w2_a @ w2_b, scale 2
  lokr_both_dora   dim 2, alpha 3, decompose_both, weight_decompose (LyCORIS' DoRA)
  dora             PEFT LoraConfig(r=4, lora_alpha=8, use_dora=True)

per case: the adapter tensors (under ACE-Step's module names), the output on the
fixture's batch, the MSE loss against `in.target`, its gradient w.r.t. every adapter
tensor, and merged weights. Checked on the way (exit non-zero on failure):

  - LyCORIS/PEFT adapt exactly the 32 modules (and what ACE-Step's own LyCORIS call
    adapts is recorded: more than that, see the json notes);
  - the model with the merged weights and no adapter reproduces the adapted output;
  - whether each library's DoRA norm carries gradient (finite differences in float64).
"""

import importlib.metadata
import json
import os
import re
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from diffusers.models.transformers.ace_step_transformer import AceStepTransformer1DModel
from lycoris import LycorisNetwork, create_lycoris
from lycoris.functional.general import weight_decompose
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

# One table of diffusers/ACE-Step name pairs, the fixture script's.
from make_real_fixtures import diffusers_names

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OUT = os.path.join(ROOT, "engine", "tests", "fixtures")
FIXTURES = os.environ.get("OSTINATO_FIXTURES", os.path.join(ROOT, "..", "shared", "fixtures"))
CONFIG_KEYS = [
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "in_channels", "audio_acoustic_hidden_dim", "patch_size", "sliding_window", "rope_theta",
    "rms_norm_eps", "layer_types",
]
# diffusers' projection name -> ACE-Step's.
PROJECTIONS = {"to_q": "q_proj", "to_k": "k_proj", "to_v": "v_proj", "to_out.0": "o_proj"}
ACE_STEP_TARGETS = list(PROJECTIONS.values())
MODULE_PATTERN = re.compile(r"layers\.(\d+)\.(self_attn|cross_attn)\.(to_q|to_k|to_v|to_out\.0)$")
BASE_TOL = 1e-5
MERGE_TOL = 1e-5
# Merged weights are stored for two modules only, to keep the file small (the decoder copy
# alone is 1.3 MB): one square and one not, in different layers and attentions. The check
# that the merged weights reproduce the adapted forward covers all 32.
MERGED_MODULES = ["layers.0.self_attn.q_proj", "layers.3.cross_attn.v_proj"]

# Standard deviations of the random adapter tensors: each case's weight change comes out
# at ~0.015 per element, against base weights ~N(0, 0.05).
LOKR_CASES = {
    "lokr_default": dict(config=dict(linear_dim=64, linear_alpha=128, factor=-1, decompose_both=False,
                                     weight_decompose=False),
                         std={"lokr_w1": 0.12, "lokr_w2": 0.12}),
    "lokr_factor2": dict(config=dict(linear_dim=4, linear_alpha=8, factor=2, decompose_both=False,
                                     weight_decompose=False),
                         std={"lokr_w1": 1.0, "lokr_w2_a": 0.06, "lokr_w2_b": 0.06}),
    "lokr_both_dora": dict(config=dict(linear_dim=2, linear_alpha=3, factor=-1, decompose_both=True,
                                       weight_decompose=True),
                           std={p: 0.26 for p in ["lokr_w1_a", "lokr_w1_b", "lokr_w2_a", "lokr_w2_b"]}),
}
DORA_CASE = dict(r=4, alpha=8, std={"lora_A": 0.06, "lora_B": 0.06})
MAGNITUDE_JITTER = 0.05
SEED = 2024


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        sys.exit(1)


def max_diff(a, b):
    return float((a - b).abs().max())


def ace_step_module(diffusers_module):
    """`layers.0.self_attn.to_out.0` -> `layers.0.self_attn.o_proj`."""
    layer, attn, proj = MODULE_PATTERN.search(diffusers_module).groups()
    return f"layers.{layer}.{attn}.{PROJECTIONS[proj]}"


def target_modules(model):
    """The 32 attention projections, by diffusers path."""
    return sorted(n for n, m in model.named_modules() if MODULE_PATTERN.fullmatch(n))


def load_dit_tiny():
    config = json.load(open(os.path.join(FIXTURES, "dit_tiny.json")))["config"]
    tensors = load_file(os.path.join(FIXTURES, "dit_tiny.safetensors"))
    return config, tensors


def transformer(config, tensors):
    """diffusers' ACE-Step transformer on dit_tiny's decoder, float32, train mode, frozen."""
    model = AceStepTransformer1DModel(**{k: config[k] for k in CONFIG_KEYS}, is_turbo=True, model_version="turbo")
    decoder = {k[len("decoder."):]: v for k, v in tensors.items() if k.startswith("decoder.")}
    model.load_state_dict(diffusers_names(decoder), strict=True)
    model.requires_grad_(False)
    for name in target_modules(model):
        assert model.get_submodule(name).bias is None, f"{name} has a bias"
    return model.float().train()


def forward(model, tensors):
    return model(
        hidden_states=tensors["in.hidden_states"], timestep=tensors["in.timestep"],
        timestep_r=tensors["in.timestep_r"], encoder_hidden_states=tensors["in.encoder_hidden_states"],
        context_latents=tensors["in.context_latents"], return_dict=False,
    )[0]


def effective_weight(linear):
    """The weight an adapted bias-free Linear applies: its output on the identity."""
    with torch.no_grad():
        return linear(torch.eye(linear.in_features)).T.contiguous()


def merged_forward_error(config, tensors, merged, out):
    """max |forward with merged weights (no adapter) - adapted forward|."""
    plain = transformer(config, tensors)
    with torch.no_grad():
        for name, weight in merged.items():
            plain.get_submodule(name).weight.copy_(weight)
        return max_diff(forward(plain, tensors), out)


def randomize(params, std, generator):
    """Seeded N(0, std) for the factors; magnitudes jittered around their initial value."""
    with torch.no_grad():
        for name, p in params:
            if name in ("dora_scale", "lora_magnitude_vector"):
                p.mul_(1 + MAGNITUDE_JITTER * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * std[name])


def lycoris_network(model, config, targets):
    """ACE-Step's call: apply_preset(unet_target_name/target_name) + create_lycoris(...)."""
    LycorisNetwork.apply_preset({"unet_target_name": targets, "target_name": targets})
    return create_lycoris(
        model, 1.0, linear_dim=config["linear_dim"], linear_alpha=config["linear_alpha"], algo="lokr",
        factor=config["factor"], decompose_both=config["decompose_both"], dora_wd=config["weight_decompose"],
    )


def upstream_selection(config, tensors):
    """What ACE-Step's own call (its target names, LyCORIS' default module classes) adapts."""
    default_classes = list(LycorisNetwork.TARGET_REPLACE_MODULE)
    net = lycoris_network(transformer(config, tensors), LOKR_CASES["lokr_default"]["config"], ACE_STEP_TARGETS)
    names = sorted(lora.lora_name for lora in net.loras)
    print(f"     ACE-Step's call (target names {ACE_STEP_TARGETS}, module classes {default_classes}) "
          f"adapts {len(names)} modules of diffusers' transformer")
    return {"target_replace_module": default_classes, "lora_names": names}


def lokr_case(case, spec, config, tensors, generator):
    model = transformer(config, tensors)
    targets = target_modules(model)
    # Only the attention projections: no module class matched wholesale, full-path names.
    LycorisNetwork.apply_preset({"target_module": []})
    net = lycoris_network(model, spec["config"], [rf"{re.escape(t)}$" for t in targets])
    net.apply_to()
    by_module = {lora.org_module[0]: lora for lora in net.loras}
    adapted = sorted(n for n, m in model.named_modules() if m in by_module)
    check(adapted == targets and len(net.loras) == 32, f"{case}: LyCORIS adapts exactly the 32 projections")
    loras = {ace_step_module(n): by_module[model.get_submodule(n)] for n in targets}

    params = {m: sorted(lora.named_parameters()) for m, lora in loras.items()}
    for m in sorted(params):
        randomize(params[m], spec["std"], generator)
    scales = {float(lora.scale) for lora in loras.values()}
    alphas = {float(lora.alpha) for lora in loras.values()}
    check(len(scales) == 1 and len(alphas) == 1, f"{case}: one scale {scales} and alpha {alphas} for every module")

    out, loss, grads = loss_and_grads(model, tensors, params)
    tensors_out = case_tensors(case, params, out, loss, grads)

    # The weight the forward applies, against LyCORIS' own merge (get_merged_weight, which
    # merge_to uses) and the plain model carrying it.
    effective = {ace_step_module(n): effective_weight(model.get_submodule(n)) for n in targets}
    lib_merge = {m: lora.get_merged_weight(multiplier=1)[0].detach() for m, lora in loras.items()}
    lib_vs_forward = max(max_diff(lib_merge[m], effective[m]) for m in loras)
    if not spec["config"]["weight_decompose"]:
        # The difference is the scale applied twice: W + scale * (forward's dW).
        scale = float(next(iter(loras.values())).scale)
        base = {m: lora.org_module[0].weight.detach() for m, lora in loras.items()}
        twice = max(max_diff(lib_merge[m], base[m] + scale * (effective[m] - base[m])) for m in loras)
        check(twice <= MERGE_TOL, f"{case}: LyCORIS' merge = W + scale * (forward's dW), scale {scale}: max abs {twice:.3e}")
    err = merged_forward_error(config, tensors, {n: effective[ace_step_module(n)] for n in targets}, out)
    check(err <= MERGE_TOL, f"{case}: forward of the merged weights vs the adapted forward: max abs {err:.3e}")
    print(f"     LyCORIS get_merged_weight(multiplier=1) vs the weight its forward applies: max abs {lib_vs_forward:.3e}")
    for m in MERGED_MODULES:
        tensors_out[f"{case}.merged.{m}.weight"] = effective[m]

    # What save_weights writes, for one module.
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "lokr_weights.safetensors")
        net.save_weights(path, dtype=None, metadata={"algo": "lokr", "format": "lycoris"})
        with safe_open(path, "pt") as f:
            saved = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    one = "lycoris_layers_0_cross_attn_to_k."
    saved_keys = sorted(k for k in saved if k.startswith(one))
    check(len(saved) == sum(len(lora.state_dict()) for lora in net.loras),
          f"{case}: save_weights writes {len(saved)} tensors, {len(saved_keys)} per module: {saved_keys}")

    effect = max_diff(out, tensors["out.base"])
    meta = {
        "kind": "lokr",
        "config": {**spec["config"], "use_tucker": False, "use_scalar": False, "target_modules": ACE_STEP_TARGETS,
                   "full_matrix": False, "bypass_mode": False, "rs_lora": False, "unbalanced_factorization": False},
        "modules": sorted(loras),
        "scale": scales.pop(),
        "alpha_buffer": alphas.pop(),
        "shapes": {m: {p: list(t.shape) for p, t in params[m]} for m in sorted(params)},
        "saved_keys": saved_keys,
        "saved_shapes": {k: saved[k] for k in saved_keys},
        "lycoris_merge_vs_forward_max_abs": lib_vs_forward,
        "merged_forward_max_abs": err,
        "effect": effect,
        "loss": float(loss),
    }
    return tensors_out, meta


def dora_case(case, config, tensors, generator):
    model = transformer(config, tensors)
    targets = target_modules(model)
    lora_config = LoraConfig(r=DORA_CASE["r"], lora_alpha=DORA_CASE["alpha"], use_dora=True, lora_dropout=0.0,
                             target_modules=list(PROJECTIONS))
    peft_model = get_peft_model(model, lora_config)
    adapted = sorted(n[len("base_model.model."):] for n, m in peft_model.named_modules() if hasattr(m, "lora_A"))
    check(adapted == targets, f"{case}: PEFT adapts exactly the 32 projections")

    layers = {ace_step_module(n): model.get_submodule(n) for n in targets}
    scalings = {layer.scaling["default"] for layer in layers.values()}
    check(len(scalings) == 1, f"{case}: one scaling {scalings}")
    params = {}
    for m, layer in layers.items():
        params[m] = sorted([
            ("lora_A", layer.lora_A["default"].weight), ("lora_B", layer.lora_B["default"].weight),
            ("lora_magnitude_vector", layer.lora_magnitude_vector["default"].weight),
        ])
    for m in sorted(params):
        randomize(params[m], DORA_CASE["std"], generator)

    out, loss, grads = loss_and_grads(model, tensors, params)
    names = {"lora_A": "lora_A.weight", "lora_B": "lora_B.weight", "lora_magnitude_vector": "lora_magnitude_vector"}
    renamed = {m: [(names[p], t) for p, t in ps] for m, ps in params.items()}
    grads = {m: [(names[p], g) for p, g in gs] for m, gs in grads.items()}
    tensors_out = case_tensors(case, renamed, out, loss, grads)

    state = get_peft_model_state_dict(peft_model)
    one = "base_model.model.layers.0.cross_attn.to_k."
    saved_keys = sorted(k for k in state if k.startswith(one))
    print(f"     get_peft_model_state_dict: {len(state)} tensors, per module {saved_keys}")

    effective = {m: effective_weight(layer) for m, layer in layers.items()}
    merged = peft_model.merge_and_unload()
    peft_merge = {ace_step_module(n): merged.get_submodule(n).weight.detach() for n in targets}
    peft_vs_forward = max(max_diff(peft_merge[m], effective[m]) for m in layers)
    print(f"     PEFT merge_and_unload vs the weight its forward applies: max abs {peft_vs_forward:.3e}")
    err = merged_forward_error(config, tensors, {n: peft_merge[ace_step_module(n)] for n in targets}, out)
    check(err <= MERGE_TOL, f"{case}: forward of PEFT's merged weights vs the adapted forward: max abs {err:.3e}")
    for m in MERGED_MODULES:
        tensors_out[f"{case}.merged.{m}.weight"] = peft_merge[m].contiguous()

    effect = max_diff(out, tensors["out.base"])
    meta = {
        "kind": "lora",
        "config": {"r": DORA_CASE["r"], "alpha": DORA_CASE["alpha"], "dropout": 0.0, "use_dora": True,
                   "target_modules": ACE_STEP_TARGETS},
        "modules": sorted(layers),
        "scale": scalings.pop(),
        "shapes": {m: {p: list(t.shape) for p, t in renamed[m]} for m in sorted(renamed)},
        "saved_keys": saved_keys,
        "saved_shapes": {k: list(state[k].shape) for k in saved_keys},
        "peft_merge_vs_forward_max_abs": peft_vs_forward,
        "merged_forward_max_abs": err,
        "effect": effect,
        "loss": float(loss),
    }
    return tensors_out, meta


def loss_and_grads(model, tensors, params):
    out = forward(model, tensors)
    loss = F.mse_loss(out, tensors["in.target"])
    flat = [p for m in sorted(params) for _, p in params[m]]
    grads = iter(torch.autograd.grad(loss, flat))
    per_module = {m: [(name, next(grads)) for name, _ in params[m]] for m in sorted(params)}
    return out.detach(), loss.detach().reshape(1), per_module


def case_tensors(case, params, out, loss, grads):
    smallest = min(float(g.abs().max()) for m in grads for _, g in grads[m])
    largest = max(float(g.abs().max()) for m in grads for _, g in grads[m])
    check(smallest > 0, f"{case}: every gradient tensor non-zero (max |grad| per tensor {smallest:.2e} .. {largest:.2e})")
    tensors = {f"{case}.out": out, f"{case}.loss": loss}
    for m in params:
        for name, p in params[m]:
            tensors[f"{case}.{m}.{name}"] = p.detach().clone()
        for name, g in grads[m]:
            tensors[f"{case}.grad.{m}.{name}"] = g
    return tensors


def gradient_is_exact(loss_fn, param):
    """Does autograd's gradient of loss_fn() w.r.t. param equal the central difference
    (float64)? It does not where a term is detached from the graph."""
    (analytic,) = torch.autograd.grad(loss_fn(), param)
    numeric = torch.zeros_like(param)
    h = 1e-6
    with torch.no_grad():
        for i in range(param.numel()):
            flat = param.data.view(-1)
            kept = float(flat[i])
            flat[i] = kept + h
            up = float(loss_fn())
            flat[i] = kept - h
            down = float(loss_fn())
            flat[i] = kept
            numeric.view(-1)[i] = (up - down) / (2 * h)
    return max_diff(analytic, numeric) < 1e-6 * max(1.0, float(numeric.abs().max()))


def norm_gradient_checks():
    """Whether the DoRA norm ||W + dW|| is part of the gradient, in LyCORIS and in PEFT."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(6, 5, generator=g, dtype=torch.float64)
    magnitude = w.norm(dim=1, keepdim=True) * 1.1
    probe = torch.randn(6, 5, generator=g, dtype=torch.float64)
    delta = (0.3 * torch.randn(6, 5, generator=g, dtype=torch.float64)).requires_grad_(True)
    lycoris_exact = gradient_is_exact(lambda: (weight_decompose(w + delta, magnitude) * probe).sum(), delta)

    linear = torch.nn.Sequential(torch.nn.Linear(5, 6, bias=False)).double()
    linear[0].weight.data.copy_(w)
    layer = get_peft_model(linear, LoraConfig(r=2, lora_alpha=2, use_dora=True, target_modules=["0"])).base_model.model[0]
    layer.lora_A["default"].weight.data.copy_(torch.randn(2, 5, generator=g, dtype=torch.float64))
    lora_b = layer.lora_B["default"].weight
    lora_b.data.copy_(0.3 * torch.randn(6, 2, generator=g, dtype=torch.float64))
    x = torch.randn(3, 5, generator=g, dtype=torch.float64)
    y_probe = torch.randn(3, 6, generator=g, dtype=torch.float64)
    peft_exact = gradient_is_exact(lambda: (layer(x) * y_probe).sum(), lora_b)

    print(f"     DoRA norm in the gradient: LyCORIS {lycoris_exact}, PEFT {peft_exact}")
    check(lycoris_exact and not peft_exact, "LyCORIS differentiates through the weight norm; PEFT detaches it")
    return {"lycoris_norm_in_gradient": lycoris_exact, "peft_norm_in_gradient": peft_exact}


def main():
    # make_real_fixtures turns autograd off on import; the gradients here need it.
    torch.set_grad_enabled(True)
    torch.manual_seed(SEED)
    config, tensors = load_dit_tiny()
    base_model = transformer(config, tensors)
    with torch.no_grad():
        base_out = forward(base_model, tensors)
    err = max_diff(base_out, tensors["out.base"])
    check(err <= BASE_TOL, f"diffusers' transformer without adapter vs dit_tiny out.base: max abs {err:.3e}")

    upstream = upstream_selection(config, tensors)
    gradient_facts = norm_gradient_checks()

    fixture = {k: v.contiguous() for k, v in tensors.items() if k.startswith(("decoder.", "in."))}
    cases = {}
    for i, (case, spec) in enumerate(LOKR_CASES.items()):
        print(f"\n== {case}: {spec['config']}")
        out, meta = lokr_case(case, spec, config, tensors, torch.Generator().manual_seed(SEED + i))
        print(f"     effect max |out - out.base| {meta['effect']:.3e}, loss {meta['loss']:.6f}, "
              f"scale {meta['scale']}, alpha buffer {meta['alpha_buffer']}")
        check(1e-3 < meta["effect"] < 1.0, f"{case}: the adapter's effect is clear and not blown up")
        fixture.update(out)
        cases[case] = meta
    print(f"\n== dora: r {DORA_CASE['r']}, alpha {DORA_CASE['alpha']}")
    out, meta = dora_case("dora", config, tensors, torch.Generator().manual_seed(SEED + len(LOKR_CASES)))
    print(f"     effect max |out - out.base| {meta['effect']:.3e}, loss {meta['loss']:.6f}, scaling {meta['scale']}")
    check(1e-3 < meta["effect"] < 1.0, "dora: the adapter's effect is clear and not blown up")
    fixture.update(out)
    cases["dora"] = meta

    check(all(v.dtype == torch.float32 for v in fixture.values()), "every tensor float32")
    path = os.path.join(OUT, "adapters_tiny.safetensors")
    save_file({k: v.contiguous() for k, v in fixture.items()}, path)
    meta = {
        # dit_tiny's model config, so the fixture is whole on its own.
        "config": config,
        "cases": cases,
        "base_check_max_abs": err,
        "merged_modules": MERGED_MODULES,
        "upstream_lycoris_selection": upstream,
        "gradient": gradient_facts,
        "eps": {"lycoris_weight_decompose": torch.finfo(torch.float32).eps, "peft_dora": 0.0},
        "versions": {p: importlib.metadata.version(p) for p in ["torch", "peft", "lycoris-lora", "diffusers", "safetensors"]},
        "notes": NOTES,
    }
    with open(os.path.join(OUT, "adapters_tiny.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"\nwrote {path} ({os.path.getsize(path) / 1e6:.2f} MB, {len(fixture)} tensors)")


NOTES = [
    "Inputs and base weights are dit_tiny's (decoder.* under ACE-Step's names, in.*); out.base is not repeated.",
    "Adapter tensors: <case>.<module>.<param>, <module> ACE-Step's name layers.{i}.{self_attn,cross_attn}.{q,k,v,o}_proj. "
    "LoKr params are LyCORIS' own names and shapes (lokr_w1 [a,c], lokr_w1_a [a,r], lokr_w1_b [r,c], lokr_w2 [b,d], "
    "lokr_w2_a [b,r], lokr_w2_b [r,d], dora_scale [out,1]); DoRA params lora_A.weight [r,in], lora_B.weight [out,r], "
    "lora_magnitude_vector [out].",
    "<case>.out is the adapted forward, <case>.loss mse(out, in.target) (mean), <case>.grad.<module>.<param> its gradient.",
    "<case>.merged.<module>.weight (for merged_modules only) is the weight the adapted forward applies, checked to "
    "reproduce <case>.out with no adapter to 1e-5. For PEFT this is merge_and_unload. For LyCORIS 4.1.3 it is NOT "
    "get_merged_weight/merge_to when scale != 1: get_diff_weight multiplies get_weight (already scaled) by scale again, "
    "so its merge applies scale^2 (see lycoris_merge_vs_forward_max_abs; 0 for lokr_default, whose scale is 1). "
    "The same code is in LyCORIS since May 2024. Its precise merge (merge_to(precise=True)) also skips weight_decompose.",
    "LoKr forward (LyCORIS, bypass_mode off): W' = W + scale * kron(w1, w2), w1 = w1_a @ w1_b and w2 = w2_a @ w2_b when "
    "factorized; scale = alpha / dim, but 1 when both halves are full matrices (LyCORIS then sets alpha = dim, and "
    "saves that as the alpha buffer). factorization(n, factor) splits n = m * k, m <= k, the smaller half first: "
    "kron(w1 [out_m, in_m], w2 [out_k, in_k]).",
    "LyCORIS weight_decompose (dora_wd; create_lycoris' wd_on_output defaults to True in 4.1.3; before LyCORIS "
    "commit 057df54 (April 2025) it defaulted to False: a per-input-column norm and dora_scale [1, in]): W' = (W + dW) * dora_scale / "
    "(||W + dW||_row + eps), row norm over the input axis per output row, eps = float32 machine epsilon "
    "1.1920929e-07 added to the norm, the norm NOT detached (gradient flows through it), dora_scale [out, 1] "
    "initialised to ||W||_row. The forward then adds x (W' - W)^T to the base output.",
    "PEFT DoRA: out = base + (m / ||W + s B A||_row - 1) * (x W^T) + (m / ||.||_row) * s * (x A^T B^T), no eps, the "
    "norm detached (peft/tuners/lora/dora.py: weight_norm = weight_norm.detach()). The magnitude is saved as "
    "'<prefix>.lora_magnitude_vector' (no '.weight'), shape [out]; ACE-Step's PEFT files (PEFT on its decoder) read "
    "base_model.model.layers.0.cross_attn.k_proj.lora_magnitude_vector.",
    "save_weights key names: lycoris_ + the module path relative to the network's root with '.' -> '_'. Here the root "
    "is diffusers' transformer (lycoris_layers_0_cross_attn_to_k.lokr_w1, lycoris_layers_0_cross_attn_to_out_0...); "
    "ACE-Step trains on its own decoder, so its files read lycoris_layers_0_cross_attn_k_proj.lokr_w1, "
    "lycoris_layers_0_cross_attn_o_proj.alpha, ... Each module also saves 'alpha' (scalar) and, with DoRA, 'dora_scale'.",
    "ACE-Step's own call (apply_preset({'unet_target_name': T, 'target_name': T}) with T = q_proj/k_proj/v_proj/o_proj, "
    "then create_lycoris) does not restrict LyCORIS to those names: LyCORIS matches target names with re.match against "
    "the full module path (anchored at its start, so 'q_proj' matches nothing) and also adapts every module whose "
    "class is in TARGET_REPLACE_MODULE (default Linear, Conv1d, ...), so it adapts every Linear and Conv1d of the "
    "decoder (upstream_lycoris_selection lists them on diffusers' transformer). The fixture's cases restrict LyCORIS to "
    "the 32 projections (target_module [] and full-path patterns); the per-module math is the same.",
]


if __name__ == "__main__":
    main()
