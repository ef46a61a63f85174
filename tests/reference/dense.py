"""A second implementation of the dense architectures, in NumPy, read from the Hugging Face
modeling code (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM) rather than from the C++
forward pass.

It loads a Hugging Face folder (config.json and its safetensors, sharded or not), runs the
whole causal forward pass in float64 over a list of token ids, and gives every position's
logits. check_logits.py compares them with the C++ engine's.
"""

import json
import math
import os
import struct

import numpy as np

SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def read_safetensors(path):
    """Tensors of one safetensors file, as float64 arrays by name."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[begin:end]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            values = bits.view(np.float32)
        elif info["dtype"] in SAFETENSORS_DTYPES:
            values = np.frombuffer(raw, dtype=SAFETENSORS_DTYPES[info["dtype"]])
        else:
            raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, which this reference does not read")
        tensors[name] = values.astype(np.float64).reshape(info["shape"])
    return tensors


def read_folder(folder):
    """config.json and every tensor of a Hugging Face folder."""
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        tensors.update(read_safetensors(os.path.join(folder, name)))
    return config, tensors


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def inverse_frequencies(config, head_dim):
    """RoPE frequencies, with the llama3 rule when rope_scaling asks for it."""
    theta = config.get("rope_theta", 10000.0)
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = config.get("rope_scaling")
    if scaling is None:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return inv_freq
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind} is not in this reference")
    factor = scaling["factor"]
    low = scaling["low_freq_factor"]
    high = scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    low_wavelen = original / low
    high_wavelen = original / high
    out = []
    for f in inv_freq:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def forward(config, tensors, ids):
    """Logits [len(ids), vocab] of a causal pass over the whole sequence."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim", hidden // heads)
    eps = config.get("rms_norm_eps", 1e-6)
    layers = config["num_hidden_layers"]
    t = len(ids)

    x = tensors["model.embed_tokens.weight"][np.array(ids)]
    inv_freq = inverse_frequencies(config, head_dim)
    angles = np.outer(np.arange(t, dtype=np.float64), inv_freq)
    cos = np.cos(np.concatenate([angles, angles], axis=-1))[:, None, :]
    sin = np.sin(np.concatenate([angles, angles], axis=-1))[:, None, :]
    causal = np.triu(np.full((t, t), -np.inf), k=1)

    def linear(name, v):
        out = v @ tensors[name + ".weight"].T
        bias = tensors.get(name + ".bias")
        return out if bias is None else out + bias

    for i in range(layers):
        p = f"model.layers.{i}."
        h = rms_norm(x, tensors[p + "input_layernorm.weight"], eps)
        q = linear(p + "self_attn.q_proj", h).reshape(t, heads, head_dim)
        k = linear(p + "self_attn.k_proj", h).reshape(t, kv_heads, head_dim)
        v = linear(p + "self_attn.v_proj", h).reshape(t, kv_heads, head_dim)
        if p + "self_attn.q_norm.weight" in tensors:  # Qwen3: an RMSNorm over each head, before RoPE
            q = rms_norm(q, tensors[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, tensors[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = heads // kv_heads
        k = np.repeat(k, group, axis=1)  # head j reads KV head j // group
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / math.sqrt(head_dim) + causal
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = scores / scores.sum(axis=-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", weights, v).reshape(t, heads * head_dim)
        x = x + linear(p + "self_attn.o_proj", attn)
        h = rms_norm(x, tensors[p + "post_attention_layernorm.weight"], eps)
        gate = linear(p + "mlp.gate_proj", h)
        up = linear(p + "mlp.up_proj", h)
        x = x + linear(p + "mlp.down_proj", gate / (1.0 + np.exp(-gate)) * up)

    x = rms_norm(x, tensors["model.norm.weight"], eps)
    head = tensors.get("lm_head.weight")
    if head is None or config.get("tie_word_embeddings", False):
        head = tensors["model.embed_tokens.weight"]
    return x @ head.T


def greedy(config, tensors, ids, steps):
    """`steps` tokens chosen by argmax after `ids` (lowest id among equal maxima)."""
    out = list(ids)
    for _ in range(steps):
        out.append(int(np.argmax(forward(config, tensors, out)[-1])))
    return out[len(ids):]
