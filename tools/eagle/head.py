"""head.py — the EAGLE-3 draft head in JAX: its configuration, parameters,
forward pass with the training-time test, and the published checkpoint
layout (what SGLang and vLLM load as LlamaForCausalLMEagle3).

Published layout (an HF directory):
  config.json  architectures ["LlamaForCausalLMEagle3"], model_type llama,
               hidden_size H, intermediate_size I, num_attention_heads,
               num_key_value_heads, head_dim, num_hidden_layers 1,
               rms_norm_eps, rope_theta, rope_scaling, vocab_size V (the
               target's), draft_vocab_size Vd, tie_word_embeddings false,
               eagle_config {eagle_aux_hidden_state_layer_ids [a, b, c]}
  model.safetensors (no embed_tokens: the target's embedding is used)
    fc.weight                               [H, 3H]
    midlayer.hidden_norm.weight             [H]
    midlayer.input_layernorm.weight         [H]
    midlayer.self_attn.q_proj.weight        [n_heads * hd, 2H]
    midlayer.self_attn.k_proj.weight        [n_kv * hd, 2H]
    midlayer.self_attn.v_proj.weight        [n_kv * hd, 2H]
    midlayer.self_attn.o_proj.weight        [H, n_heads * hd]
    midlayer.post_attention_layernorm.weight [H]
    midlayer.mlp.gate_proj.weight           [I, H]
    midlayer.mlp.up_proj.weight             [I, H]
    midlayer.mlp.down_proj.weight           [H, I]
    norm.weight                             [H]
    lm_head.weight                          [Vd, H]
    d2t  I64 [Vd]: target id = draft id + d2t[draft id]
    t2d  BOOL [V]: t2d[target id] = the id is in the draft vocabulary
  Weights y = x @ W.T (torch Linear); F16 or F32.

One step of the head (SGLang llama_eagle3 / SafeAILab cnets semantics):
  g      = fc(aux)  for a position whose features come from the target,
           or the previous step's prenorm output h for a drafted one
  x      = [input_layernorm(embed(tok)) ; hidden_norm(g)]   [2H], embedding FIRST
  a      = o_proj(attention(q, k, v of x))   RoPE rotate-half (HF layout), causal
  r      = g + a
  h      = r + mlp(post_attention_layernorm(r))            (prenorm output)
  logits = lm_head(norm(h))  over the draft vocabulary     [Vd]
Shift: the features of position t with the embedding of token t+1 predict
token t+2 (the target's distribution at position t+1).

Training-time test (EAGLE-3): step k (k = 0 .. K-1) feeds every row t its
own step k-1 output h and the embedding of token t+1+k, at RoPE position
t+k, and predicts token t+2+k. Its query attends the step-0 keys of
positions 0..t (causal) and the keys of steps 1..k of the same row only —
what a drafting chain started after position t sees at inference.
"""
import json
import math
import os

import numpy as np
import jax
import jax.numpy as jnp
from safetensors.numpy import save_file, load_file

LAYER = "midlayer."
ARCH = "LlamaForCausalLMEagle3"


class HeadConfig:
    """Shape of a head; the layer's shape is the target's (EAGLE-3 heads
    copy it). layer_ids: output-of-layer ids (target.py)."""

    def __init__(self, hidden, n_heads, n_kv_heads, head_dim, ff, eps, rope_theta, vocab, draft_vocab,
                 layer_ids, max_pos=2048, rope_scaling=None, bos=None, eos=None):
        self.hidden, self.n_heads, self.n_kv_heads, self.head_dim = hidden, n_heads, n_kv_heads, head_dim
        self.ff, self.eps, self.rope_theta, self.rope_scaling = ff, eps, rope_theta, rope_scaling
        self.vocab, self.draft_vocab, self.layer_ids = vocab, draft_vocab, list(layer_ids)
        self.max_pos, self.bos, self.eos = max_pos, bos, eos

    @classmethod
    def from_target(cls, t, draft_vocab, layer_ids):
        return cls(t.hidden, t.n_heads, t.n_kv_heads, t.head_dim, t.ff, t.eps, t.rope_theta, t.vocab,
                   draft_vocab, layer_ids, t.ctx, t.rope_scaling, t.bos, t.eos)

    def to_json(self, dtype="float16"):
        return {
            "architectures": [ARCH], "model_type": "llama",
            "hidden_size": self.hidden, "intermediate_size": self.ff,
            "num_attention_heads": self.n_heads, "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim, "num_hidden_layers": 1, "hidden_act": "silu",
            "rms_norm_eps": self.eps, "rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_pos, "vocab_size": self.vocab,
            "draft_vocab_size": self.draft_vocab, "tie_word_embeddings": False,
            "attention_bias": False, "mlp_bias": False, "torch_dtype": dtype,
            "bos_token_id": self.bos, "eos_token_id": self.eos,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": self.layer_ids,
                             "use_aux_hidden_state": True},
        }

    @classmethod
    def from_json(cls, c):
        if ARCH not in c.get("architectures", []):
            raise ValueError(f"config.json: architectures {c.get('architectures')}, expected [{ARCH!r}]")
        ids = (c.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        return cls(c["hidden_size"], c["num_attention_heads"], c.get("num_key_value_heads",
                   c["num_attention_heads"]), hd, c["intermediate_size"], c.get("rms_norm_eps", 1e-5),
                   c.get("rope_theta", 10000.0), c["vocab_size"], c.get("draft_vocab_size") or c["vocab_size"],
                   ids or [], c.get("max_position_embeddings", 2048), c.get("rope_scaling"),
                   c.get("bos_token_id"), c.get("eos_token_id"))

    def shapes(self):
        """Published tensor name -> shape, d2t / t2d left out."""
        H, I, hd = self.hidden, self.ff, self.head_dim
        q, kv = self.n_heads * hd, self.n_kv_heads * hd
        return {
            "fc.weight": (H, 3 * H),
            LAYER + "hidden_norm.weight": (H,), LAYER + "input_layernorm.weight": (H,),
            LAYER + "self_attn.q_proj.weight": (q, 2 * H), LAYER + "self_attn.k_proj.weight": (kv, 2 * H),
            LAYER + "self_attn.v_proj.weight": (kv, 2 * H), LAYER + "self_attn.o_proj.weight": (H, q),
            LAYER + "post_attention_layernorm.weight": (H,),
            LAYER + "mlp.gate_proj.weight": (I, H), LAYER + "mlp.up_proj.weight": (I, H),
            LAYER + "mlp.down_proj.weight": (H, I),
            "norm.weight": (H,), "lm_head.weight": (self.draft_vocab, H),
        }


def inv_freq(cfg):
    """[head_dim / 2] angular frequency per rotated pair (HF rope, with
    linear or llama3 scaling)."""
    hd = cfg.head_dim
    f = cfg.rope_theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        f = f / float(rs["factor"])
    elif kind == "llama3":
        factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        orig = float(rs["original_max_position_embeddings"])
        wl = 2 * math.pi / f
        smooth = np.clip((orig / wl - lo) / (hi - lo), 0.0, 1.0)
        f = np.where(wl < orig / hi, f, np.where(wl > orig / lo, f / factor,
                                                  (1 - smooth) * f / factor + smooth * f))
    elif kind not in (None, "default"):
        raise ValueError(f"rope_scaling type {kind!r} is not supported")
    return f.astype(np.float32)


def init_params(cfg, seed, lm_head=None, norm=None):
    """Random head (normal, std 0.02; the output projections smaller; fc
    plus a pass-through of the third captured layer) as a dict of float32
    arrays keyed by the published names. lm_head [Vd, H]
    and norm [H], when given, start the head's output from the target's
    (its LM head rows of the draft vocabulary and its output norm)."""
    rng = np.random.default_rng(seed)
    p = {}
    for name, shape in cfg.shapes().items():
        if len(shape) == 1:
            p[name] = np.ones(shape, np.float32)
        else:
            std = 0.02 / (math.sqrt(2.0) if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0)
            p[name] = (rng.standard_normal(shape) * std).astype(np.float32)
    # fc starts as a pass-through of the highest captured layer, so that the
    # head's output begins in the space of the target's late hidden states
    # (where the target's LM head rows below read it)
    H = cfg.hidden
    p["fc.weight"][:, 2 * H:] += np.eye(H, dtype=np.float32)
    if lm_head is not None:
        p["lm_head.weight"] = np.asarray(lm_head, np.float32).copy()
    if norm is not None:
        p["norm.weight"] = np.asarray(norm, np.float32).copy()
    return p


# ---- forward ----

def _rms(x, w, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, pos, freq):
    # x [B, T, n, hd], pos [T] -> rotate-half rope (pairs i, i + hd/2)
    ang = pos.astype(jnp.float32)[:, None] * freq[None, :]          # [T, hd/2]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _qkv(p, cfg, emb, g, pos, freq):
    # emb, g [B, T, H] -> q [B, T, nh, hd], k, v [B, T, nkv, hd]
    x = jnp.concatenate([_rms(emb, p[LAYER + "input_layernorm.weight"], cfg.eps),
                         _rms(g, p[LAYER + "hidden_norm.weight"], cfg.eps)], axis=-1)   # [B, T, 2H]
    B, T, _ = x.shape
    q = (x @ p[LAYER + "self_attn.q_proj.weight"].T).reshape(B, T, cfg.n_heads, cfg.head_dim)
    k = (x @ p[LAYER + "self_attn.k_proj.weight"].T).reshape(B, T, cfg.n_kv_heads, cfg.head_dim)
    v = (x @ p[LAYER + "self_attn.v_proj.weight"].T).reshape(B, T, cfg.n_kv_heads, cfg.head_dim)
    return _rope(q, pos, freq), _rope(k, pos, freq), v


def _attend(cfg, q, k0, v0, ks, vs):
    """q [B, T, nh, hd] against the step-0 keys k0 [B, T, nkv, hd] (causal)
    and, per row, the chain's keys ks[j] [B, T, nkv, hd] of the same row.
    Returns [B, T, nh * hd]."""
    B, T, nkv, hd = k0.shape
    grp = cfg.n_heads // nkv
    qg = q.reshape(B, T, nkv, grp, hd)
    scale = 1.0 / math.sqrt(hd)
    s0 = jnp.einsum("btkgd,bskd->bkgts", qg, k0) * scale                    # [B, nkv, g, T, T]
    causal = jnp.arange(T)[None, :] <= jnp.arange(T)[:, None]               # [t, s]
    s0 = jnp.where(causal, s0, -jnp.inf)
    sj = [jnp.einsum("btkgd,btkd->bkgt", qg, kj) * scale for kj in ks]    # each [B, nkv, g, T]
    m = jnp.max(s0, axis=-1)
    for s in sj:
        m = jnp.maximum(m, s)
    e0 = jnp.exp(s0 - m[..., None])
    ej = [jnp.exp(s - m) for s in sj]
    den = jnp.sum(e0, axis=-1)
    out = jnp.einsum("bkgts,bskd->bkgtd", e0, v0)
    for e, vj in zip(ej, vs):
        den = den + e
        out = out + e[..., None] * jnp.transpose(vj, (0, 2, 1, 3))[:, :, None, :, :]
    out = out / den[..., None]                                               # [B, nkv, g, T, hd]
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, T, cfg.n_heads * hd)


def _finish(p, cfg, g, attn):
    # g (the residual) [B, T, H], attn [B, T, nh*hd] -> prenorm h, logits [B, T, Vd]
    r = g + attn @ p[LAYER + "self_attn.o_proj.weight"].T
    x = _rms(r, p[LAYER + "post_attention_layernorm.weight"], cfg.eps)
    gate = x @ p[LAYER + "mlp.gate_proj.weight"].T
    up = x @ p[LAYER + "mlp.up_proj.weight"].T
    h = r + (jax.nn.silu(gate) * up) @ p[LAYER + "mlp.down_proj.weight"].T
    logits = _rms(h, p["norm.weight"], cfg.eps) @ p["lm_head.weight"].T
    return h, logits


def ttt_forward(p, cfg, aux, emb, n_steps):
    """aux [B, T, 3H]: target features of positions 0..T-1; emb [B, T +
    n_steps, H]: embeddings of the tokens at positions 0..T+n_steps-1.
    Returns the logits of each step, a list of n_steps [B, T, Vd]: step k,
    row t predicts token t+2+k."""
    T = aux.shape[1]
    freq = jnp.asarray(inv_freq(cfg))
    g = aux @ p["fc.weight"].T                                               # [B, T, H]
    pos = jnp.arange(T)
    q, k0, v0 = _qkv(p, cfg, emb[:, 1:1 + T], g, pos, freq)
    g, logits = _finish(p, cfg, g, _attend(cfg, q, k0, v0, [], []))
    out, ks, vs = [logits], [], []
    for k in range(1, n_steps):
        q, kk, vv = _qkv(p, cfg, emb[:, 1 + k:1 + k + T], g, pos + k, freq)
        ks.append(kk)
        vs.append(vv)
        g, logits = _finish(p, cfg, g, _attend(cfg, q, k0, v0, ks, vs))
        out.append(logits)
    return out


def step_weights(n_steps, decay=0.8):
    return [decay ** k for k in range(n_steps)]


def ttt_loss(p, cfg, aux, emb, tgt_logits, weight, n_steps):
    """EAGLE-3's loss: per step k, the cross-entropy of the head's draft
    distribution against the target's (softmax of its logits restricted to
    the draft vocabulary), at the positions weight > 0, weighted 0.8^k;
    computed as the KL divergence (the same gradient).
    tgt_logits [B, T + n_steps, Vd] and weight [B, T + n_steps] are indexed
    by the position whose target distribution is the label (row t, step k:
    position t+1+k). Returns (loss, (per-step loss, per-step accuracy))."""
    T = aux.shape[1]
    outs = ttt_forward(p, cfg, aux, emb, n_steps)
    total, losses, accs = 0.0, [], []
    for k, (logits, wk) in enumerate(zip(outs, step_weights(n_steps))):
        tl = tgt_logits[:, 1 + k:1 + k + T]
        w = weight[:, 1 + k:1 + k + T]
        lpt = jax.nn.log_softmax(tl, axis=-1)
        pt = jnp.exp(lpt)
        # KL(target || head): the cross-entropy less the target's entropy
        # (the same gradient; 0 for a head that matches the target)
        ce = jnp.sum(pt * (lpt - jax.nn.log_softmax(logits, axis=-1)), axis=-1)   # [B, T]
        n = jnp.maximum(jnp.sum(w), 1.0)
        lk = jnp.sum(ce * w) / n
        acc = jnp.sum((jnp.argmax(logits, -1) == jnp.argmax(tl, -1)) * w) / n
        total = total + wk * lk
        losses.append(lk)
        accs.append(acc)
    return total, (jnp.stack(losses), jnp.stack(accs))


# ---- the published checkpoint ----

def save_head(out_dir, cfg, params, d2t, t2d, dtype="float16", extra=None):
    """Writes config.json and model.safetensors (published layout) into
    out_dir; extra: a dict written as specd_train.json (provenance)."""
    if dtype not in ("float16", "float32"):
        raise ValueError(f"dtype {dtype!r}: float16 or float32")
    os.makedirs(out_dir, exist_ok=True)
    npd = np.float16 if dtype == "float16" else np.float32
    tensors = {}
    for name, shape in cfg.shapes().items():
        a = np.asarray(params[name], np.float32)
        if a.shape != shape:
            raise ValueError(f"{name}: shape {a.shape}, expected {shape}")
        tensors[name] = np.ascontiguousarray(a.astype(npd))
    d2t = np.asarray(d2t, np.int64)
    t2d = np.asarray(t2d, np.bool_)
    if d2t.shape != (cfg.draft_vocab,) or t2d.shape != (cfg.vocab,):
        raise ValueError(f"d2t {d2t.shape} / t2d {t2d.shape} do not fit Vd={cfg.draft_vocab}, V={cfg.vocab}")
    tensors["d2t"], tensors["t2d"] = d2t, t2d
    tmp = os.path.join(out_dir, "model.safetensors.tmp")
    save_file(tensors, tmp, metadata={"format": "pt"})
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg.to_json(dtype), f, indent=2)
        f.write("\n")
    if extra is not None:
        with open(os.path.join(out_dir, "specd_train.json"), "w") as f:
            json.dump(extra, f, indent=2)
            f.write("\n")


def load_head(head_dir):
    """(cfg, params float32 dict, d2t int64, t2d bool) of a published-layout
    head; missing or mis-shaped tensors are refused by name."""
    with open(os.path.join(head_dir, "config.json")) as f:
        cfg = HeadConfig.from_json(json.load(f))
    t = load_file(os.path.join(head_dir, "model.safetensors"))
    params = {}
    for name, shape in cfg.shapes().items():
        if name not in t:
            raise ValueError(f"{head_dir}: tensor {name} missing")
        if tuple(t[name].shape) != shape:
            raise ValueError(f"{head_dir}: {name} has shape {t[name].shape}, expected {shape}")
        params[name] = t[name].astype(np.float32)
    for name in ("d2t", "t2d"):
        if name not in t:
            raise ValueError(f"{head_dir}: tensor {name} missing")
    return cfg, params, t["d2t"].astype(np.int64), t["t2d"].astype(np.bool_)
