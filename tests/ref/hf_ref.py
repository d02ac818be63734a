"""hf_ref.py — the numpy Llama reference over a Hugging Face checkpoint directory.

Reads config.json and the safetensors files with the `safetensors` package
(the reference implementation; BF16, which numpy lacks, is widened from the
raw bytes here) and keeps every weight exactly as Hugging Face stores it: q_proj
and k_proj stay in their own row order and RoPE is Hugging Face's
"rotate half" form, out = x * cos + rotate_half(x) * sin with
rotate_half(x) = [-x2, x1] over the two halves of each head, and llama3 rope
scaling as transformers computes it (_compute_llama3_parameters). So this
shares neither file parsing nor the q/k row permutation with specd; the rest
of the forward pass is llama_ref.LlamaRef's.
"""
import json
import math
import os
import struct

import numpy as np

from llama_ref import LlamaRef

HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
HF_LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def safetensors_files(path):
    """Shard file names of the checkpoint in path."""
    idx = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return ["model.safetensors"]


def load_tensors(path):
    """Every tensor of the checkpoint as float64 numpy arrays, by HF name."""
    from safetensors import safe_open
    out = {}
    for name in safetensors_files(path):
        file = os.path.join(path, name)
        with safe_open(file, framework="numpy") as f:  # validates the header (the reference's rules)
            keys = list(f.keys())
            bf16 = [k for k in keys if f.get_slice(k).get_dtype() == "BF16"]
            for k in keys:
                if k not in bf16:
                    out[k] = f.get_tensor(k).astype(np.float64)
        if bf16:  # numpy has no bfloat16: widen the raw bytes (bf16 is the top half of an f32)
            with open(file, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
                data = fh.read()
            for k in bf16:
                b, e = header[k]["data_offsets"]
                u16 = np.frombuffer(data[b:e], dtype="<u2").astype(np.uint32) << 16
                out[k] = u16.view(np.float32).astype(np.float64).reshape(header[k]["shape"])
    return out


class HFLlamaRef(LlamaRef):
    def __init__(self, path, dtype=np.float64):  # noqa: super().__init__ reads GGUF; this reads HF
        self.dtype = np.dtype(dtype)
        with open(os.path.join(path, "config.json")) as f:
            c = json.load(f)
        self.n_embd = c["hidden_size"]
        self.n_layers = c["num_hidden_layers"]
        self.n_ff = c["intermediate_size"]
        self.n_heads = c["num_attention_heads"]
        self.n_kv_heads = c.get("num_key_value_heads", self.n_heads)
        self.head_dim = self.n_embd // self.n_heads
        self.n_rot = self.head_dim
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.rope_base = float(c.get("rope_theta", 10000.0))
        hf = load_tensors(path)
        self.w = {}
        for gg, name in HF_NAMES.items():
            if name in hf:
                self.w[gg] = hf[name].astype(self.dtype)
        for l in range(self.n_layers):
            for part, name in HF_LAYER.items():
                self.w[f"blk.{l}.{part}.weight"] = hf[f"model.layers.{l}.{name}.weight"].astype(self.dtype)
        self.tied = bool(c.get("tie_word_embeddings", False))
        if self.tied:
            self.w.pop("output.weight", None)
        self.lm_head = self.w["token_embd.weight"] if self.tied else self.w["output.weight"]
        self.n_vocab = self.lm_head.shape[0]
        self._check_shapes()
        self.freqs = self._hf_inv_freq(c.get("rope_scaling"))
        self.pos_scale = 1.0

    def _hf_inv_freq(self, rs):
        dim = self.head_dim
        inv = 1.0 / (self.rope_base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
        kind = None if rs is None else rs.get("rope_type", rs.get("type"))
        if kind in (None, "default"):
            return inv
        if kind == "linear":
            return inv / float(rs["factor"])
        if kind == "llama3":
            factor, low, high = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
            old = float(rs["original_max_position_embeddings"])
            low_wl, high_wl = old / low, old / high
            wavelen = 2 * math.pi / inv
            llama = np.where(wavelen > low_wl, inv / factor, inv)
            smooth = (old / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * llama / factor + smooth * llama
            medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
            return np.where(medium, smoothed, llama)
        raise ValueError(f"rope scaling {kind!r}")

    def _rope(self, x, pos):
        # x [T, H, hd]: Hugging Face's apply_rotary_pos_emb with rotate_half
        half = self.head_dim // 2
        ang = pos.astype(np.float64)[:, None] * self.freqs[None, :]  # [T, hd/2]
        cos = np.cos(ang)[:, None, :].astype(self.dtype)
        sin = np.sin(ang)[:, None, :].astype(self.dtype)
        x1, x2 = x[:, :, :half], x[:, :, half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
