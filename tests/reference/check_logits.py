"""Checks the C++ engine against the NumPy reference (dense.py) on a synthetic checkpoint.

  check_logits.py EDGEINFER REFERENCE_LOGITS WORKDIR PRESET...

For each preset: `edgeinfer make-model` writes a Hugging Face folder of seeded random f32
weights, edge_reference_logits gives the C++ CPU forward pass's logits at every position of a
prompt (one token at a time through the KV cache) and its greedy continuation, and dense.py
computes both from the same files. The logits must agree to 1e-4 of the largest |logit| (float32
sums against float64), and the continuations exactly. Prints one line per preset; exits 1 on the
first disagreement.
"""

import json
import os
import subprocess
import sys

import numpy as np

import dense

PROMPT = [1, 17, 42, 99, 7, 250, 3, 64, 128, 5, 11, 300]
STEPS = 16
TOLERANCE = 1e-4
SUPPORTED = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}


def check(edgeinfer, tool, workdir, preset):
    folder = os.path.join(workdir, preset)
    subprocess.run([edgeinfer, "make-model", "--preset", preset, "--dtype", "f32", "--seed", "7", "--out", folder,
                    "--log-level", "warn"], check=True)
    logits_file = os.path.join(workdir, preset + ".logits")
    run = subprocess.run([tool, folder, logits_file, str(STEPS)] + [str(i) for i in PROMPT], check=True,
                         capture_output=True, text=True)
    cpp = json.loads(run.stdout)
    cpp_logits = np.fromfile(logits_file, dtype="<f4").reshape(len(PROMPT), cpp["vocab"]).astype(np.float64)

    config, tensors = dense.read_folder(folder)
    architecture = config["architectures"][0]
    if architecture not in SUPPORTED:
        raise SystemExit(f"{preset}: {architecture} is not in the reference")
    ref_logits = dense.forward(config, tensors, PROMPT)
    scale = max(1.0, float(np.abs(ref_logits).max()))
    worst = float(np.abs(cpp_logits - ref_logits).max()) / scale
    ref_greedy = dense.greedy(config, tensors, PROMPT, STEPS)
    same = ref_greedy == cpp["greedy"]
    print(f"{preset} ({architecture}): logits within {worst:.2e} of the reference (limit {TOLERANCE:g}), "
          f"greedy continuation of {STEPS} {'equal' if same else 'DIFFERENT'}")
    if worst > TOLERANCE or not same:
        print(f"  C++ greedy:       {cpp['greedy']}\n  reference greedy: {ref_greedy}")
        return False
    return True


def main():
    if len(sys.argv) < 5:
        raise SystemExit(__doc__)
    edgeinfer, tool, workdir = sys.argv[1:4]
    os.makedirs(workdir, exist_ok=True)
    ok = all([check(edgeinfer, tool, workdir, preset) for preset in sys.argv[4:]])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
