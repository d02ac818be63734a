"""target.py — the target model's side of EAGLE-3 training: its shape and
frozen weights read from a GGUF, the answers it gives to a prompt set, and
the per-sequence feature dumps the trainer reads.

The dump format (one file per sequence, DIR/NNNNNN.safetensors) is the one
`specd-generate --dump-features DIR --eagle-layers a,b,c` writes:
  tokens  I32 [T]      the sequence (prompt, then the target's answer)
  aux     F32 [T, 3H]  the captured layers' hidden states (the residual
                       stream after layer id, ids ascending), concatenated
                       in that order
  final   F32 [T, H]   the last layer's output after the final norm:
                       target logits = final @ W_lm_head^T
  __metadata__  layer_ids ("a,b,c"), hidden_size, vocab_size, model (the
                GGUF's file name); optional n_prompt (the prompt's length:
                the trainer then weights only the answer's positions).
This module writes the same format from the numpy reference forward
(tests/ref/llama_ref.py, extended to return layer outputs) for tiny test
targets; read_dump() reads either, read_dumps() a dump with its sampled
passes (DIR/s<k>/, train-eagle --samples).

Layer ids: id L is the OUTPUT of layer L (0-based), i.e. the input of
layer L+1 (SGLang's convention for eagle_aux_hidden_state_layer_ids; vLLM
reads the same key as the input of layer L, one lower). The EAGLE-3
default (SGLang/vLLM capture the inputs of layers 2, N/2 and N-3) is, in
this convention, [1, N//2 - 1, N - 4].
"""
import os
import sys

import numpy as np
import gguf
from gguf.quants import dequantize
from safetensors.numpy import save_file, safe_open

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def default_layer_ids(n_layers):
    """EAGLE-3's low / middle / high capture layers as output-of-layer ids
    (see the module comment); for targets too shallow for them to be
    distinct, [0, N//2, N-1]."""
    ids = [1, n_layers // 2 - 1, n_layers - 4]
    if ids[0] < ids[1] < ids[2]:
        return ids
    if n_layers < 3:
        raise ValueError(f"a target of {n_layers} layers has no three distinct layers to capture")
    return [0, n_layers // 2, n_layers - 1]


def check_layer_ids(ids, n_layers):
    ids = [int(i) for i in ids]
    if len(ids) != 3:
        raise ValueError(f"EAGLE-3 captures 3 layers, got {len(ids)}: {ids}")
    if any(b <= a for a, b in zip(ids, ids[1:])) or ids[0] < 0 or ids[-1] >= n_layers:
        raise ValueError(f"layer ids {ids} must be ascending, distinct and in [0, {n_layers - 1}]")
    return ids


class Target:
    """The target's shape (from GGUF metadata) and its frozen embedding and
    LM head, dequantized to float32 on first use. Llama architecture only."""

    def __init__(self, path):
        self.path = path
        r = gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch != "llama":
            raise ValueError(f"{path}: architecture {arch!r}; the trainer reads llama targets")
        g = lambda k, d=None: _field(r, "llama." + k, d)
        self.hidden = int(g("embedding_length"))
        self.n_layers = int(g("block_count"))
        self.ff = int(g("feed_forward_length"))
        self.n_heads = int(g("attention.head_count"))
        self.n_kv_heads = int(g("attention.head_count_kv", self.n_heads))
        self.head_dim = self.hidden // self.n_heads
        self.eps = float(g("attention.layer_norm_rms_epsilon", 1e-5))
        self.rope_theta = float(g("rope.freq_base", 10000.0))
        self.ctx = int(g("context_length", 2048))
        self.rope_scaling = None
        stype = g("rope.scaling.type")
        if stype == "linear":
            self.rope_scaling = {"rope_type": "linear", "factor": float(g("rope.scaling.factor", 1.0))}
        elif stype == "llama3" or "rope_freqs.weight" in [t.name for t in r.tensors]:
            self.rope_scaling = {
                "rope_type": "llama3", "factor": float(g("rope.scaling.factor", 8.0)),
                "low_freq_factor": float(g("rope.scaling.low_freq_factor", 1.0)),
                "high_freq_factor": float(g("rope.scaling.high_freq_factor", 4.0)),
                "original_max_position_embeddings": int(g("rope.scaling.original_context_length", 8192))}
        self.bos = _field(r, "tokenizer.ggml.bos_token_id")
        self.eos = _field(r, "tokenizer.ggml.eos_token_id")
        self._tensors = {t.name: t for t in r.tensors}
        emb = self._tensors["token_embd.weight"]
        self.vocab = int(emb.shape[1])
        self.tied = "output.weight" not in self._tensors
        self._embed = None
        self._lm_head = None

    def _load(self, name):
        t = self._tensors[name]
        a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        return a.reshape(tuple(int(x) for x in reversed(t.shape)))

    @property
    def embed(self):
        """[vocab, H] float32, the token embedding (frozen)."""
        if self._embed is None:
            self._embed = self._load("token_embd.weight")
        return self._embed

    @property
    def lm_head(self):
        """[vocab, H] float32: output.weight, or the embedding when tied."""
        if self._lm_head is None:
            self._lm_head = self.embed if self.tied else self._load("output.weight")
        return self._lm_head

    @property
    def output_norm(self):
        return self._load("output_norm.weight").reshape(-1)


# ---- answers: the target's own continuations of the prompts ----

def read_prompts(path):
    """One prompt a line, "\\n" written as a backslash-n (bench/prompts'
    format); blank lines and lines starting with # skipped."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.strip() and not line.startswith("#"):
                out.append(line.replace("\\n", "\n"))
    return out


def find_specd_generate():
    for sub in ("build", "build-asan"):
        p = os.path.join(ROOT, sub, "tools", "specd-generate")
        if os.access(p, os.X_OK):
            return p
    return None


def answer_ref(ref, prompt_ids, n_new, eos):
    """The reference forward's greedy continuation (slow: for tiny targets)."""
    return list(prompt_ids), ref.greedy(list(prompt_ids), n_new, stop_ids=(eos,) if eos is not None else ())


# ---- features ----

def make_ref(model, act_quant=False):
    """tests/ref/llama_ref.LlamaRef in float32. act_quant: round the
    activations of quantized matmuls to 8 bits as specd's CPU engine does,
    so the features are those the engine will hand the head."""
    from llama_ref import LlamaRef
    return LlamaRef(model, np.float32, act_quant=act_quant)


def features(ref, tokens, layer_ids):
    """(aux [T, 3H], final [T, H]) float32 of one sequence from the
    reference forward."""
    cap = {}
    full = ref.lm_head
    ref.lm_head = full[:1]       # the logits are not needed: skip ~20% of the work
    try:
        ref.forward(np.asarray(tokens, dtype=np.int64), capture=cap)
    finally:
        ref.lm_head = full
    aux = np.concatenate([cap["layers"][i] for i in layer_ids], axis=-1).astype(np.float32)
    return aux, np.asarray(cap["final"], dtype=np.float32)


def write_dump(out_dir, index, tokens, aux, final, layer_ids, vocab, model, n_prompt=None):
    os.makedirs(out_dir, exist_ok=True)
    meta = {"layer_ids": ",".join(str(i) for i in layer_ids), "hidden_size": str(final.shape[1]),
            "vocab_size": str(vocab), "model": os.path.basename(model)}
    if n_prompt is not None:
        meta["n_prompt"] = str(int(n_prompt))
    path = os.path.join(out_dir, f"{index:06d}.safetensors")
    tmp = path + ".tmp"          # renamed when whole: a resumed run never reads half a file
    save_file({"tokens": np.asarray(tokens, dtype=np.int32), "aux": np.ascontiguousarray(aux, np.float32),
               "final": np.ascontiguousarray(final, np.float32)}, tmp, metadata=meta)
    os.replace(tmp, path)
    return path


def _parse_ids(s):
    return [int(x) for x in s.strip().strip("[]").replace(" ", "").split(",") if x != ""]


def read_dump(dump_dir):
    """The sequences of a dump directory: a list of dicts (tokens int32 [T],
    aux [T, 3H] and final [T, H] float32, n_prompt or None) and the shared
    metadata (layer_ids, hidden_size, vocab_size, model). Bad files are
    refused with the file and the fault named."""
    files = sorted(f for f in os.listdir(dump_dir) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"{dump_dir}: no .safetensors files")
    seqs, meta0 = [], None
    for name in files:
        path = os.path.join(dump_dir, name)
        with safe_open(path, framework="numpy") as f:
            md = f.metadata() or {}
            keys = set(f.keys())
            if not {"tokens", "aux", "final"} <= keys:
                raise ValueError(f"{path}: needs tensors tokens, aux, final; has {sorted(keys)}")
            tok, aux, fin = f.get_tensor("tokens"), f.get_tensor("aux"), f.get_tensor("final")
        for k in ("layer_ids", "hidden_size", "vocab_size"):
            if k not in md:
                raise ValueError(f"{path}: metadata has no {k}")
        meta = {"layer_ids": _parse_ids(md["layer_ids"]), "hidden_size": int(md["hidden_size"]),
                "vocab_size": int(md["vocab_size"]), "model": md.get("model", "")}
        H, T = meta["hidden_size"], tok.shape[0] if tok.ndim == 1 else -1
        if tok.ndim != 1 or tok.dtype != np.int32 or T < 2:
            raise ValueError(f"{path}: tokens must be I32 [T] with T >= 2, got {tok.dtype} {tok.shape}")
        n_cap = len(meta["layer_ids"])
        if aux.shape != (T, n_cap * H) or fin.shape != (T, H):
            raise ValueError(f"{path}: aux {aux.shape} / final {fin.shape} do not fit T={T}, H={H}, "
                             f"{n_cap} layers")
        if aux.dtype != np.float32 or fin.dtype != np.float32:
            raise ValueError(f"{path}: aux and final must be F32")
        if tok.min() < 0 or tok.max() >= meta["vocab_size"]:
            raise ValueError(f"{path}: token id out of [0, {meta['vocab_size']})")
        if meta0 is None:
            meta0 = meta
        elif {k: meta[k] for k in ("layer_ids", "hidden_size", "vocab_size")} != \
                {k: meta0[k] for k in ("layer_ids", "hidden_size", "vocab_size")}:
            raise ValueError(f"{path}: metadata {meta} differs from the first file's {meta0}")
        n_prompt = int(md["n_prompt"]) if "n_prompt" in md else None
        stem = name[:-len(".safetensors")]
        seqs.append({"tokens": tok, "aux": aux, "final": fin, "n_prompt": n_prompt, "path": path,
                     "prompt": int(stem) if stem.isdigit() else stem, "sample": 0})
    return seqs, meta0


def read_dumps(dump_dir):
    """read_dump of dump_dir and of its sampled passes dump_dir/s<k>/
    (train-eagle --samples): each sequence's "sample" is k (0: the greedy
    answers in dump_dir itself), "prompt" its file's index; all passes must
    share the metadata."""
    seqs, meta = read_dump(dump_dir)
    subs = sorted((int(d[1:]), d) for d in os.listdir(dump_dir)
                  if d[:1] == "s" and d[1:].isdigit() and os.path.isdir(os.path.join(dump_dir, d)))
    for k, d in subs:
        more, m = read_dump(os.path.join(dump_dir, d))
        if {x: m[x] for x in ("layer_ids", "hidden_size", "vocab_size")} != \
                {x: meta[x] for x in ("layer_ids", "hidden_size", "vocab_size")}:
            raise ValueError(f"{dump_dir}/{d}: metadata {m} differs from {dump_dir}'s {meta}")
        for q in more:
            q["sample"] = k
        seqs += more
    return seqs, meta
