"""A second implementation of the supported architectures, in NumPy, read from the Hugging Face
`transformers` modeling code rather than from the C++ forward pass:

  LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM (dense decoders),
  Qwen3MoeForCausalLM (models/qwen3_moe: softmax top-k experts, no shared expert),
  Glm4MoeForCausalLM (models/glm4_moe, GLM-4.5: partial RoPE, sigmoid group-limited router with a
  correction bias, shared experts),
  DeepseekV3ForCausalLM (models/deepseek_v3, DeepSeek-V3 and Kimi K2: Multi-head Latent Attention,
  YaRN, the GLM-4.5 router and shared experts),
  GlmMoeDsaForCausalLM (models/glm_moe_dsa on models/deepseek_v32, GLM-5: the same MLA and MoE plus
  DeepSeek Sparse Attention, a lightning indexer choosing the keys each query attends to).

The rules follow transformers' main branch as read: the dataclass configuration classes
(configuration_qwen3_moe.py, modular_glm4_moe.py's Glm4MoeConfig, configuration_deepseek_v3.py,
modular_glm_moe_dsa.py's GlmMoeDsaConfig), modeling_rope_utils.py, and the modular / generated
modeling files of each model. Older 4.5x releases spell some of it in other classes with the same
result; the comments name both where they differ.

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
    # DeepseekV3Config.__init__ defaults (Kimi K2 ships this architecture with model_type "kimi_k2" and
    # its own config.json values); head_dim there is qk_rope_head_dim, which is what RoPE reads
    "DeepseekV3ForCausalLM": {
        "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "rope_interleave": True,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "first_k_dense_replace": 3,
        "attention_bias": False,
    },
    # GlmMoeDsaConfig (a DeepseekV32Config): its own field defaults; mlp_layer_types defaults to
    # first_k_dense_replace dense layers, then sparse; indexer_types as indexer_types() derives them
    "GlmMoeDsaForCausalLM": {
        "rms_norm_eps": 1e-5, "max_position_embeddings": 202752, "q_lora_rank": 2048, "kv_lora_rank": 512,
        "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "first_k_dense_replace": 3,
        "attention_bias": False, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32,
    },
}

# The Multi-head Latent Attention architectures: config.json is read over ARCHITECTURES[name] (settings()),
# since their attention, router and MoE layout take many more defaults than the others.
MLA_ARCHITECTURES = ("DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM")

# DeepseekV3Attention builds q_a_layernorm and kv_a_layernorm as `DeepseekV3RMSNorm(config.q_lora_rank)` and
# `DeepseekV3RMSNorm(self.kv_lora_rank)`: no eps argument, so the class default 1e-6, not rms_norm_eps
# (GlmMoeDsaRMSNorm(config.q_lora_rank) likewise, where rms_norm_eps is 1e-5).
LORA_NORM_EPS = 1e-6

# DeepseekV32Indexer: `self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)`
INDEXER_NORM_EPS = 1e-6


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


def settings(config):
    """config.json over the configuration class's defaults, for the MLA architectures (others unchanged).
    A field config.json spells as null stays null: q_lora_rank null means q_proj, not q_lora_rank 1536."""
    name = architecture(config)
    if name not in MLA_ARCHITECTURES:
        return config
    merged = dict(ARCHITECTURES[name])
    merged.update(config)
    return merged


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def layer_norm(x, weight, bias, eps):
    """torch.nn.LayerNorm: mean and biased variance over the last axis, then weight and bias."""
    mean = np.mean(x, axis=-1, keepdims=True)
    variance = np.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + eps) * weight + bias


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


def yarn_get_mscale(scale, mscale=1.0):
    """modeling_deepseek_v3.yarn_get_mscale (get_mscale inside _compute_yarn_parameters is the same)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def original_max_position_embeddings(config, rope):
    """RotaryEmbeddingConfigMixin.standardize_rope_params for yarn: a top-level
    original_max_position_embeddings wins ("an exception case where we give priority to
    self.original_max_position_embeddings"), then the one in the RoPE dict, then max_position_embeddings."""
    if config.get("original_max_position_embeddings") is not None:
        return config["original_max_position_embeddings"]
    if rope.get("original_max_position_embeddings") is not None:
        return rope["original_max_position_embeddings"]
    return config["max_position_embeddings"]


def yarn_parameters(config, rope, dim):
    """modeling_rope_utils._compute_yarn_parameters: (inverse frequencies over `dim` rotated elements,
    attention_factor, the factor cos and sin are multiplied by).

    main reads `factor` as given and only falls back to max_position_embeddings /
    original_max_position_embeddings when it is absent; some 4.5x releases replaced it by that ratio
    whenever the RoPE dict had original_max_position_embeddings. The two agree when config.json is consistent
    (DeepSeek-V3: 40 = 163840 / 4096)."""
    base = rope.get("rope_theta", 10000.0)
    original = original_max_position_embeddings(config, rope)
    factor = rope.get("factor")
    if factor is None:
        factor = config["max_position_embeddings"] / original
    factor = float(factor)
    attention_factor = rope.get("attention_factor")
    mscale = rope.get("mscale")
    mscale_all_dim = rope.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_get_mscale(factor)
    # `config.rope_parameters.get("beta_fast") or 32`: a 0 or null takes the default too
    beta_fast = float(rope.get("beta_fast") or 32)
    beta_slow = float(rope.get("beta_slow") or 1)

    def correction_dim(rotations):
        # find_correction_dim: the dimension at which a wavelength fits `rotations` times in the original context
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    # find_correction_range: floor / ceil unless truncate is false, then clamped to [0, dim - 1]
    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:  # linear_ramp_factor: "Prevent singularity"
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation_factor = 1.0 - ramp
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1.0 - extrapolation_factor) + (1.0 / pos_freqs) * extrapolation_factor
    return inv_freq, float(attention_factor)


def rotary_tables(config, rope, dim, t):
    """cos and sin [t, dim] at positions 0..t-1 as the rotary embedding class returns them:
    emb = cat(freqs, freqs), `cos = emb.cos() * self.attention_scaling` (likewise sin), the attention
    scaling being yarn's attention_factor and 1.0 for the default RoPE."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "yarn":
        inv_freq, scaling = yarn_parameters(config, rope, dim)
    elif kind == "default":
        inv_freq, scaling = inverse_frequencies(rope, dim), 1.0
    else:
        raise ValueError(f"rope_type {kind} is not in this reference for {architecture(config)}")
    angles = np.outer(np.arange(t, dtype=np.float64), inv_freq)
    emb = np.concatenate([angles, angles], axis=-1)
    return np.cos(emb) * scaling, np.sin(emb) * scaling


def apply_rope(x, cos, sin, interleave):
    """RoPE on x [t, ..., d] with cos and sin [t, d].

    Not interleaved: apply_rotary_pos_emb, pairing element j with j + d/2 (rotate_half).
    Interleaved: apply_rotary_pos_emb_interleave, which first views the last axis as (d/2, 2) and
    transposes it, so the elements come in the order x0, x2, x4, ..., x1, x3, ... and rotate_half then
    pairs x[2j] with x[2j+1]. The result keeps that order; queries and keys share it, so their dot
    products are those of the pairwise rotation."""
    shape = (cos.shape[0],) + (1,) * (x.ndim - 2) + (cos.shape[1],)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    if interleave:
        x = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
    return x * cos + rotate_half(x) * sin


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
    if name == "DeepseekV3ForCausalLM":
        # DeepseekV3DecoderLayer.__init__: `if layer_idx >= config.first_k_dense_replace` DeepseekV3MoE. It reads
        # no moe_layer_freq (forward() refuses one other than 1); `config` here is settings(config)
        return i >= config["first_k_dense_replace"]
    if name == "GlmMoeDsaForCausalLM":
        # Glm4MoeLiteDecoderLayer (DeepseekV32DecoderLayer): `config.mlp_layer_types[layer_idx] == "sparse"`,
        # mlp_layer_types defaulting to min(first_k_dense_replace, num_hidden_layers) "dense", then "sparse"
        types = config.get("mlp_layer_types")
        if types is None:
            return i >= config["first_k_dense_replace"]
        return types[i] == "sparse"
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
    norm_topk_prob True, routed_scaling_factor 1.0. DeepseekV3MoE.route_tokens_to_experts (GLM-5's MoE
    too) is the same rule; their other defaults reach `config` from ARCHITECTURES through settings().

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


def masked_softmax(scores, allowed):
    """softmax(scores) along the last axis over the keys `allowed` [t, s] lets each query read (the
    eager attention's additive mask, -inf where not allowed); every row allows at least one key."""
    scores = np.where(allowed, scores, -np.inf)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return scores / scores.sum(axis=-1, keepdims=True)


def mla_plain(q, latent, k_pe, kv_b, nope, v_dim, scale, allowed):
    """Multi-head Latent Attention as DeepseekV3Attention.forward runs it (expand_kv in newer releases):
    kv_b_proj expands the normalized latent [t, kv_lora_rank] into each head's k_nope and value, the one
    rotated k_pe [t, qk_rope_head_dim] is shared by every head (`k_rot.expand`), the keys are
    cat(k_nope, k_pe), and q [t, heads, nope + rope] (its rope part rotated) is scored against them.
    kv_b [heads * (nope + v_dim), kv_lora_rank]. Returns [t, heads, v_dim]."""
    t, heads, _ = q.shape
    kv = (latent @ kv_b.T).reshape(t, heads, nope + v_dim)
    keys = np.concatenate([kv[..., :nope], np.broadcast_to(k_pe[:, None, :], (t, heads, k_pe.shape[-1]))], axis=-1)
    values = kv[..., nope:]
    weights = masked_softmax(np.einsum("thd,shd->hts", q, keys) * scale, allowed)
    return np.einsum("hts,shd->thd", weights, values)


def mla_absorbed(q, latent, k_pe, kv_b, nope, v_dim, scale, allowed):
    """mla_plain with kv_b_proj folded in: each head's query nope part goes through that head's key block
    of kv_b_proj into the latent space, the scores are taken against [latent | k_pe] directly, and the
    value block is applied to the attention-weighted latent. The same function in another order: the
    smoke check holds it to mla_plain."""
    t, heads, _ = q.shape
    blocks = kv_b.reshape(heads, nope + v_dim, kv_b.shape[-1])
    q_latent = np.einsum("thd,hdr->thr", q[..., :nope], blocks[:, :nope])
    scores = np.einsum("thr,sr->hts", q_latent, latent) + np.einsum("thd,sd->hts", q[..., nope:], k_pe)
    weights = masked_softmax(scores * scale, allowed)
    return np.einsum("thr,hvr->thv", np.einsum("hts,sr->thr", weights, latent), blocks[:, nope:])


def indexer_types(config):
    """Each layer's indexer mode, "full" (runs its own) or "shared" (reuses the previous full layer's
    selection), as GlmMoeDsaConfig.__post_init__ fills indexer_types when config.json leaves it out:
    index_topk_pattern ("F"/"S" letters, or a list) if given, else "full" where
    max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0 (freq at least 1, defaults 1 and 2)."""
    types = config.get("indexer_types")
    if types is not None:
        return list(types)
    pattern = config.get("index_topk_pattern")
    if pattern is not None:
        return [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
    freq = max(config.get("index_topk_freq", 1), 1)
    offset = config.get("index_skip_topk_offset", 2)
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(config["num_hidden_layers"])]


def dsa_select(config, tensors, prefix, h, q_resid, cos, sin):
    """GlmMoeDsaIndexer.forward (DeepseekV32Indexer's, with interleaved RoPE): the keys [t, t] (bool)
    each query attends to, and the selection's smallest margin.

    Per index head, q = wq_b(q_resid) [index_n_heads, index_head_dim]; one key k = k_norm(wk(x)) per
    position (a LayerNorm with bias, eps 1e-6); the first qk_rope_head_dim elements of both rotated
    (there, unlike in the main attention, the rotated part comes first), interleaved for GLM-5 (DeepSeek-V3.2
    splits halves). index_score[s, t] = sum_h weights_proj(x)[s, h] * index_n_heads**-0.5 *
    relu(q[s, h] . k[t] * index_head_dim**-0.5), causal, and the top min(index_topk, t) per query. Where a
    query has fewer earlier positions than that, topk also returns masked ones, which the causal mask
    still hides: the attention reads only the selected keys that are also causal.

    torch.topk leaves equal scores' order unspecified; here the lower position wins, and the margin (the
    smallest gap between the k-th and (k+1)-th score, over the queries with more than k earlier
    positions; infinite where there are none) says when that mattered. relu makes exact ties at 0 likely
    when few index heads all score a key negative."""
    t = h.shape[0]
    n_heads, head_dim = config["index_n_heads"], config["index_head_dim"]
    rope_dim = config["qk_rope_head_dim"]
    q = linear(tensors, prefix + "wq_b", q_resid).reshape(t, n_heads, head_dim)
    q = np.concatenate([apply_rope(q[..., :rope_dim], cos, sin, True), q[..., rope_dim:]], axis=-1)
    k = layer_norm(linear(tensors, prefix + "wk", h), tensors[prefix + "k_norm.weight"],
                   tensors[prefix + "k_norm.bias"], INDEXER_NORM_EPS)
    k = np.concatenate([apply_rope(k[:, :rope_dim], cos, sin, True), k[:, rope_dim:]], axis=-1)
    scores = np.maximum(np.einsum("shd,td->sht", q, k) * head_dim ** -0.5, 0.0)
    weights = linear(tensors, prefix + "weights_proj", h) * n_heads ** -0.5
    causal = np.tril(np.ones((t, t), dtype=bool))
    index_scores = np.where(causal, np.einsum("sht,sh->st", scores, weights), -np.inf)
    top_k = min(config["index_topk"], t)
    selected = np.zeros((t, t), dtype=bool)
    np.put_along_axis(selected, top_k_indices(index_scores, top_k), True, axis=-1)
    margin = smallest_margin(index_scores[top_k:], top_k) if t > top_k else math.inf
    return selected & causal, margin


def mla_attention(config, name, tensors, t, selections):
    """attend(i, prefix, x) -> the attention output [t, hidden] of layer i (DeepseekV3Attention, or
    GlmMoeDsaAttention's MLA with DSA) for the input-normalized x [t, hidden]; `config` is settings(config).

    q: q_lora_rank null gives q_proj; otherwise q_b_proj(q_a_layernorm(q_a_proj(x))) (GLM-5 always: its
    attention and indexer read that q_resid). Per head [qk_nope_head_dim | qk_rope_head_dim].
    kv_a_proj_with_mqa(x) is [kv_lora_rank latent | qk_rope_head_dim k_pe], the latent through
    kv_a_layernorm. q_a_proj, kv_a_proj_with_mqa and o_proj have a bias if attention_bias, the rest never.
    RoPE on the rope parts: interleaved if rope_interleave (default true; GLM-5's main attention always
    is), else halves. Softmax scale qk_head_dim**-0.5, times yarn_get_mscale(factor, mscale_all_dim)**2
    when the RoPE is not the default one and mscale_all_dim is set and nonzero."""
    heads = config["num_attention_heads"]
    if config.get("num_key_value_heads", heads) != heads:
        raise ValueError("MLA with num_key_value_heads != num_attention_heads is not in this reference")
    nope, rope_dim, v_dim = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    kv_rank, q_rank = config["kv_lora_rank"], config["q_lora_rank"]
    bias = config.get("attention_bias", False)
    dsa = name == "GlmMoeDsaForCausalLM"
    if dsa and q_rank is None:
        raise ValueError("GlmMoeDsaForCausalLM needs q_lora_rank: its indexer reads q_a_layernorm's output")
    interleave = True if dsa else config.get("rope_interleave", True)
    rope = rope_parameters(config)
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor is not in this reference for MLA")
    # The rotary embedding reads head_dim, which both configuration classes set to qk_rope_head_dim
    cos, sin = rotary_tables(config, rope, rope_dim, t)
    scale = (nope + rope_dim) ** -0.5
    if rope.get("rope_type", rope.get("type", "default")) != "default" and rope.get("mscale_all_dim"):
        scale *= yarn_get_mscale(float(rope["factor"]), rope["mscale_all_dim"]) ** 2
    causal = np.tril(np.ones((t, t), dtype=bool))
    modes = indexer_types(config) if dsa else None
    shared = {}  # the last full DSA layer's selection and margin, for the "shared" layers after it

    def attend(i, p, x):
        a = p + "self_attn."
        if q_rank is None:
            q = linear(tensors, a + "q_proj", x)
        else:
            q_resid = rms_norm(linear(tensors, a + "q_a_proj", x, bias), tensors[a + "q_a_layernorm.weight"],
                               LORA_NORM_EPS)
            q = linear(tensors, a + "q_b_proj", q_resid)
        q = q.reshape(t, heads, nope + rope_dim)
        q = np.concatenate([q[..., :nope], apply_rope(q[..., nope:], cos, sin, interleave)], axis=-1)
        compressed = linear(tensors, a + "kv_a_proj_with_mqa", x, bias)
        latent = rms_norm(compressed[:, :kv_rank], tensors[a + "kv_a_layernorm.weight"], LORA_NORM_EPS)
        k_pe = apply_rope(compressed[:, kv_rank:], cos, sin, interleave)
        allowed = causal
        if dsa:
            if modes[i] == "full":
                shared["selected"], shared["margin"] = dsa_select(config, tensors, a + "indexer.", x, q_resid, cos, sin)
            elif "selected" not in shared:
                raise ValueError(f"layer {i} shares the DSA selection, but no full indexer layer comes before it")
            allowed = shared["selected"]
            if selections is not None:
                top_k = min(config["index_topk"], t)
                rows = np.full((t, top_k), -1, dtype=np.int64)
                for s in range(t):
                    chosen = np.nonzero(allowed[s])[0]
                    rows[s, :len(chosen)] = chosen
                selections[i] = rows
                selections.setdefault("margins", {})[i] = shared["margin"]
        out = mla_plain(q, latent, k_pe, tensors[a + "kv_b_proj.weight"], nope, v_dim, scale, allowed)
        return linear(tensors, a + "o_proj", out.reshape(t, heads * v_dim), bias)

    return attend


def gqa_attention(config, name, tensors, t):
    """attend(i, prefix, x) -> the attention output [t, hidden] of layer i for the input-normalized
    x [t, hidden]: LlamaAttention and its relatives (attention_layout), with grouped KV heads."""
    defaults = ARCHITECTURES[name]
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or defaults.get("head_dim", hidden // heads)
    eps = config.get("rms_norm_eps", defaults["rms_norm_eps"])
    qkv_bias, o_bias, qk_norm = attention_layout(config, name)

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

    def rotate(v):
        rotated, passed = v[..., :rotary_dim], v[..., rotary_dim:]
        return np.concatenate([rotated * cos + rotate_half(rotated) * sin, passed], axis=-1)

    causal = np.triu(np.full((t, t), -np.inf), k=1)

    def attend(i, p, h):
        q = linear(tensors, p + "self_attn.q_proj", h, qkv_bias).reshape(t, heads, head_dim)
        k = linear(tensors, p + "self_attn.k_proj", h, qkv_bias).reshape(t, kv_heads, head_dim)
        v = linear(tensors, p + "self_attn.v_proj", h, qkv_bias).reshape(t, kv_heads, head_dim)
        if qk_norm:  # an RMSNorm over each head, before RoPE
            q = rms_norm(q, tensors[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, tensors[p + "self_attn.k_norm.weight"], eps)
        q = rotate(q)
        k = rotate(k)
        group = heads // kv_heads
        k = np.repeat(k, group, axis=1)  # head j reads KV head j // group
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / math.sqrt(head_dim) + causal
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = scores / scores.sum(axis=-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", weights, v).reshape(t, heads * head_dim)
        return linear(tensors, p + "self_attn.o_proj", attn, o_bias)

    return attend


# Glm4MoeMoE.forward and DeepseekV3MoE.forward (GLM-5's too): the shared experts, one MLP of width
# moe_intermediate_size * n_shared_experts, added to the routed experts' sum at every position
SHARED_EXPERTS = ("Glm4MoeForCausalLM", "DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM")


def feed_forward(config, name, tensors, i, p, h, routes):
    """The MLP block of layer i on the post-attention-normalized h: dense (of width intermediate_size)
    or the MoE block, recording the experts chosen in `routes`."""
    if not sparse_layer(config, name, i):
        mlp_bias = name == "LlamaForCausalLM" and config.get("mlp_bias", False)  # LlamaMLP: bias=config.mlp_bias
        return swiglu(tensors, p + "mlp.", h, mlp_bias)
    logits = h @ tensors[p + "mlp.gate.weight"].T  # the router: [num_experts, hidden], no bias
    if name == "Qwen3MoeForCausalLM":
        chosen, expert_weights, margin = route_softmax(config, logits)
    else:
        chosen, expert_weights, margin = route_grouped_sigmoid(
            config, logits, tensors[p + "mlp.gate.e_score_correction_bias"])
    out = routed_experts(tensors, p + "mlp.experts.", h, chosen, expert_weights)
    if name in SHARED_EXPERTS:
        out = out + swiglu(tensors, p + "mlp.shared_experts.", h)
    if routes is not None:
        routes[i] = np.sort(chosen, axis=-1)
        routes.setdefault("margins", {})[i] = margin
    return out


def forward(config, tensors, ids, routes=None, selections=None):
    """Logits [len(ids), vocab] of a causal pass over the whole sequence.

    When `routes` is a dict, each MoE layer i adds routes[i]: the experts each position chose, an
    int array [len(ids), num_experts_per_tok] sorted ascending along each row, and
    routes["margins"][i]: the smallest gap over the positions between the k-th and (k+1)-th
    ranking scores, to tell a disagreement from a near tie.

    When `selections` is a dict, each DSA layer i (GlmMoeDsaForCausalLM) adds selections[i]: the
    positions each query attends to, an int array [len(ids), min(index_topk, len(ids))] ascending along
    each row and padded with -1 where a query has fewer earlier positions, and selections["margins"][i]:
    the smallest gap between the k-th and (k+1)-th index score (a "shared" layer repeats the selection
    and margin of the full layer it reuses).

    Only the first num_hidden_layers layers run: the multi-token-prediction layers after them
    (num_nextn_predict_layers; `_keys_to_ignore_on_load_unexpected` in transformers) are not read."""
    name = architecture(config)
    config = settings(config)
    defaults = ARCHITECTURES[name]
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {config['hidden_act']} is not in this reference")
    if config.get("use_sliding_window", False):
        raise ValueError("sliding-window attention is not in this reference")
    eps = config.get("rms_norm_eps", defaults["rms_norm_eps"])
    t = len(ids)
    if name in MLA_ARCHITECTURES:
        if config.get("moe_layer_freq", 1) != 1:
            raise ValueError("moe_layer_freq other than 1 is not in this reference (transformers reads none)")
        attend = mla_attention(config, name, tensors, t, selections)
    else:
        attend = gqa_attention(config, name, tensors, t)

    x = tensors["model.embed_tokens.weight"][np.array(ids)]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + attend(i, p, rms_norm(x, tensors[p + "input_layernorm.weight"], eps))
        h = rms_norm(x, tensors[p + "post_attention_layernorm.weight"], eps)
        x = x + feed_forward(config, name, tensors, i, p, h, routes)

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
    """Random tensors at the shapes transformers gives `config` (the MoE and MLA smoke below)."""
    rng = np.random.default_rng(seed)
    name = architecture(config)
    config = settings(config)
    hidden = config["hidden_size"]
    tensors = {}

    def add(key, *shape):
        tensors[key] = rng.normal(0.0, 0.2, shape) + (1.0 if key.endswith("norm.weight") else 0.0)

    def add_mlp(prefix, width):
        add(prefix + "gate_proj.weight", width, hidden)
        add(prefix + "up_proj.weight", width, hidden)
        add(prefix + "down_proj.weight", hidden, width)

    def add_gqa_attention(p):
        heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
        qkv_bias, o_bias, qk_norm = attention_layout(config, name)
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

    def add_mla_attention(p, i):
        a = p + "self_attn."
        heads, nope, rope_dim, v_dim = (config["num_attention_heads"], config["qk_nope_head_dim"],
                                        config["qk_rope_head_dim"], config["v_head_dim"])
        q_rank, kv_rank, bias = config["q_lora_rank"], config["kv_lora_rank"], config["attention_bias"]
        if q_rank is None:
            add(a + "q_proj.weight", heads * (nope + rope_dim), hidden)
        else:
            add(a + "q_a_proj.weight", q_rank, hidden)
            add(a + "q_a_layernorm.weight", q_rank)
            add(a + "q_b_proj.weight", heads * (nope + rope_dim), q_rank)
        add(a + "kv_a_proj_with_mqa.weight", kv_rank + rope_dim, hidden)
        add(a + "kv_a_layernorm.weight", kv_rank)
        add(a + "kv_b_proj.weight", heads * (nope + v_dim), kv_rank)
        add(a + "o_proj.weight", hidden, heads * v_dim)
        if bias:
            if q_rank is not None:
                add(a + "q_a_proj.bias", q_rank)
            add(a + "kv_a_proj_with_mqa.bias", kv_rank + rope_dim)
            add(a + "o_proj.bias", hidden)
        if name == "GlmMoeDsaForCausalLM" and indexer_types(config)[i] == "full":
            n_heads, head_dim = config["index_n_heads"], config["index_head_dim"]
            add(a + "indexer.wq_b.weight", n_heads * head_dim, q_rank)
            add(a + "indexer.wk.weight", head_dim, hidden)
            add(a + "indexer.k_norm.weight", head_dim)
            add(a + "indexer.k_norm.bias", head_dim)
            add(a + "indexer.weights_proj.weight", n_heads, hidden)

    add("model.embed_tokens.weight", config["vocab_size"], hidden)
    add("model.norm.weight", hidden)
    add("lm_head.weight", config["vocab_size"], hidden)
    n_experts = config.get("num_experts", config.get("n_routed_experts"))
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", hidden)
        add(p + "post_attention_layernorm.weight", hidden)
        if name in MLA_ARCHITECTURES:
            add_mla_attention(p, i)
        else:
            add_gqa_attention(p)
        if not sparse_layer(config, name, i):
            add_mlp(p + "mlp.", config["intermediate_size"])
            continue
        add(p + "mlp.gate.weight", n_experts, hidden)
        for e in range(n_experts):
            add_mlp(p + f"mlp.experts.{e}.", config["moe_intermediate_size"])
        if name in SHARED_EXPERTS:
            add(p + "mlp.gate.e_score_correction_bias", n_experts)
            add_mlp(p + "mlp.shared_experts.", config["moe_intermediate_size"] * config["n_shared_experts"])
    return tensors


def _check_routes(config, routes, ids, expected_layers):
    moe_layers = sorted(key for key in routes if key != "margins")
    assert moe_layers == expected_layers, (moe_layers, expected_layers)
    for i in moe_layers:
        assert routes[i].shape == (len(ids), config["num_experts_per_tok"]) and (np.diff(routes[i], axis=-1) > 0).all()
    assert moe_layers == sorted(routes["margins"])
    return ", ".join(f"{routes['margins'][i]:.2e}" for i in moe_layers)


def _smoke_rope():
    """YaRN and the interleaved RoPE by hand."""
    # dim 8, theta 10000, original context 64: the correction range is floor(8 ln(64 / (32 2pi)) / (2 ln 1e4))
    # = floor(-0.50) -> 0 and ceil(8 ln(64 / (1 2pi)) / (2 ln 1e4)) = ceil(1.01) = 2, so the ramp over the
    # 4 frequency pairs is [0, 0.5, 1, 1]: pair 0 extrapolated, pair 1 half and half, pairs 2 and 3 divided by 32
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0, "beta_fast": 32, "beta_slow": 1,
            "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 64}
    inv_freq, attention_factor = yarn_parameters({"max_position_embeddings": 2048}, rope, 8)
    plain = 1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8)
    assert np.allclose(inv_freq, plain * np.array([1.0, 0.5 + 0.5 / 32, 1 / 32, 1 / 32]), rtol=1e-14)
    assert attention_factor == 1.0  # mscale == mscale_all_dim
    _, attention_factor = yarn_parameters({"max_position_embeddings": 2048}, dict(rope, mscale_all_dim=0), 8)
    assert attention_factor == 0.1 * math.log(32.0) + 1.0  # get_mscale(factor)
    # truncate false: the range is [0, 1.01...], and pair 1 is then almost all interpolated
    inv_freq, _ = yarn_parameters({"max_position_embeddings": 2048}, dict(rope, truncate=False), 8)
    high = 8 * math.log(64 / (2 * math.pi)) / (2 * math.log(10000.0))
    assert np.isclose(inv_freq[1], plain[1] * ((1 / high) / 32 + (1 - 1 / high)), rtol=1e-14)

    # interleaved: element j of the result is x[2j] cos - x[2j+1] sin, element d/2 + j is x[2j+1] cos + x[2j] sin
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 8))
    cos, sin = rotary_tables({"max_position_embeddings": 2048}, {"rope_theta": 10000.0}, 8, 3)
    out = apply_rope(x, cos, sin, True)
    angles = np.outer(np.arange(3), plain)
    assert np.allclose(out[:, :4], x[:, 0::2] * np.cos(angles) - x[:, 1::2] * np.sin(angles), rtol=1e-14)
    assert np.allclose(out[:, 4:], x[:, 1::2] * np.cos(angles) + x[:, 0::2] * np.sin(angles), rtol=1e-14)


def _smoke_absorbed():
    """mla_absorbed == mla_plain on random tensors, with a causal mask thinned at random."""
    rng = np.random.default_rng(5)
    t, heads, nope, rope_dim, v_dim, rank = 7, 3, 6, 4, 5, 9
    q = rng.normal(size=(t, heads, nope + rope_dim))
    latent, k_pe = rng.normal(size=(t, rank)), rng.normal(size=(t, rope_dim))
    kv_b = rng.normal(size=(heads * (nope + v_dim), rank))
    allowed = np.tril(rng.random((t, t)) < 0.6) | np.eye(t, dtype=bool)
    plain = mla_plain(q, latent, k_pe, kv_b, nope, v_dim, 0.3, allowed)
    absorbed = mla_absorbed(q, latent, k_pe, kv_b, nope, v_dim, 0.3, allowed)
    assert plain.shape == (t, heads, v_dim) and np.abs(plain - absorbed).max() < 1e-10


def _smoke():
    """Runs every MoE architecture on random tensors: shapes, routes (and DSA selections) recorded, greedy."""
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
        margins = _check_routes(config, routes, ids, expected_layers)
        assert np.allclose(forward(config, tensors, ids), logits)
        continuation = greedy(config, tensors, ids, 3)
        assert len(continuation) == 3
        print(f"{config['architectures'][0]}: MoE layers {expected_layers}, smallest margins {margins}, "
              f"greedy {continuation}")

    # The group-limited router by hand: sigmoid scores [0.8, 0.8, 0.3, 0.2] biased to [-0.2, 0.8, 0.3, 0.2];
    # group {0, 1} (0.6) beats {2, 3} (0.5), and the masked experts' 0.0 outranks expert 0's -0.2,
    # so the second choice is a tie between experts 2 and 3, taken as 2, with a margin of 0.
    glm = {"num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.0}
    scores = np.array([[0.8, 0.8, 0.3, 0.2]])
    chosen, weights, margin = route_grouped_sigmoid(glm, np.log(scores / (1 - scores)), np.array([-1.0, 0, 0, 0]))
    assert chosen.tolist() == [[1, 2]] and margin == 0.0
    assert np.allclose(weights, [[0.8 / 1.1 * 2.0, 0.3 / 1.1 * 2.0]])

    _smoke_rope()
    _smoke_absorbed()

    # MLA: 4 heads of [8 nope | 8 rope] queries and keys, 12-wide values, a 16-wide latent; 8 experts in 2 groups
    mla = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 128,
           "num_hidden_layers": 3, "intermediate_size": 96, "moe_intermediate_size": 32, "kv_lora_rank": 16,
           "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 12, "n_routed_experts": 8,
           "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
           "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 1,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048,
           "tie_word_embeddings": False}
    yarn = {"type": "yarn", "factor": 32, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 64}
    v3_yarn = dict(mla, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", q_lora_rank=24,
                   rope_scaling=yarn, num_nextn_predict_layers=1)
    v3_plain = dict(mla, architectures=["DeepseekV3ForCausalLM"], model_type="kimi_k2", q_lora_rank=None,
                    rope_interleave=False, attention_bias=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    # GLM-5, layer 2 "shared" (index_topk_freq 2, index_skip_topk_offset 2: full, full, shared)
    glm5 = dict(mla, architectures=["GlmMoeDsaForCausalLM"], model_type="glm_moe_dsa", q_lora_rank=24,
                rms_norm_eps=1e-5, index_n_heads=2, index_head_dim=16, index_topk_freq=2, index_skip_topk_offset=2)
    assert indexer_types(glm5) == ["full", "full", "shared"]
    assert settings(v3_plain)["q_lora_rank"] is None and settings(v3_yarn)["rope_interleave"] is True

    for config in (v3_yarn, v3_plain):
        tensors = _random_checkpoint(config, seed=4)
        routes = {}
        logits = forward(config, tensors, ids, routes)
        assert logits.shape == (len(ids), config["vocab_size"]) and np.isfinite(logits).all()
        margins = _check_routes(config, routes, ids, [1, 2])
        # a multi-token-prediction layer after num_hidden_layers is not read
        extra = dict(tensors, **{"model.layers.3.input_layernorm.weight": np.full(64, np.nan)})
        assert np.array_equal(forward(config, extra, ids), logits)
        continuation = greedy(config, tensors, ids, 3)
        print(f"DeepseekV3ForCausalLM ({config['model_type']}, q_lora_rank {config['q_lora_rank']}, "
              f"{'yarn' if 'rope_scaling' in config else 'default RoPE, not interleaved'}): "
              f"smallest margins {margins}, greedy {continuation}")
    # YaRN changes the logits (frequencies, cos/sin scaling 1.0 here, softmax scale (1 + 0.1 ln 32)^2)
    tensors = _random_checkpoint(v3_yarn, seed=4)
    assert not np.allclose(forward(v3_yarn, tensors, ids), forward(dict(v3_yarn, rope_scaling=None), tensors, ids))

    # GLM-5 with index_topk 3 < 6 positions: the selection matters
    sparse = dict(glm5, index_topk=3)
    tensors = _random_checkpoint(sparse, seed=6)
    routes, selections = {}, {}
    logits = forward(sparse, tensors, ids, routes, selections)
    assert logits.shape == (len(ids), sparse["vocab_size"]) and np.isfinite(logits).all()
    margins = _check_routes(sparse, routes, ids, [1, 2])
    assert sorted(key for key in selections if key != "margins") == [0, 1, 2] == sorted(selections["margins"])
    for i in range(3):
        rows = selections[i]
        assert rows.shape == (len(ids), 3)
        for s, row in enumerate(rows):
            chosen = row[row >= 0]
            assert len(chosen) == min(3, s + 1) and (np.diff(chosen) > 0).all() and chosen.max() <= s
    assert np.array_equal(selections[2], selections[1]) and selections["margins"][2] == selections["margins"][1]
    # the same weights as plain MLA (DeepSeek-V3 reading them, the indexer tensors unread) differ...
    as_v3 = dict(sparse, architectures=["DeepseekV3ForCausalLM"], rope_interleave=True)
    assert not np.allclose(forward(as_v3, tensors, ids), logits)
    # ...and equal GLM-5 exactly once index_topk reaches the sequence length
    dense = dict(glm5, index_topk=len(ids))
    assert np.array_equal(forward(dense, tensors, ids), forward(as_v3, tensors, ids))
    assert np.array_equal(forward(dict(glm5, index_topk=2048), tensors, ids), forward(as_v3, tensors, ids))
    continuation = greedy(sparse, tensors, ids, 3)
    dsa_margins = ", ".join(f"{selections['margins'][i]:.2e}" for i in range(3))
    print(f"GlmMoeDsaForCausalLM (index_topk 3 of {len(ids)}): expert margins {margins}, "
          f"selection margins {dsa_margins}, greedy {continuation}")


if __name__ == "__main__":
    _smoke()
