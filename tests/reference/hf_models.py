"""A second implementation of the supported architectures, in NumPy, read from the Hugging Face
`transformers` modeling code rather than from the C++ forward pass:

  LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM (dense decoders),
  Qwen3MoeForCausalLM (models/qwen3_moe: softmax top-k experts, no shared expert),
  Glm4MoeForCausalLM (models/glm4_moe, GLM-4.5: partial RoPE, sigmoid group-limited router with a
  correction bias, shared experts).

The rules follow transformers' main branch as read: the dataclass configuration classes
(configuration_qwen3_moe.py, modular_glm4_moe.py's Glm4MoeConfig) and the generated
modeling_qwen3_moe.py and modeling_glm4_moe.py. Older 4.5x releases spell some of it in other
classes with the same result; the comments name both where they differ.

It loads a Hugging Face folder (config.json and its safetensors, sharded or not), runs the whole
causal forward pass in float64 over a list of token ids, and gives every position's logits and,
on request, the experts each MoE layer chose. check_logits.py compares them with the C++ engine's.
Expert weights are read as checkpoints store them, one tensor per expert
(`mlp.experts.{e}.gate_proj.weight`), not in the fused layout transformers builds after loading.
"""

import json
import math
import os
import struct

import numpy as np

SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}

# What each configuration class assumes when config.json leaves a field out (rms_norm_eps, head_dim,
# partial_rotary_factor); head_dim otherwise defaults to hidden_size // num_attention_heads, as every
# attention class computes it (`getattr(config, "head_dim", hidden_size // num_attention_heads)`).
ARCHITECTURES = {
    "LlamaForCausalLM": {"rms_norm_eps": 1e-6},
    "Qwen2ForCausalLM": {"rms_norm_eps": 1e-6},
    "Qwen3ForCausalLM": {"rms_norm_eps": 1e-6, "head_dim": 128},  # Qwen3Config: head_dim = 128
    "Qwen3MoeForCausalLM": {"rms_norm_eps": 1e-6},  # Qwen3MoeConfig declares no head_dim
    # Glm4MoeConfig: rms_norm_eps = 1e-5; partial_rotary_factor 0.5 (__post_init__'s
    # kwargs.setdefault("partial_rotary_factor", 0.5), an __init__ default in older releases)
    "Glm4MoeForCausalLM": {"rms_norm_eps": 1e-5, "partial_rotary_factor": 0.5},
}


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


def architecture(config):
    name = config["architectures"][0]
    if name not in ARCHITECTURES:
        raise ValueError(f"{name} is not in this reference")
    return name


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope_parameters(config):
    """The RoPE settings in one dict. transformers v5 writes them as `rope_parameters` (rope_theta,
    rope_type, the scaling fields, partial_rotary_factor); older config.json files have top-level
    rope_theta and partial_rotary_factor beside a `rope_scaling` dict."""
    rope = dict(config.get("rope_scaling") or {})
    rope.update(config.get("rope_parameters") or {})
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in config and key not in rope:
            rope[key] = config[key]
    return rope


def inverse_frequencies(rope, dim):
    """RoPE frequencies over `dim` rotated elements, with the llama3 rule when rope_type asks for it."""
    theta = rope.get("rope_theta", 10000.0)
    inv_freq = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind != "llama3":
        raise ValueError(f"rope_type {kind} is not in this reference")
    factor = rope["factor"]
    low = rope["low_freq_factor"]
    high = rope["high_freq_factor"]
    original = rope["original_max_position_embeddings"]
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


def attention_layout(config, name):
    """(bias on q/k/v_proj, bias on o_proj, per-head q/k RMSNorm) as each attention class builds them."""
    bias = config.get("attention_bias", False)
    if name == "Qwen2ForCausalLM":
        return True, False, False  # Qwen2Attention: q/k/v bias=True, o_proj bias=False
    if name == "Glm4MoeForCausalLM":
        # Glm4MoeAttention: q/k/v bias=attention_bias, o_proj bias=False, q_norm/k_norm only if use_qk_norm
        return bias, False, config.get("use_qk_norm", False)
    # LlamaAttention, Qwen3Attention, Qwen3MoeAttention: all four projections take attention_bias;
    # the Qwen3 ones always have q_norm/k_norm
    return bias, bias, name in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


def linear(tensors, name, x, bias=False):
    out = x @ tensors[name + ".weight"].T
    return out + tensors[name + ".bias"] if bias else out


def swiglu(tensors, prefix, x, bias=False):
    """down_proj(silu(gate_proj(x)) * up_proj(x)): the dense MLP, each expert and the shared experts."""
    gate = linear(tensors, prefix + "gate_proj", x, bias)
    up = linear(tensors, prefix + "up_proj", x, bias)
    return linear(tensors, prefix + "down_proj", gate / (1.0 + np.exp(-gate)) * up, bias)


def sparse_layer(config, name, i):
    """Whether layer i has the MoE block rather than the dense MLP (of width intermediate_size)."""
    if name == "Qwen3MoeForCausalLM":
        # Qwen3MoeDecoderLayer.__init__: `(layer_idx not in config.mlp_only_layers) and (config.num_experts > 0
        # and (layer_idx + 1) % config.decoder_sparse_step == 0)`; Qwen3MoeConfig: mlp_only_layers [],
        # num_experts 128 (stored as num_local_experts by its attribute_map), decoder_sparse_step 1
        num_experts = config.get("num_experts", config.get("num_local_experts", 128))
        return (i not in (config.get("mlp_only_layers") or []) and num_experts > 0
                and (i + 1) % config.get("decoder_sparse_step", 1) == 0)
    if name == "Glm4MoeForCausalLM":
        # Glm4MoeDecoderLayer (DeepseekV3DecoderLayer): `if layer_idx >= config.first_k_dense_replace` the MoE
        # block; Glm4MoeConfig: first_k_dense_replace 1
        return i >= config.get("first_k_dense_replace", 1)
    return False


def top_k_indices(scores, k):
    """The k largest scores' indices in each row, best first. torch.topk leaves the order of equal
    scores unspecified; here the lower index wins, and the margins below say when that mattered."""
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k]


def smallest_margin(scores, k):
    """Smallest gap, over the rows, between the k-th and (k+1)-th largest score: how near the top-k
    choice came to a tie (infinite when every column is chosen)."""
    if k >= scores.shape[-1]:
        return math.inf
    ordered = -np.sort(-scores, axis=-1)
    return float((ordered[:, k - 1] - ordered[:, k]).min())


def route_softmax(config, logits):
    """Qwen3MoeTopKRouter.forward (Qwen3MoeSparseMoeBlock.forward in older releases): softmax over all
    experts in float, top num_experts_per_tok of the probabilities, and if norm_topk_prob those k
    divided by their sum (no epsilon). Qwen3MoeConfig: num_experts_per_tok 8, norm_topk_prob False."""
    top_k = config.get("num_experts_per_tok", 8)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    chosen = top_k_indices(probs, top_k)
    weights = np.take_along_axis(probs, chosen, axis=-1)
    if config.get("norm_topk_prob", False):
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return chosen, weights, smallest_margin(probs, top_k)


def route_grouped_sigmoid(config, logits, correction_bias):
    """Glm4MoeMoE.route_tokens_to_experts (Glm4MoeTopkRouter.forward and get_topk_indices in older
    releases; the DeepSeek-V3 router). Glm4MoeConfig: num_experts_per_tok 8, n_group 1, topk_group 1,
    norm_topk_prob True, routed_scaling_factor 1.0.

    The margin is the smaller of the expert choice's and the group choice's, since either near a tie
    can flip the experts chosen."""
    top_k = config.get("num_experts_per_tok", 8)
    n_group = config.get("n_group", 1)
    topk_group = config.get("topk_group", 1)
    t, n_experts = logits.shape
    scores = 1.0 / (1.0 + np.exp(-logits))
    # e_score_correction_bias only ranks: the weights below are gathered from the unbiased scores
    for_choice = scores + correction_bias
    # each group scored by the sum of its two best biased scores (`.topk(2, dim=-1)[0].sum(dim=-1)`)
    group_scores = np.sort(for_choice.reshape(t, n_group, n_experts // n_group), axis=-1)[..., -2:].sum(axis=-1)
    eligible = np.zeros((t, n_group), dtype=bool)
    np.put_along_axis(eligible, top_k_indices(group_scores, topk_group), True, axis=-1)
    # experts outside the best topk_group groups are set to 0.0, not -inf (`masked_fill(~score_mask.bool(),
    # 0.0)`): one of them can still win over an eligible expert whose biased score is negative
    ranking = np.where(np.repeat(eligible, n_experts // n_group, axis=-1), for_choice, 0.0)
    chosen = top_k_indices(ranking, top_k)
    weights = np.take_along_axis(scores, chosen, axis=-1)
    if config.get("norm_topk_prob", True):
        weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
    weights = weights * config.get("routed_scaling_factor", 1.0)
    margin = min(smallest_margin(ranking, top_k), smallest_margin(group_scores, topk_group))
    return chosen, weights, margin


def routed_experts(tensors, prefix, x, chosen, weights):
    """Sum over each position's chosen experts of weight * expert(x), expert e at `{prefix}{e}.`."""
    out = np.zeros_like(x)
    for e in np.unique(chosen):
        rows, slots = np.nonzero(chosen == e)  # an expert is chosen at most once per position
        out[rows] += weights[rows, slots, None] * swiglu(tensors, f"{prefix}{e}.", x[rows])
    return out


def forward(config, tensors, ids, routes=None):
    """Logits [len(ids), vocab] of a causal pass over the whole sequence.

    When `routes` is a dict, each MoE layer i adds routes[i]: the experts each position chose, an
    int array [len(ids), num_experts_per_tok] sorted ascending along each row, and
    routes["margins"][i]: the smallest gap over the positions between the k-th and (k+1)-th
    ranking scores, to tell a disagreement from a near tie."""
    name = architecture(config)
    defaults = ARCHITECTURES[name]
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {config['hidden_act']} is not in this reference")
    if config.get("use_sliding_window", False):
        raise ValueError("sliding-window attention is not in this reference")
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or defaults.get("head_dim", hidden // heads)
    eps = config.get("rms_norm_eps", defaults["rms_norm_eps"])
    layers = config["num_hidden_layers"]
    qkv_bias, o_bias, qk_norm = attention_layout(config, name)
    mlp_bias = name == "LlamaForCausalLM" and config.get("mlp_bias", False)  # LlamaMLP: bias=config.mlp_bias
    t = len(ids)

    # RoPE on the leading int(head_dim * partial_rotary_factor) elements of each head, the rest passed
    # through, pairing element j with j + rotary_dim / 2 (rotate_half, not interleaved): Glm4Moe's
    # apply_rotary_pos_emb (gpt_neox's) splits q[..., :rotary_dim] from q[..., rotary_dim:], with
    # rotary_dim = cos.shape[-1] = int(head_dim * partial_rotary_factor) from compute_default_rope_parameters.
    # The other architectures rotate the whole head.
    rope = rope_parameters(config)
    partial = rope.get("partial_rotary_factor", defaults.get("partial_rotary_factor", 1.0))
    if partial != 1.0 and name != "Glm4MoeForCausalLM":
        raise ValueError(f"{name} rotates whole heads; partial_rotary_factor {partial} is not in this reference")
    rotary_dim = int(head_dim * partial)
    angles = np.outer(np.arange(t, dtype=np.float64), inverse_frequencies(rope, rotary_dim))
    cos = np.cos(np.concatenate([angles, angles], axis=-1))[:, None, :]
    sin = np.sin(np.concatenate([angles, angles], axis=-1))[:, None, :]

    def apply_rope(v):
        rotated, passed = v[..., :rotary_dim], v[..., rotary_dim:]
        return np.concatenate([rotated * cos + rotate_half(rotated) * sin, passed], axis=-1)

    causal = np.triu(np.full((t, t), -np.inf), k=1)
    x = tensors["model.embed_tokens.weight"][np.array(ids)]
    for i in range(layers):
        p = f"model.layers.{i}."
        h = rms_norm(x, tensors[p + "input_layernorm.weight"], eps)
        q = linear(tensors, p + "self_attn.q_proj", h, qkv_bias).reshape(t, heads, head_dim)
        k = linear(tensors, p + "self_attn.k_proj", h, qkv_bias).reshape(t, kv_heads, head_dim)
        v = linear(tensors, p + "self_attn.v_proj", h, qkv_bias).reshape(t, kv_heads, head_dim)
        if qk_norm:  # an RMSNorm over each head, before RoPE
            q = rms_norm(q, tensors[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, tensors[p + "self_attn.k_norm.weight"], eps)
        q = apply_rope(q)
        k = apply_rope(k)
        group = heads // kv_heads
        k = np.repeat(k, group, axis=1)  # head j reads KV head j // group
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / math.sqrt(head_dim) + causal
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = scores / scores.sum(axis=-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", weights, v).reshape(t, heads * head_dim)
        x = x + linear(tensors, p + "self_attn.o_proj", attn, o_bias)

        h = rms_norm(x, tensors[p + "post_attention_layernorm.weight"], eps)
        if not sparse_layer(config, name, i):
            x = x + swiglu(tensors, p + "mlp.", h, mlp_bias)
            continue
        logits = h @ tensors[p + "mlp.gate.weight"].T  # the router: [num_experts, hidden], no bias
        if name == "Qwen3MoeForCausalLM":
            chosen, expert_weights, margin = route_softmax(config, logits)
        else:
            chosen, expert_weights, margin = route_grouped_sigmoid(
                config, logits, tensors[p + "mlp.gate.e_score_correction_bias"])
        x = x + routed_experts(tensors, p + "mlp.experts.", h, chosen, expert_weights)
        if name == "Glm4MoeForCausalLM":
            # Glm4MoeMoE.forward: the shared experts (one MLP of width moe_intermediate_size *
            # n_shared_experts) are added at every position
            x = x + swiglu(tensors, p + "mlp.shared_experts.", h)
        if routes is not None:
            routes[i] = np.sort(chosen, axis=-1)
            routes.setdefault("margins", {})[i] = margin

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


def _random_checkpoint(config, seed):
    """Random tensors at the shapes transformers gives `config` (the MoE smoke below)."""
    rng = np.random.default_rng(seed)
    name = architecture(config)
    hidden, heads, kv_heads, head_dim = (config["hidden_size"], config["num_attention_heads"],
                                         config["num_key_value_heads"], config["head_dim"])
    qkv_bias, o_bias, qk_norm = attention_layout(config, name)
    tensors = {}

    def add(key, *shape):
        tensors[key] = rng.normal(0.0, 0.2, shape) + (1.0 if key.endswith("norm.weight") else 0.0)

    def add_mlp(prefix, width):
        add(prefix + "gate_proj.weight", width, hidden)
        add(prefix + "up_proj.weight", width, hidden)
        add(prefix + "down_proj.weight", hidden, width)

    add("model.embed_tokens.weight", config["vocab_size"], hidden)
    add("model.norm.weight", hidden)
    add("lm_head.weight", config["vocab_size"], hidden)
    n_experts = config.get("num_experts", config.get("n_routed_experts"))
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", hidden)
        add(p + "post_attention_layernorm.weight", hidden)
        for proj, rows in (("q_proj", heads), ("k_proj", kv_heads), ("v_proj", kv_heads)):
            add(p + f"self_attn.{proj}.weight", rows * head_dim, hidden)
            if qkv_bias:
                add(p + f"self_attn.{proj}.bias", rows * head_dim)
        add(p + "self_attn.o_proj.weight", hidden, heads * head_dim)
        if o_bias:
            add(p + "self_attn.o_proj.bias", hidden)
        if qk_norm:
            add(p + "self_attn.q_norm.weight", head_dim)
            add(p + "self_attn.k_norm.weight", head_dim)
        if not sparse_layer(config, name, i):
            add_mlp(p + "mlp.", config["intermediate_size"])
            continue
        add(p + "mlp.gate.weight", n_experts, hidden)
        for e in range(n_experts):
            add_mlp(p + f"mlp.experts.{e}.", config["moe_intermediate_size"])
        if name == "Glm4MoeForCausalLM":
            add(p + "mlp.gate.e_score_correction_bias", n_experts)
            add_mlp(p + "mlp.shared_experts.", config["moe_intermediate_size"] * config["n_shared_experts"])
    return tensors


def _smoke():
    """Runs both MoE architectures on random tensors: shapes, routes recorded, greedy."""
    shared = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "vocab_size": 128, "num_hidden_layers": 3, "intermediate_size": 96, "moe_intermediate_size": 32,
              "num_experts_per_tok": 2, "rope_theta": 10000.0, "tie_word_embeddings": False}
    configs = [
        dict(shared, architectures=["Qwen3MoeForCausalLM"], num_experts=8, norm_topk_prob=True,
             mlp_only_layers=[2], decoder_sparse_step=1),
        dict(shared, architectures=["Glm4MoeForCausalLM"], n_routed_experts=8, n_shared_experts=1, n_group=2,
             topk_group=1, first_k_dense_replace=1, partial_rotary_factor=0.5, attention_bias=True,
             use_qk_norm=True, routed_scaling_factor=2.5, norm_topk_prob=True),
    ]
    ids = [1, 17, 42, 99, 7, 5]
    for config, expected_layers in zip(configs, ([0, 1], [1, 2])):
        tensors = _random_checkpoint(config, seed=3)
        routes = {}
        logits = forward(config, tensors, ids, routes)
        assert logits.shape == (len(ids), config["vocab_size"]) and np.isfinite(logits).all()
        moe_layers = sorted(key for key in routes if key != "margins")
        assert moe_layers == expected_layers
        for i in moe_layers:
            assert routes[i].shape == (len(ids), 2) and (np.diff(routes[i], axis=-1) > 0).all()
        assert moe_layers == sorted(routes["margins"])
        assert np.allclose(forward(config, tensors, ids), logits)
        continuation = greedy(config, tensors, ids, 3)
        assert len(continuation) == 3
        margins = ", ".join(f"{routes['margins'][i]:.2e}" for i in moe_layers)
        print(f"{config['architectures'][0]}: MoE layers {moe_layers}, smallest margins {margins}, "
              f"greedy {continuation}")

    # The group-limited router by hand: sigmoid scores [0.8, 0.8, 0.3, 0.2] biased to [-0.2, 0.8, 0.3, 0.2];
    # group {0, 1} (0.6) beats {2, 3} (0.5), and the masked experts' 0.0 outranks expert 0's -0.2,
    # so the second choice is a tie between experts 2 and 3, taken as 2, with a margin of 0.
    glm = {"num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.0}
    scores = np.array([[0.8, 0.8, 0.3, 0.2]])
    chosen, weights, margin = route_grouped_sigmoid(glm, np.log(scores / (1 - scores)), np.array([-1.0, 0, 0, 0]))
    assert chosen.tolist() == [[1, 2]] and margin == 0.0
    assert np.allclose(weights, [[0.8 / 1.1 * 2.0, 0.3 / 1.1 * 2.0]])


if __name__ == "__main__":
    _smoke()
