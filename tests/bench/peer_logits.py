"""Compares edgeinfer's log-probabilities with llama.cpp's on the same GGUF.

  peer_logits.py [--report] REFERENCE_LOGITS MODEL BASE_FILE BOS_ID [CHUNKS]

BASE_FILE is what `llama-perplexity -m MODEL -f TEXT -c N --kl-divergence-base BASE_FILE` wrote:
"_logits_", n_ctx, n_vocab, n_chunk (uint32), the text's tokens (int32, n_chunk × n_ctx), then per
chunk and per position j in [n_ctx/2, n_ctx - 1) the log-softmax of llama.cpp's logits, stored as
a float scale and a float minimum followed by one uint16 per token (log p = minimum + scale · v,
values more than 16 below the largest clamped to the minimum). llama-perplexity runs each chunk
as one batch whose first token it replaces by BOS (when the vocabulary adds one). The same
tokens go through edge_reference_logits (edgeinfer's CPU forward pass, one token a step through
the KV cache), and the two log-softmaxes are compared where llama.cpp's is not clamped.

Prints one line per chunk and a summary: the largest |Δ log p|, the quantization step, and how
many positions have the same most likely token (or one llama.cpp's 16-bit values cannot tell
from it). Exits 1 when a difference exceeds half a step plus TOLERANCE or a most likely token
differs.

--report is for files the two engines compute with different rounding (quantized weights times
activations each rounds its own way): nothing fails; it adds the mean and largest KL divergence
(llama.cpp's distribution against edgeinfer's) and, at every position whose most likely token
differs, how far apart the two tokens were in each engine's log-probabilities: a near tie
flipped, or a real disagreement.
"""

import os
import subprocess
import sys
import tempfile

import numpy as np

# float32 sums in two different orders, over a few layers.
TOLERANCE = 1e-4
# llama-perplexity clamps log-probabilities more than this below the largest.
CLAMP = 16.0


def log_softmax(rows):
    rows = rows - rows.max(axis=1, keepdims=True)
    return rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))


def main():
    args = sys.argv[1:]
    report = bool(args) and args[0] == "--report"
    if report:
        args = args[1:]
    if len(args) < 4:
        sys.exit(__doc__)
    reference, model, base, bos = args[0], args[1], args[2], int(args[3])
    raw = open(base, "rb").read()
    if raw[:8] != b"_logits_":
        sys.exit(f"{base}: not a llama-perplexity logits file")
    n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(raw, "<u4", 3, 8))
    chunks = min(n_chunk, int(args[4])) if len(args) > 4 else n_chunk
    offset = 20
    tokens = np.frombuffer(raw, "<i4", n_ctx * n_chunk, offset).reshape(n_chunk, n_ctx)
    offset += tokens.nbytes
    first = n_ctx // 2
    rows = n_ctx - 1 - first
    stride = 2 * ((n_vocab + 1) // 2) + 4  # uint16s per position: two floats, then the values

    largest, step_max, excess_max, same, total = 0.0, 0.0, 0.0, 0, 0
    divergences, flips = [], []  # per position; per differing most likely token: (llama.cpp's gap, ours)
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "logits.bin")
        for c in range(chunks):
            block = np.frombuffer(raw, "<u2", rows * stride, offset + c * rows * stride * 2).reshape(rows, stride)
            header = block[:, :4].copy().view("<f4")  # [rows, 2]: scale, minimum
            step = header[:, 0:1].astype(np.float64)
            peer = header[:, 1:2] + block[:, 4:4 + n_vocab].astype(np.float64) * step
            ids = tokens[c].copy()
            if bos >= 0:
                ids[0] = bos
            subprocess.run([reference, model, out, "0"] + [str(i) for i in ids], check=True, stdout=subprocess.DEVNULL)
            ours = log_softmax(np.fromfile(out, "<f4").reshape(n_ctx, n_vocab)[first:n_ctx - 1].astype(np.float64))
            kept = ours > ours.max(axis=1, keepdims=True) - CLAMP + 1.0
            difference = np.abs(ours - peer)
            # The same most likely token, or llama.cpp's own within a step and the tolerance of it
            # (a tie its 16-bit values cannot tell apart).
            best = ours.argmax(axis=1)
            near_tie = peer.max(axis=1) - peer[np.arange(rows), best] <= step[:, 0] + TOLERANCE
            agree = int(((best == peer.argmax(axis=1)) | near_tie).sum())
            largest = max(largest, float(difference[kept].max()))
            step_max = max(step_max, float(step.max()))
            excess_max = max(excess_max, float((difference - step / 2)[kept].max()))
            same += agree
            total += rows
            if report:
                p = np.exp(peer)
                p /= p.sum(axis=1, keepdims=True)
                divergences.extend((p * (np.log(p) - ours)).sum(axis=1).tolist())
                theirs = peer.argmax(axis=1)
                for j in np.nonzero(best != theirs)[0]:
                    flips.append((float(peer[j, theirs[j]] - peer[j, best[j]]), float(ours[j, best[j]] - ours[j, theirs[j]])))
            print(f"  chunk {c}: positions {first}..{n_ctx - 2}: max |Δ log p| {difference[kept].max():.2e} "
                  f"(llama.cpp's step {float(step.max()):.1e}), most likely token equal at {agree}/{rows}")
    if report:
        kl = np.array(divergences)
        print(f"log-probabilities: max |Δ| {largest:.2e} over {total} positions in {chunks} chunks of {n_ctx}; "
              f"KL(llama.cpp || edgeinfer) mean {kl.mean():.2e}, max {kl.max():.2e}; most likely token equal at "
              f"{total - len(flips)}/{total}")
        if flips:
            gaps = np.array(flips)
            print(f"  where it differs ({len(flips)}): the two tokens' log p apart by at most {gaps[:, 0].max():.3f} "
                  f"in llama.cpp and {gaps[:, 1].max():.3f} in edgeinfer (median {np.median(gaps[:, 0]):.3f} and "
                  f"{np.median(gaps[:, 1]):.3f})")
        sys.exit(0)
    ok = excess_max <= TOLERANCE and same == total
    print(f"log-probabilities: max |Δ| {largest:.2e} over {total} positions in {chunks} chunks of {n_ctx} "
          f"(llama.cpp's step up to {step_max:.1e}; limit half a step + {TOLERANCE:g}); most likely token "
          f"equal at {same}/{total}: {'agree' if ok else 'DISAGREE'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
