"""llama_ref.py — an independent numpy Llama forward pass, the oracle for specd.

Reads a GGUF with the `gguf` PyPI package (GGUFReader + gguf.quants.dequantize),
so nothing here shares code or file parsing with the C engine. Plain and slow
on purpose: one sequence at a time, full causal attention written out, an
optional per-layer KV list for incremental greedy decoding.

Conventions (those of llama.cpp for the llama architecture):
  * weights: a GGUF tensor with ne = [in, out] is read as an array of shape
    (out, in), so y = x @ W.T;
  * the Q and K weights are stored permuted by the GGUF converter, so RoPE is
    the "normal" mode: rotate adjacent pairs (x[2i], x[2i+1]) by the angle
    pos * base^(-2i/n_rot) (the first n_rot dims of each head, the rest as is);
  * RMSNorm: x / sqrt(mean(x^2) + eps) * w;
  * GQA: query head h reads kv head h // (n_heads / n_kv_heads);
  * SwiGLU FFN: down(silu(gate(x)) * up(x));
  * LM head: output.weight, or token_embd.weight when absent (tied);
  * rope scaling: 'linear' divides positions by the factor; 'llama3' (from
    llama.rope.scaling.* keys) or a rope_freqs.weight tensor divides each
    frequency's angle by its factor, as llama.cpp does; so do phi3's LongRoPE
    factors (rope_factors_long when max_ctx, else the file's context, is
    above rope.scaling.original_context_length, else rope_factors_short),
    and phi3's rope.scaling.attn_factor multiplies cos and sin.

Weights as the engine computes on them (act_quant=True, the default): the
CPU engine multiplies Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / K-quant weights with activations quantized
per row into blocks of 32 (the K-quants: of 256, llama.cpp's Q8_K size;
engine/cpu/quant_kernels.h), so before each such matmul the reference
rounds its input the same way, written here in numpy: per block, d =
float32(amax) / 127 in float32, q = rint(x * float32(1 / d)) (round half to
even) clipped to [-127, 127], and the input becomes q * d. (The engine's
integer sums are exact; only its f32 steps are not modelled.)
The weights themselves are dequantized by gguf's own dequantizer; the
products and sums are float64. act_quant=False gives the plain
dequantized-weight model (what the engine computed before it kept weights
as stored).

Usage as a module: m = LlamaRef(path); m.logits([1, 2, 3]) -> [T, n_vocab];
m.greedy(prompt_ids, n_new) -> list of ids. As a script it prints logits
statistics or a greedy continuation for quick manual checks.
"""
import argparse
import math
import sys

import numpy as np
import gguf
from gguf.quants import dequantize


ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "phi3")


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


# GGUF types whose matmuls take 8-bit activations in the engine
_INT_TYPES = ()
try:
    _INT_TYPES = (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0,
                  gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q5_0,
                  gguf.GGMLQuantizationType.Q5_1, gguf.GGMLQuantizationType.Q4_K,
                  gguf.GGMLQuantizationType.Q5_K, gguf.GGMLQuantizationType.Q6_K)
except AttributeError:  # pragma: no cover
    pass

QK = 32
QK_K = 256
# the K-quants' matmuls take activations with one scale per 256 elements
_K_TYPES = ()
try:
    _K_TYPES = (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q5_K, gguf.GGMLQuantizationType.Q6_K)
except AttributeError:  # pragma: no cover
    pass


def quantize_rows_q8(x, block=QK):
    """x [..., n] (n a multiple of block) -> the activations as the engine's
    integer kernels see them: per block of `block` elements (32; 256 for the
    K-quants), d = amax / 127 (float32), q = clip(rint(x * (1 / d)), -127,
    127) in float32, returned as q * d in float64."""
    x32 = np.asarray(x, dtype=np.float32)
    shape = x32.shape
    if shape[-1] % block:
        raise ValueError(f"row length {shape[-1]} is not a multiple of {block}")
    b = x32.reshape(-1, shape[-1] // block, block)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, np.float32(1.0)), np.float32(0.0))
    inv = inv.astype(np.float32)
    q = np.clip(np.rint((b * inv).astype(np.float32)), -127, 127)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(shape)


class LlamaRef:
    # plain llama (a subclass reading another format sets none of _arch_features)
    qkv_bias = qk_norm = post_norms = gelu = rope_neox = False
    embd_scale = 1.0
    attn_scale = None
    window = 0
    swa_pattern = 0
    freqs_swa = None

    def __init__(self, path, dtype=np.float64, n_layers_used=0, act_quant=True, act_jitter=0.0, seed=0, max_ctx=0):
        self.dtype = np.dtype(dtype)
        # max_ctx: the most tokens a sequence will hold (0: the file's context
        # length), which picks a LongRoPE model's factors as llama.cpp's n_ctx does
        self.max_ctx = max_ctx
        self.act_quant = act_quant
        # act_jitter > 0: each activation is multiplied by (1 + act_jitter * N(0, 1))
        # before it is rounded to 8 bits: the same function evaluated with
        # activations a float32 computation could have produced, to measure
        # how much the rounding's discontinuities move the logits
        self.act_jitter = act_jitter
        self.rng = np.random.default_rng(seed)
        r = gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch not in ARCHS:
            raise ValueError(f"{path}: architecture {arch!r}, expected one of {ARCHS}")
        self.arch = arch
        A = lambda k, d=None: _field(r, f"{arch}.{k}", d)
        self.n_embd = int(A("embedding_length"))
        self.n_layers = int(A("block_count"))
        self.n_ff = int(A("feed_forward_length"))
        self.n_heads = int(A("attention.head_count"))
        self.n_kv_heads = int(A("attention.head_count_kv", self.n_heads))
        self.head_dim = int(A("attention.key_length", self.n_embd // self.n_heads))
        self.n_rot = int(A("rope.dimension_count", self.head_dim))
        self.eps = float(A("attention.layer_norm_rms_epsilon", 1e-5))
        self.rope_base = float(A("rope.freq_base", 10000.0))
        self._arch_features(A)
        if n_layers_used:
            self.n_layers = min(self.n_layers, n_layers_used)

        self.tensors = {}
        for t in r.tensors:
            self.tensors[t.name] = t
        self.w = {}
        for name in ["token_embd.weight", "output_norm.weight", "output.weight"]:
            if name in self.tensors:
                self.w[name] = self._load(name)
        for l in range(self.n_layers):
            fused = self.arch == "phi3"
            parts = ["attn_norm", "attn_output", "ffn_norm", "ffn_down"]
            parts += [] if fused else ["attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"]
            for part in parts:
                name = f"blk.{l}.{part}.weight"
                self.w[name] = self._load(name)
            if fused:
                self._split_fused(l)
            extra = []
            if self.qkv_bias:
                extra += ["attn_q.bias", "attn_k.bias", "attn_v.bias"]
            if self.qk_norm:
                extra += ["attn_q_norm.weight", "attn_k_norm.weight"]
            if self.post_norms:
                extra += ["post_attention_norm.weight", "post_ffw_norm.weight"]
            for part in extra:
                name = f"blk.{l}.{part}"
                self.w[name] = self._load(name)
        self.tied = "output.weight" not in self.w
        self.lm_head_name = "token_embd.weight" if self.tied else "output.weight"
        self.lm_head = self.w[self.lm_head_name]
        self.n_vocab = self.lm_head.shape[0]
        self._check_shapes()
        self.freqs = self._rope_freqs(r)
        self.freqs_swa = None
        if self.window and self.rope_base_swa is not None:
            i = np.arange(self.n_rot // 2, dtype=np.float64)
            self.freqs_swa = self.rope_base_swa ** (-2.0 * i / self.n_rot)

    def _arch_features(self, A):
        """What each architecture adds over llama (engine/formats/model_config.c,
        from llama.cpp's graphs): qwen2 Q/K/V biases; qwen3 per-head q/k
        RMSNorm; gemma3 the embedding scaled by sqrt(n_embd), q/k norms,
        post-attention and post-FFN norms (GGUF stores Gemma's 1 + w folded
        into the weights), GeGLU with tanh gelu, every 6th layer global and
        the others windowed with RoPE base 10000; qwen2/qwen3/gemma3/phi3 rotate
        NeoX halves; phi3 fuses Q/K/V and gate/up (_split_fused) and attends
        to every position (llama.cpp ignores its window); llama with a sliding
        window (Mistral) windows every layer."""
        arch = self.arch
        self.qkv_bias = arch == "qwen2"
        self.qk_norm = arch in ("qwen3", "gemma3")
        self.post_norms = self.gelu = arch == "gemma3"
        self.rope_neox = arch in ("qwen2", "qwen3", "gemma3", "phi3")
        self.embd_scale = math.sqrt(self.n_embd) if arch == "gemma3" else 1.0
        self.attn_scale = 1.0 / math.sqrt(self.head_dim)
        if arch == "gemma3" and self.n_layers == 62:
            self.attn_scale = 1.0 / math.sqrt(self.n_embd // self.n_heads)
        self.window = int(A("attention.sliding_window", 0) or 0) if arch in ("llama", "gemma3") else 0
        self.swa_pattern = 6 if arch == "gemma3" else 0
        base_swa = A("rope.freq_base_swa", 10000.0 if arch == "gemma3" else None)
        self.rope_base_swa = float(base_swa) if base_swa is not None else None

    def _split_fused(self, l):
        """phi3: attn_qkv's rows are Q, K, V stacked, ffn_up's the gate's then
        the up's (llama.cpp's layout); each part keeps the fused tensor's type
        (the engine rounds the shared input the same way for each)."""
        b = f"blk.{l}."
        qkv = self._load(b + "attn_qkv.weight")
        qd, kd = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        if qkv.shape[0] != qd + 2 * kd:
            raise ValueError(f"{b}attn_qkv.weight has {qkv.shape[0]} rows, expected {qd + 2 * kd}")
        up = self._load(b + "ffn_up.weight")
        if up.shape[0] != 2 * self.n_ff:
            raise ValueError(f"{b}ffn_up.weight has {up.shape[0]} rows, expected {2 * self.n_ff}")
        parts = {"attn_q": (qkv, 0, qd, "attn_qkv"), "attn_k": (qkv, qd, qd + kd, "attn_qkv"),
                 "attn_v": (qkv, qd + kd, qd + 2 * kd, "attn_qkv"), "ffn_gate": (up, 0, self.n_ff, "ffn_up"),
                 "ffn_up": (up, self.n_ff, 2 * self.n_ff, "ffn_up")}
        fused_t = {src: self.tensors[b + src + ".weight"] for src in ("attn_qkv", "ffn_up")}
        for part, (a, lo, hi, src) in parts.items():
            self.w[b + part + ".weight"] = a[lo:hi]
            self.tensors[b + part + ".weight"] = fused_t[src]

    def layer_swa(self, l):
        return self.window > 0 and (self.swa_pattern == 0 or l % self.swa_pattern != self.swa_pattern - 1)

    def _mm(self, x, name, w=None):
        """x @ W.T for weight name (w: its array, default self.w[name]), the
        input rounded to 8-bit blocks first when the engine does (see the
        module comment)."""
        if w is None:
            w = self.w[name]
        # (a subclass reading another format, hf_ref.HFLlamaRef, has no GGUF
        # tensors and no integer formats)
        t = getattr(self, "tensors", {}).get(name)
        if getattr(self, "act_quant", False) and t is not None and getattr(t, "tensor_type", None) in _INT_TYPES:
            if self.act_jitter:
                x = x * (1.0 + self.act_jitter * self.rng.standard_normal(x.shape))
            block = QK_K if t.tensor_type in _K_TYPES else QK
            x = quantize_rows_q8(x, block).astype(self.dtype)
        return x @ w.T

    def _load(self, name):
        t = self.tensors[name]
        a = dequantize(t.data, t.tensor_type)
        # ne = [in, out] (fastest first) -> numpy shape (out, in)
        want = tuple(int(x) for x in reversed(t.shape))
        a = np.asarray(a).reshape(want)
        return a.astype(self.dtype)

    def _check_shapes(self):
        E, F, hd = self.n_embd, self.n_ff, self.head_dim
        assert self.w["token_embd.weight"].shape[1] == E
        assert self.lm_head.shape == (self.n_vocab, E)
        for l in range(self.n_layers):
            g = lambda p: self.w[f"blk.{l}.{p}.weight"].shape
            assert g("attn_q") == (self.n_heads * hd, E), g("attn_q")
            assert g("attn_k") == (self.n_kv_heads * hd, E), g("attn_k")
            assert g("attn_v") == (self.n_kv_heads * hd, E), g("attn_v")
            assert g("attn_output") == (E, self.n_heads * hd), g("attn_output")
            assert g("ffn_gate") == (F, E) and g("ffn_up") == (F, E), g("ffn_gate")
            assert g("ffn_down") == (E, F), g("ffn_down")

    def _rope_freqs(self, r):
        """Per-pair angular frequency (radians per position), shape [n_rot/2]."""
        i = np.arange(self.n_rot // 2, dtype=np.float64)
        freqs = self.rope_base ** (-2.0 * i / self.n_rot)
        self.pos_scale = 1.0
        arch = self.arch
        stype = _field(r, f"{arch}.rope.scaling.type")
        factor = float(_field(r, f"{arch}.rope.scaling.factor", 1.0) or 1.0)
        # phi3's attention factor multiplies cos and sin (llama.cpp's attn_factor), LongRoPE or not
        self.rope_mscale = float(_field(r, f"{arch}.rope.scaling.attn_factor", 1.0)) if arch == "phi3" else 1.0
        if "rope_factors_long.weight" in self.tensors:
            # LongRoPE (phi3 128k): the long factors when the context exceeds the original one, else the short
            n_ctx = int(_field(r, f"{arch}.context_length"))
            orig = int(_field(r, f"{arch}.rope.scaling.original_context_length", n_ctx))
            which = "long" if (self.max_ctx or n_ctx) > orig else "short"
            t = self.tensors[f"rope_factors_{which}.weight"]
            ff = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(-1)
            assert ff.size == len(freqs), (ff.size, len(freqs))
            self.rope_factor_set = which
            freqs = freqs / ff
        elif "rope_freqs.weight" in self.tensors:
            t = self.tensors["rope_freqs.weight"]
            ff = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(-1)
            freqs = freqs / ff[: len(freqs)]
        elif stype == "linear":
            self.pos_scale = 1.0 / factor
        elif stype == "llama3":
            low = float(_field(r, f"{arch}.rope.scaling.low_freq_factor", 1.0))
            high = float(_field(r, f"{arch}.rope.scaling.high_freq_factor", 4.0))
            orig = float(_field(r, f"{arch}.rope.scaling.original_context_length", 8192))
            wavelen = 2.0 * math.pi / freqs
            out = np.empty_like(freqs)
            for k in range(len(freqs)):
                if wavelen[k] < orig / high:
                    out[k] = freqs[k]
                elif wavelen[k] > orig / low:
                    out[k] = freqs[k] / factor
                else:
                    smooth = (orig / wavelen[k] - low) / (high - low)
                    out[k] = (1.0 - smooth) * freqs[k] / factor + smooth * freqs[k]
            freqs = out
        elif stype not in (None, "none", ""):
            raise ValueError(f"unsupported rope scaling type {stype!r}")
        return freqs

    # ---- building blocks ----

    def _rmsnorm(self, x, w):
        # x [T, E], w [E]
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(ms + self.eps) * w

    def _rope(self, x, pos, swa=False):
        # x [T, H, hd], pos [T] -> rotated copy (adjacent pairs of the first n_rot dims;
        # NeoX: x[i] with x[i + n_rot/2]); swa: the windowed layers' frequencies
        if swa and self.freqs_swa is not None:
            ang = pos.astype(np.float64)[:, None] * self.freqs_swa[None, :]
        else:
            ang = (pos.astype(np.float64) * self.pos_scale)[:, None] * self.freqs[None, :]  # [T, n_rot/2]
        mscale = 1.0 if swa else getattr(self, "rope_mscale", 1.0)
        cos = (mscale * np.cos(ang))[:, None, :].astype(self.dtype)
        sin = (mscale * np.sin(ang))[:, None, :].astype(self.dtype)
        out = x.copy()
        if self.rope_neox:
            half = self.n_rot // 2
            x0 = x[:, :, 0:half]
            x1 = x[:, :, half:self.n_rot]
            out[:, :, 0:half] = x0 * cos - x1 * sin
            out[:, :, half:self.n_rot] = x0 * sin + x1 * cos
            return out
        x0 = x[:, :, 0:self.n_rot:2]
        x1 = x[:, :, 1:self.n_rot:2]
        out[:, :, 0:self.n_rot:2] = x0 * cos - x1 * sin
        out[:, :, 1:self.n_rot:2] = x0 * sin + x1 * cos
        return out

    # ---- forward ----

    def forward(self, tokens, cache=None, capture=None):
        """Runs new tokens of one sequence. cache: None (sequence starts at 0,
        nothing kept) or a dict from new_cache() that is extended in place.
        capture: None or a dict that receives "layers" (a list: layer l's
        output, the residual stream after it, [T, n_embd]) and "final" (the
        last layer's output after the output norm: logits = final @ lm_head.T),
        the features an EAGLE-3 head reads (tools/eagle). Returns logits
        [T, n_vocab] in self.dtype."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1 or tokens.size == 0:
            raise ValueError("tokens must be a non-empty 1-d sequence")
        if tokens.min() < 0 or tokens.max() >= self.w["token_embd.weight"].shape[0]:
            raise ValueError("token id out of range")
        if cache is None:
            cache = self.new_cache()
        start = cache["len"]
        T = tokens.size
        pos = np.arange(start, start + T)
        H, KVH, hd = self.n_heads, self.n_kv_heads, self.head_dim
        group = H // KVH
        x = self.w["token_embd.weight"][tokens]  # [T, E]
        if self.embd_scale != 1.0:
            x = x * float(np.float32(self.embd_scale))
        for l in range(self.n_layers):
            W = lambda p: self.w[f"blk.{l}.{p}.weight"]
            M = lambda a, p: self._mm(a, f"blk.{l}.{p}.weight")
            h = self._rmsnorm(x, W("attn_norm"))
            q = M(h, "attn_q")
            k = M(h, "attn_k")
            v = M(h, "attn_v")
            if self.qkv_bias:
                q = q + self.w[f"blk.{l}.attn_q.bias"]
                k = k + self.w[f"blk.{l}.attn_k.bias"]
                v = v + self.w[f"blk.{l}.attn_v.bias"]
            q, k, v = q.reshape(T, H, hd), k.reshape(T, KVH, hd), v.reshape(T, KVH, hd)
            if self.qk_norm:
                q = self._rmsnorm(q, self.w[f"blk.{l}.attn_q_norm.weight"])
                k = self._rmsnorm(k, self.w[f"blk.{l}.attn_k_norm.weight"])
            swa = self.layer_swa(l)
            # (hf_ref.HFLlamaRef's _rope takes no window flag: llama, never windowed)
            q = self._rope(q, pos, swa) if swa else self._rope(q, pos)
            k = self._rope(k, pos, swa) if swa else self._rope(k, pos)
            ks = np.concatenate([cache["k"][l], k]) if start else k  # [S, KVH, hd]
            vs = np.concatenate([cache["v"][l], v]) if start else v
            cache["k"][l], cache["v"][l] = ks, vs
            S = ks.shape[0]
            # causal: query at pos p sees keys 0..p (a windowed layer: p - window + 1 .. p)
            mask = np.arange(S)[None, :] > pos[:, None]  # [T, S]
            if swa:
                mask = mask | (np.arange(S)[None, :] <= pos[:, None] - self.window)
            att = np.empty((T, H, hd), dtype=self.dtype)
            scale = self.attn_scale or 1.0 / math.sqrt(hd)
            for hh in range(H):
                kh = hh // group
                sc = (q[:, hh, :] @ ks[:, kh, :].T) * scale  # [T, S]
                sc = np.where(mask, -np.inf, sc)
                sc = sc - sc.max(axis=1, keepdims=True)
                p = np.exp(sc)
                p = p / p.sum(axis=1, keepdims=True)
                att[:, hh, :] = p @ vs[:, kh, :]
            o = M(att.reshape(T, H * hd), "attn_output")
            if self.post_norms:
                o = self._rmsnorm(o, W("post_attention_norm"))
            x = x + o
            h = self._rmsnorm(x, W("ffn_norm"))
            g = M(h, "ffn_gate")  # [T, F]
            u = M(h, "ffn_up")
            if self.gelu:
                act = 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3)))
            else:
                act = g / (1.0 + np.exp(-g))
            o = M(act * u, "ffn_down")
            if self.post_norms:
                o = self._rmsnorm(o, W("post_ffw_norm"))
            x = x + o
            if capture is not None:
                capture.setdefault("layers", []).append(x)
        cache["len"] = start + T
        x = self._rmsnorm(x, self.w["output_norm.weight"])
        if capture is not None:
            capture["final"] = x
        return self._mm(x, getattr(self, "lm_head_name", "output.weight"), self.lm_head)  # [T, n_vocab]

    def new_cache(self):
        return {"len": 0, "k": [None] * self.n_layers, "v": [None] * self.n_layers}

    def logits(self, tokens):
        """Logits [T, n_vocab] of every position of one sequence starting at 0."""
        return self.forward(tokens)

    def greedy(self, prompt, n_new, stop_ids=()):
        """Greedy continuation (argmax, lowest id on ties) of n_new tokens,
        stopping early after a token in stop_ids (which is included)."""
        cache = self.new_cache()
        logits = self.forward(prompt, cache)[-1]
        out = []
        for _ in range(n_new):
            tok = int(np.argmax(logits))
            out.append(tok)
            if tok in stop_ids:
                break
            logits = self.forward([tok], cache)[-1]
        return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", default="1,2,3", help="comma-separated prompt ids")
    ap.add_argument("--greedy", type=int, default=0, help="generate this many tokens")
    ap.add_argument("--f32", action="store_true", help="compute in float32")
    ap.add_argument("--no-act-quant", action="store_true",
                    help="do not round activations to 8 bits before quantized matmuls")
    a = ap.parse_args(argv)
    m = LlamaRef(a.model, np.float32 if a.f32 else np.float64, act_quant=not a.no_act_quant)
    toks = [int(t) for t in a.tokens.split(",")]
    if a.greedy:
        print(",".join(str(t) for t in m.greedy(toks, a.greedy)))
    else:
        lg = m.logits(toks)
        for i, row in enumerate(lg):
            print(f"pos {i}: argmax {int(np.argmax(row))} max {row.max():.6f} mean {row.mean():.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
