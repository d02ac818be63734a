#!/usr/bin/env python3
"""hf_baseline.py — Hugging Face transformers on the same weights as specd,
for the GPU benchmark (bench/results/cuda-h100.md).

Two jobs, run on the GPU machine next to `specd-bench gpu`:

  make   a random-weight Llama of a real model's shape (llama-3.2-1b,
         llama-3.1-8b, smollm2-135m) drawn with torch on the GPU, written as
         a BF16 GGUF that specd loads (llama.cpp layout: q/k rows permuted
         for adjacent-pair rotary), and kept as the HF state dict for `hf`.
  hf     transformers `generate` on a GGUF's weights: greedy, N new tokens,
         batch 1 (and more), plain and with `assistant_model` (an HF model
         made of the target's first L layers, the same self-draft specd
         runs); tokens/s from wall time around generate with the GPU
         synchronized. Also prints the greedy tokens so they can be compared
         with specd's on the same weights.

The GGUF is read with the `gguf` package (quantized tensors dequantized by
gguf.quants), q/k rows un-permuted back to HF's rotate-half order, and
loaded into LlamaForCausalLM in BF16. Random models use no rope scaling and
no tokenizer (the benchmark feeds token ids).
"""
import argparse
import json
import sys
import time

import numpy as np

SHAPES = {
    # name: hidden, layers, heads, kv heads, ffn, vocab, tied, rope theta
    "smollm2-135m": (576, 30, 9, 3, 1536, 49152, True, 100000.0),
    "llama-3.2-1b": (2048, 16, 32, 8, 8192, 128256, True, 500000.0),
    "llama-3.1-8b": (4096, 32, 32, 8, 14336, 128256, False, 500000.0),
}


def permute_to_gguf(w, n_head):
    """HF rotate-half row order -> llama.cpp adjacent pairs (per head)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_to_hf(w, n_head):
    """The inverse of permute_to_gguf."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, shape, tensors):
    """tensors: name -> numpy array (HF layout, float32 or bfloat16-as-uint16)."""
    import gguf
    hidden, layers, heads, kv, ffn, vocab, tied, theta = shape
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(8192)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(theta)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(hidden // heads)
    for name, arr in tensors.items():
        if arr.dtype == np.uint16:
            w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(name, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hf_names(layers, tied):
    """(gguf name, hf name, permute heads key) for every tensor."""
    out = [("token_embd.weight", "model.embed_tokens.weight", None), ("output_norm.weight", "model.norm.weight", None)]
    if not tied:
        out.append(("output.weight", "lm_head.weight", None))
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight", None),
            (f"blk.{i}.attn_q.weight", p + "self_attn.q_proj.weight", "q"),
            (f"blk.{i}.attn_k.weight", p + "self_attn.k_proj.weight", "k"),
            (f"blk.{i}.attn_v.weight", p + "self_attn.v_proj.weight", None),
            (f"blk.{i}.attn_output.weight", p + "self_attn.o_proj.weight", None),
            (f"blk.{i}.ffn_norm.weight", p + "post_attention_layernorm.weight", None),
            (f"blk.{i}.ffn_gate.weight", p + "mlp.gate_proj.weight", None),
            (f"blk.{i}.ffn_up.weight", p + "mlp.up_proj.weight", None),
            (f"blk.{i}.ffn_down.weight", p + "mlp.down_proj.weight", None),
        ]
    return out


def hf_config(shape, layers=None):
    from transformers import LlamaConfig
    hidden, n_layers, heads, kv, ffn, vocab, tied, theta = shape
    return LlamaConfig(hidden_size=hidden, num_hidden_layers=layers or n_layers, num_attention_heads=heads,
                       num_key_value_heads=kv, intermediate_size=ffn, vocab_size=vocab, tie_word_embeddings=tied,
                       rope_theta=theta, rms_norm_eps=1e-5, max_position_embeddings=8192, bos_token_id=None,
                       eos_token_id=None, pad_token_id=0, torch_dtype="bfloat16")


def cmd_make(args):
    import torch
    shape = SHAPES[args.shape]
    hidden, layers, heads, kv, ffn, vocab, tied, theta = shape
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    tensors = {}
    t0 = time.time()
    for gname, _, perm in hf_names(layers, tied):
        if gname.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(hidden, generator=g, device="cuda")
            tensors[gname] = t.float().cpu().numpy()
            continue
        rows, cols = {
            "token_embd": (vocab, hidden), "output": (vocab, hidden), "attn_q": (hidden, hidden),
            "attn_k": (kv * hidden // heads, hidden), "attn_v": (kv * hidden // heads, hidden),
            "attn_output": (hidden, hidden), "ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden),
            "ffn_down": (hidden, ffn),
        }[gname.split(".")[-2]]
        t = (torch.randn(rows, cols, generator=g, device="cuda") * (cols ** -0.5)).to(torch.bfloat16)
        a = t.view(torch.int16).cpu().numpy().view(np.uint16)
        if perm:
            a = permute_to_gguf(a, heads if perm == "q" else kv)
        tensors[gname] = np.ascontiguousarray(a)
    t1 = time.time()
    write_gguf(args.out, shape, tensors)
    print(json.dumps({"made": args.out, "shape": args.shape, "gen_s": round(t1 - t0, 1),
                      "write_s": round(time.time() - t1, 1)}))


def load_hf(path, n_layers=None):
    """LlamaForCausalLM in BF16 on the GPU from a llama GGUF (first n_layers)."""
    import gguf
    import torch
    from transformers import LlamaForCausalLM
    r = gguf.GGUFReader(path)

    def field(key, default=None):
        f = r.fields.get(key)
        if f is None:
            return default
        return f.parts[f.data[0]].tolist()[0]

    hidden = field("llama.embedding_length")
    layers = field("llama.block_count")
    heads = field("llama.attention.head_count")
    kv = field("llama.attention.head_count_kv", heads)
    ffn = field("llama.feed_forward_length")
    theta = float(field("llama.rope.freq_base", 10000.0))
    eps = float(field("llama.attention.layer_norm_rms_epsilon", 1e-5))
    names = {t.name: t for t in r.tensors}
    vocab = int(names["token_embd.weight"].shape[1])
    tied = "output.weight" not in names
    shape = (hidden, layers, heads, kv, ffn, vocab, tied, theta)
    use = n_layers or layers
    cfg = hf_config(shape, use)
    cfg.rms_norm_eps = eps
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)  # random init on the GPU, overwritten below
    torch.set_default_dtype(torch.float32)
    state = {}
    for gname, hname, perm in hf_names(layers, tied):
        if ".layers." in hname and int(hname.split(".")[2]) >= use:
            continue
        t = names[gname]
        if t.tensor_type == gguf.GGMLQuantizationType.BF16:
            a = torch.from_numpy(np.array(t.data).view(np.int16)).view(torch.bfloat16)
        else:
            a = torch.from_numpy(np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
        a = a.reshape([int(x) for x in reversed(t.shape.tolist())]) if a.dim() == 1 and len(t.shape) > 1 else a
        if perm:
            a = torch.from_numpy(permute_to_hf(a.float().numpy(), heads if perm == "q" else kv).copy())
        state[hname] = a.to(torch.bfloat16)
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary" not in k]
    if missing or unexpected:
        raise SystemExit(f"hf_baseline: state dict mismatch: missing {missing[:5]} unexpected {unexpected[:5]}")
    return model.eval()


def timed_generate(model, ids, n_new, assistant=None):
    import torch
    kw = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, pad_token_id=0)
    if assistant is not None:
        kw["assistant_model"] = assistant
    with torch.no_grad():
        model.generate(ids, **dict(kw, max_new_tokens=4, min_new_tokens=4))  # warm-up
        torch.cuda.synchronize()
        t0 = time.time()
        out = model.generate(ids, **kw)
        torch.cuda.synchronize()
        dt = time.time() - t0
    return out[:, ids.shape[1]:], dt


def cmd_hf(args):
    import torch
    import transformers
    model = load_hf(args.gguf)
    ids = torch.tensor([json.loads(args.prompt_ids)], device="cuda")
    res = {"model": args.gguf, "transformers": transformers.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0), "n_new": args.n_new}
    out, dt = timed_generate(model, ids, args.n_new)
    res["plain_b1_tok_s"] = round(args.n_new / dt, 1)
    res["plain_tokens"] = out[0].tolist()
    if args.expect_ids:
        want = json.loads(args.expect_ids)
        got = res["plain_tokens"]
        same = 0
        while same < min(len(want), len(got)) and want[same] == got[same]:
            same += 1
        res["common_prefix_with_specd"] = same
    # one decode step of the bare model (no generate loop): where the time goes
    with torch.no_grad():
        o = model(ids, use_cache=True)
        past, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(20):
            torch.cuda.synchronize()
            t0 = time.time()
            o = model(nxt, past_key_values=past, use_cache=True)
            torch.cuda.synchronize()
            times.append(time.time() - t0)
            past, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)
        res["forward_step_ms_median"] = round(sorted(times)[len(times) // 2] * 1e3, 2)
    for b in args.batches:
        if b == 1:
            continue
        _, dtb = timed_generate(model, ids.repeat(b, 1), args.n_new)
        res[f"plain_b{b}_tok_s"] = round(b * args.n_new / dtb, 1)
    if args.assistant_layers:
        assistant = load_hf(args.gguf, args.assistant_layers)
        out_a, dta = timed_generate(model, ids, args.n_new, assistant)
        res["assistant_layers"] = args.assistant_layers
        res["assistant_b1_tok_s"] = round(args.n_new / dta, 1)
        res["assistant_same_tokens"] = out_a[0].tolist() == out[0].tolist()
    print(json.dumps(res))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="write a random-weight BF16 GGUF of a real model's shape")
    m.add_argument("--shape", choices=sorted(SHAPES), required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--seed", type=int, default=1)
    h = sub.add_parser("hf", help="transformers generate on a GGUF's weights")
    h.add_argument("--gguf", required=True)
    h.add_argument("--prompt-ids", required=True, help="JSON list of prompt token ids")
    h.add_argument("--n-new", type=int, default=128)
    h.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1])
    h.add_argument("--assistant-layers", type=int, default=0, help="assistant = the target's first L layers")
    h.add_argument("--expect-ids", default="", help="JSON list: specd's greedy tokens, to report the common prefix")
    args = ap.parse_args()
    {"make": cmd_make, "hf": cmd_hf}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
