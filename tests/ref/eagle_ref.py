"""eagle_ref.py — EAGLE-3 draft heads for tests: a writer of random heads in
the published layout (or the speculators one) and a numpy reference forward,
written from the format's description (engine/spec/include/specd/eagle.h;
SGLang's llama_eagle3.py and vLLM's / speculators' eagle3 code were read,
nothing copied), independent of the C code.

A head's row at position t reads the token after the target position whose
feature it is, and a g vector: fc(the target's three captured layers) for
rows from the target, or the head's own pre-norm output of the row before
while drafting a chain.
"""
import json
import os

import numpy as np
from safetensors.numpy import load_file, save_file


def write_head(path, *, hidden, vocab, draft_vocab, n_heads=4, n_kv_heads=2, ff=None, target_hidden=None,
               layer_ids=None, layout="published", with_embed=True, dtype="float32", seed=0, scale=0.2,
               norm_before_residual=False, rope_theta=10000.0, head_dim=None, tensors_edit=None, config_edit=None):
    """Writes config.json + model.safetensors of a random head to path (a directory).
    tensors_edit(dict) / config_edit(dict) may damage the head for refusal tests."""
    rng = np.random.default_rng(seed)
    H = hidden
    Ht = target_hidden or hidden
    ff = ff or 2 * H
    hd = head_dim or H // n_heads

    def mat(r, c):
        return (rng.standard_normal((r, c)) * scale / np.sqrt(c)).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(H)).astype(np.float32)

    # draft ids: a random subset of the target's, sorted; d2t holds offsets
    hot = np.sort(rng.choice(vocab, size=draft_vocab, replace=False)) if draft_vocab < vocab else np.arange(vocab)
    d2t = (hot - np.arange(draft_vocab)).astype(np.int64)
    t2d = np.zeros(vocab, dtype=bool)
    t2d[hot] = True
    pre = "midlayer." if layout == "published" else "layers.0."
    t = {
        "fc.weight": mat(H, 3 * Ht),
        pre + "hidden_norm.weight": norm(),
        pre + "input_layernorm.weight": norm(),
        pre + "post_attention_layernorm.weight": norm(),
        pre + "self_attn.q_proj.weight": mat(n_heads * hd, 2 * H),
        pre + "self_attn.k_proj.weight": mat(n_kv_heads * hd, 2 * H),
        pre + "self_attn.v_proj.weight": mat(n_kv_heads * hd, 2 * H),
        pre + "self_attn.o_proj.weight": mat(H, n_heads * hd),
        pre + "mlp.gate_proj.weight": mat(ff, H),
        pre + "mlp.up_proj.weight": mat(ff, H),
        pre + "mlp.down_proj.weight": mat(H, ff),
        "norm.weight": norm(),
        "lm_head.weight": mat(draft_vocab, H) * 4.0,
        "d2t": d2t,
        "t2d": t2d,
    }
    if with_embed:
        t["embed_tokens.weight"] = (rng.standard_normal((vocab, H)) * 0.5).astype(np.float32)
    if dtype != "float32":
        import ml_dtypes  # noqa: F401  (bfloat16)
        for k, v in list(t.items()):
            if v.dtype == np.float32:
                t[k] = v.astype(dtype if dtype != "bfloat16" else ml_dtypes.bfloat16)
    layer = {
        "hidden_size": H, "intermediate_size": ff, "num_attention_heads": n_heads, "num_key_value_heads": n_kv_heads,
        "head_dim": hd, "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": rope_theta, "vocab_size": vocab,
        "hidden_act": "silu", "tie_word_embeddings": False, "model_type": "llama",
    }
    if layout == "published":
        cfg = dict(layer, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=draft_vocab)
        if Ht != H:
            cfg["target_hidden_size"] = Ht
        if layer_ids is not None:
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True}
    else:
        cfg = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
               "transformer_layer_config": layer, "draft_vocab_size": draft_vocab,
               "norm_before_residual": norm_before_residual, "target_hidden_size": Ht}
        if layer_ids is not None:
            cfg["eagle_aux_hidden_state_layer_ids"] = list(layer_ids)
    if tensors_edit:
        tensors_edit(t)
    if config_edit:
        config_edit(cfg)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file(t, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return hot


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


class EagleRef:
    """The head's forward in float64 with its own KV cache (one sequence)."""

    def __init__(self, path, target_embed=None):
        cfg = json.load(open(os.path.join(path, "config.json")))
        self.speculators = cfg.get("speculators_model_type") == "eagle3"
        lc = cfg["transformer_layer_config"] if self.speculators else cfg
        self.nbr = bool(cfg.get("norm_before_residual", False)) and self.speculators
        t = {k: v.astype(np.float64) if v.dtype.kind == "f" or str(v.dtype) == "bfloat16" else v
             for k, v in load_file(os.path.join(path, "model.safetensors")).items()}
        pre = "layers.0." if self.speculators else "midlayer."
        self.w = {k[len(pre):] if k.startswith(pre) else k: v for k, v in t.items()}
        self.H = lc["hidden_size"]
        self.nh = lc["num_attention_heads"]
        self.nkv = lc.get("num_key_value_heads", self.nh)
        self.hd = lc.get("head_dim", self.H // self.nh)
        self.eps = lc.get("rms_norm_eps", 1e-6)
        self.theta = lc.get("rope_theta", 10000.0)
        self.embed = self.w.get("embed_tokens.weight")
        if self.embed is None:
            self.embed = np.asarray(target_embed, dtype=np.float64)
        dv = self.w["lm_head.weight"].shape[0]
        self.d2t = np.arange(dv) + self.w["d2t"] if "d2t" in self.w else np.arange(dv)
        self.k = []
        self.v = []

    def fuse(self, aux):
        return np.asarray(aux, dtype=np.float64) @ self.w["fc.weight"].T

    def rope(self, x, pos):  # x [n_heads][hd], rotate-half
        half = self.hd // 2
        inv = 1.0 / self.theta ** (np.arange(half) * 2.0 / self.hd)
        ang = pos * inv
        c, s = np.cos(ang), np.sin(ang)
        a, b = x[:, :half], x[:, half:]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=1)

    def row(self, token, g):
        """One row at the next position: returns (draft logits, pre-norm output)."""
        w = self.w
        pos = len(self.k)
        e = self.embed[token]
        gn = rmsnorm(g, w["hidden_norm.weight"], self.eps)
        res = gn if self.nbr else g
        a = np.concatenate([rmsnorm(e, w["input_layernorm.weight"], self.eps), gn])
        q = self.rope((w["self_attn.q_proj.weight"] @ a).reshape(self.nh, self.hd), pos)
        k = self.rope((w["self_attn.k_proj.weight"] @ a).reshape(self.nkv, self.hd), pos)
        v = (w["self_attn.v_proj.weight"] @ a).reshape(self.nkv, self.hd)
        self.k.append(k)
        self.v.append(v)
        K, V = np.stack(self.k), np.stack(self.v)  # [T][nkv][hd]
        group = self.nh // self.nkv
        att = np.zeros((self.nh, self.hd))
        for h in range(self.nh):
            s = K[:, h // group] @ q[h] / np.sqrt(self.hd)
            p = np.exp(s - s.max())
            att[h] = (p / p.sum()) @ V[:, h // group]
        h1 = res + w["self_attn.o_proj.weight"] @ att.reshape(-1)
        n = rmsnorm(h1, w["post_attention_layernorm.weight"], self.eps)
        gate, up = w["mlp.gate_proj.weight"] @ n, w["mlp.up_proj.weight"] @ n
        h2 = h1 + w["mlp.down_proj.weight"] @ (gate / (1 + np.exp(-gate)) * up)
        logits = w["lm_head.weight"] @ rmsnorm(h2, w["norm.weight"], self.eps)
        return logits, h2
