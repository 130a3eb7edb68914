"""Reference trajectories of Prodigy and Adafactor on a small problem (see
make-optimizer-fixtures). The problem: three parameters (a matrix started at random, a
matrix started at zeros like LoRA's B, a vector), each pulled towards a fixed target,
gradient = (p - target) * weight + a fixed disturbance per step, with the learning rate
changing every step as a schedule would."""

import importlib.metadata
import json
import sys

import prodigyopt
import torch
import transformers
from transformers.optimization import Adafactor

STEPS = 8
SHAPES = {"w": [3, 4], "b": [4, 2], "v": [5]}

gen = torch.Generator().manual_seed(7)


def randn(shape, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(torch.float32)


problem = {
    "init": {"w": randn(SHAPES["w"]), "b": torch.zeros(SHAPES["b"]), "v": randn(SHAPES["v"], 0.5)},
    "target": {k: randn(s) for k, s in SHAPES.items()},
    "weight": 0.7,
    "noise": [{k: randn(s, 0.1) for k, s in SHAPES.items()} for _ in range(STEPS)],
}
LRS = {
    "prodigy": [1.0, 1.0, 0.9, 0.8, 1.0, 0.5, 1.0, 0.7],
    "adafactor": [1e-2, 2e-2, 3e-2, 3e-2, 2e-2, 1e-2, 5e-3, 1e-2],
}

CASES = [
    ("prodigy_defaults", "prodigy", {}),
    ("prodigy_tuned", "prodigy", {"weight_decay": 0.1, "use_bias_correction": True, "growth_rate": 1.5,
                                  "d_coef": 2.0, "beta3": 0.99}),
    ("prodigy_coupled_no_momentum", "prodigy", {"beta1": 0.0, "weight_decay": 0.05, "decouple": False,
                                                "safeguard_warmup": True}),
    ("adafactor_defaults", "adafactor", {}),
    ("adafactor_momentum_scaled", "adafactor", {"beta1": 0.9, "weight_decay": 0.01, "scale_parameter": True,
                                               "clip_threshold": 0.5}),
]


def make(kind, params, options):
    if kind == "prodigy":
        o = dict(options)
        betas = (o.pop("beta1", 0.9), 0.999)
        growth = o.pop("growth_rate", float("inf"))
        return prodigyopt.Prodigy(params, lr=1.0, betas=betas, growth_rate=growth, **o)
    o = dict(options)
    eps = (1e-30, 1e-3)
    return Adafactor(params, lr=1e-2, eps=eps, relative_step=False, warmup_init=False,
                     scale_parameter=o.pop("scale_parameter", False), **o)


def run(kind, options):
    params = {k: torch.nn.Parameter(v.clone()) for k, v in problem["init"].items()}
    opt = make(kind, list(params.values()), options)
    steps = []
    for t in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = LRS[kind][t]
        for k, p in params.items():
            p.grad = ((p.detach() - problem["target"][k]) * problem["weight"] + problem["noise"][t][k]).clone()
        opt.step()
        record = {k: p.detach().flatten().tolist() for k, p in params.items()}
        if kind == "prodigy":
            record["d"] = opt.param_groups[0]["d"]
        steps.append(record)
    return steps


def flat(tensors):
    return {k: v.flatten().tolist() for k, v in tensors.items()}


out = {
    "made_with": {"torch": torch.__version__, "prodigyopt": importlib.metadata.version("prodigyopt"),
                  "transformers": transformers.__version__},
    "shapes": SHAPES,
    "init": flat(problem["init"]),
    "target": flat(problem["target"]),
    "weight": problem["weight"],
    "noise": [flat(n) for n in problem["noise"]],
    "lrs": LRS,
    "cases": [{"name": name, "kind": kind, "options": options, "steps": run(kind, options)}
              for name, kind, options in CASES],
}
path = sys.argv[1] if len(sys.argv) > 1 else "engine/tests/data/optimizers/reference.json"
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print(f"wrote {path}")
