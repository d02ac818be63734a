"""make_golden.py — regenerates tests/data/golden_france.json.

The golden continuation of SmolLM2-135M-Instruct (Q4_1 GGUF) for one chat
prompt, computed with independent tools only: the Hugging Face `tokenizers`
library built from the GGUF's own vocabulary and merges, and the numpy forward
pass in llama_ref.py (float64), greedy for 32 tokens. The C side checks
specd-generate against this file.

The prompt is what the GGUF's tokenizer.chat_template renders for a single
user message with add_generation_prompt: the template inserts its default
system message when the first message is not a system one. We check the
template's exact text rather than carry a Jinja engine, and render that one
case by hand.

Usage: make_golden.py [--model PATH] [--out PATH] [--n-new 32]
(model: $SPECD_MODEL, else tools/fetch-model's answer).
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import gguf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import LlamaRef  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
USER = "What is the capital of France?"
# The exact bytes of the GGUF's template: its string literals hold real newline
# characters (not backslash escapes), so the rendered prompt has real newlines.
EXPECTED_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
PROMPT = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
          f"<|im_start|>user\n{USER}<|im_end|>\n"
          f"<|im_start|>assistant\n")


def find_model():
    path = os.environ.get("SPECD_MODEL")
    if path and os.path.exists(path):
        return path
    fetch = os.path.join(SOURCE_DIR, "tools", "fetch-model")
    try:
        out = subprocess.run([fetch], capture_output=True, text=True, timeout=600)
    except OSError:
        return None
    path = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else None
    return path if path and os.path.exists(path) else None


def tokenizer_from_gguf(path):
    """A byte-level BPE tokenizer built from the GGUF's vocabulary and merges
    (SmolLM pre-tokenizer: single digits split off, then GPT-2 byte level)."""
    r = gguf.GGUFReader(path)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in r.fields["tokenizer.ggml.merges"].contents()]
    template = r.fields["tokenizer.chat_template"].contents()
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    control = [tokens[i] for i, t in enumerate(types) if t == gguf.TokenType.CONTROL]
    tok.add_special_tokens(control)
    # add_special_tokens keeps existing ids; make sure of it.
    for s in control:
        assert tok.token_to_id(s) == vocab[s], s
    eos = int(r.fields["tokenizer.ggml.eos_token_id"].contents())
    return tok, template, eos


def main(argv=None):
    ap = argparse.ArgumentParser(description="regenerate tests/data/golden_france.json")
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", default=os.path.join(SOURCE_DIR, "tests", "data", "golden_france.json"))
    ap.add_argument("--n-new", type=int, default=32)
    a = ap.parse_args(argv)
    model = a.model or find_model()
    if not model:
        print("make_golden: no model (set SPECD_MODEL or run tools/fetch-model)", file=sys.stderr)
        return 77

    tok, template, eos = tokenizer_from_gguf(model)
    if template != EXPECTED_TEMPLATE:
        print("make_golden: the GGUF's chat template differs from the one this script renders:\n"
              f"{template!r}", file=sys.stderr)
        return 1
    prompt_ids = tok.encode(PROMPT).ids
    assert tok.decode(prompt_ids, skip_special_tokens=False) == PROMPT

    ref = LlamaRef(model, np.float64)
    # All n_new tokens, not stopping at EOS: more positions to compare.
    gen = ref.greedy(prompt_ids, a.n_new)
    text = tok.decode(gen, skip_special_tokens=False)
    # Margin between the best and second-best logit at each generated step:
    # how far an implementation may drift before a greedy choice flips.
    lg = ref.logits(prompt_ids + gen[:-1])[len(prompt_ids) - 1:]
    top2 = np.sort(lg, axis=1)[:, -2:]
    margins = [round(float(m), 4) for m in top2[:, 1] - top2[:, 0]]
    print(f"prompt {len(prompt_ids)} tokens; generated {len(gen)}: {text!r}")
    if "Paris" not in text:
        print("make_golden: the continuation does not mention Paris; refusing to write it", file=sys.stderr)
        return 1
    golden = {
        "model": os.path.basename(model),
        "description": "greedy continuation, numpy float64 reference (tests/ref/llama_ref.py), "
                       "tokenized with HF tokenizers built from the GGUF vocabulary; "
                       "regenerate with tests/ref/make_golden.py",
        "prompt": PROMPT,
        "prompt_ids": prompt_ids,
        "n_new": a.n_new,
        "eos_id": eos,
        "generated_ids": gen,
        "generated_text": text,
        "eos_index": gen.index(eos) if eos in gen else -1,
        "top2_margins": margins,
    }
    # One key per line, lists on one line each.
    lines = [f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in golden.items()]
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
