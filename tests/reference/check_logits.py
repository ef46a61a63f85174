"""Checks the C++ engine against the NumPy reference (hf_models.py) on a synthetic checkpoint.

  check_logits.py EDGEINFER REFERENCE_LOGITS WORKDIR PRESET...

For each preset: `edgeinfer make-model` writes a Hugging Face folder of seeded random f32
weights, edge_reference_logits gives the C++ CPU forward pass's logits at every position of a
prompt (one token at a time through the KV cache) and its greedy continuation, and hf_models.py
computes both from the same files. The logits must agree to 1e-4 of the largest |logit| (float32
sums against float64), and the continuations exactly.

For a Mixture-of-Experts model the tool also names its MoE layers and top_k in its JSON and writes
the experts each prompt position chose in each of them (OUT_FILE.experts); every one of those
choices must equal the reference's. The logit bound stays 1e-4 for MoE: once the same experts are
chosen, the routing weights (softmax or sigmoid of the router logits) and the expert sums are as
smooth as the dense layers, so only summation order differs; a different choice is caught by the
experts check, which prints the reference's smallest top-k margin so that a near tie can be told
from a misreading.

Prints a line per preset (and one for its experts); exits 1 if any preset disagrees.
"""

import json
import os
import subprocess
import sys

import numpy as np

import hf_models

PROMPT = [1, 17, 42, 99, 7, 250, 3, 64, 128, 5, 11, 300]
STEPS = 16
TOLERANCE = 1e-4
SUPPORTED = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
             "Glm4MoeForCausalLM", "DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM"}


def check_experts(cpp, experts_file, routes):
    """The C++ experts per (position, MoE layer) against the reference's routes; prints the count that agree."""
    layers = cpp.get("moe_layers") or []
    ref_layers = sorted(key for key in routes if key != "margins")
    if layers != ref_layers:
        print(f"  MoE layers: C++ {layers}, reference {ref_layers}")
        return False
    if not layers:
        return True
    top_k = cpp["top_k"]
    ref = np.stack([routes[layer] for layer in layers], axis=1)  # [position, layer, k]
    if top_k != ref.shape[-1]:
        print(f"  top_k: C++ {top_k}, reference {ref.shape[-1]}")
        return False
    raw = np.fromfile(experts_file, dtype="<i4")
    if raw.size != ref.size:
        print(f"  {experts_file}: {raw.size} ids, expected {len(PROMPT)} x {len(layers)} x {top_k}")
        return False
    experts = raw.reshape(ref.shape)
    agree = (experts == ref).all(axis=-1)
    margins = routes["margins"]
    closest = min(layers, key=lambda layer: margins[layer])
    print(f"  experts: {int(agree.sum())}/{agree.size} (position, layer) choices agree over MoE layers {layers}, "
          f"top {top_k}; smallest margin {margins[closest]:.2e} (layer {closest})")
    for position, index in zip(*np.nonzero(~agree)):
        layer = layers[index]
        print(f"    position {position}, layer {layer}: C++ {experts[position, index].tolist()}, "
              f"reference {ref[position, index].tolist()} (layer's smallest margin {margins[layer]:.2e})")
    return bool(agree.all())


def check(edgeinfer, tool, workdir, preset):
    folder = os.path.join(workdir, preset)
    subprocess.run([edgeinfer, "make-model", "--preset", preset, "--dtype", "f32", "--seed", "7", "--out", folder,
                    "--log-level", "warn"], check=True)
    logits_file = os.path.join(workdir, preset + ".logits")
    run = subprocess.run([tool, folder, logits_file, str(STEPS)] + [str(i) for i in PROMPT], check=True,
                         capture_output=True, text=True)
    cpp = json.loads(run.stdout)
    cpp_logits = np.fromfile(logits_file, dtype="<f4").reshape(len(PROMPT), cpp["vocab"]).astype(np.float64)

    config, tensors = hf_models.read_folder(folder)
    architecture = config["architectures"][0]
    if architecture not in SUPPORTED:
        raise SystemExit(f"{preset}: {architecture} is not in the reference")
    routes = {}
    ref_logits = hf_models.forward(config, tensors, PROMPT, routes)
    scale = max(1.0, float(np.abs(ref_logits).max()))
    worst = float(np.abs(cpp_logits - ref_logits).max()) / scale
    ref_greedy = hf_models.greedy(config, tensors, PROMPT, STEPS)
    same = ref_greedy == cpp["greedy"]
    print(f"{preset} ({architecture}): logits within {worst:.2e} of the reference (limit {TOLERANCE:g}), "
          f"greedy continuation of {STEPS} {'equal' if same else 'DIFFERENT'}")
    experts_agree = check_experts(cpp, logits_file + ".experts", routes)
    if worst > TOLERANCE or not same:
        print(f"  C++ greedy:       {cpp['greedy']}\n  reference greedy: {ref_greedy}")
        return False
    return experts_agree


def main():
    if len(sys.argv) < 5:
        raise SystemExit(__doc__)
    edgeinfer, tool, workdir = sys.argv[1:4]
    os.makedirs(workdir, exist_ok=True)
    ok = all([check(edgeinfer, tool, workdir, preset) for preset in sys.argv[4:]])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
