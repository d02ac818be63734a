"""test_eagle_head.py — EAGLE-3 heads (engine/spec/eagle*.c) against the numpy
reference of eagle_ref.py, on a random target from specd-mkmodel --format hf:

  * heads written by eagle_ref.write_head in the published layout (F32 with
    its own embedding; BF16 without, reading the target's) and in the
    speculators layout (F16, norm_before_residual): tests/eagle_probe's fused
    features, logits of every row and pre-norm outputs, then a chain of 3
    drafts fed back, agree with EagleRef in float64 within
    |err| <= 1e-4 x max|ref| + 1e-5 (f32 arithmetic in C), the chain's
    tokens exactly, with the weights as stored (--eagle-weights stored);
    with the default Q8_0 weights the rows agree within Q8_TOL x max|ref|
    and differ from it; the layer ids follow each layout's convention;
  * damaged heads are refused, each with its own error line;
  * specd-generate --eagle (random, untrained head) gives plain greedy's
    tokens bit for bit at K = 1, 2, 4, 8, and seeded sampling's under the
    coupled rule at K = 2, 5;
  * the chains specd-generate --eagle --eagle-weights stored drafts (its -v
    log) equal the reference's replay on the dumped features of the same
    sequence;
  * specd-generate --dump-features writes the documented file: the tokens
    are plain greedy's, final's argmax through the target's LM head is the
    next token, final is the final norm of the last layer's aux slot;
    with --prompt-file, one file a prompt, "#" lines skipped and a
    backslash-n read as a newline (bench/prompts' format).

Environment: SPECD_BUILD_DIR. Exit 77 when a binary or package is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
SKIP = 77
try:
    from safetensors.numpy import load_file, save_file
    from eagle_ref import EagleRef, rmsnorm, write_head
except ImportError as e:  # pragma: no cover
    print(f"skip: python packages missing ({e}); run scripts/setup")
    sys.exit(SKIP)

SOURCE_DIR = os.environ.get("SPECD_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
BUILD_DIR = os.environ.get("SPECD_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
DIM, LAYERS, VOCAB = 64, 6, 512
Q8_TOL = 0.03  # the Q8_0 head's max |err| / max |ref| (measured 0.0066-0.014 on these three heads)


def binary(sub, name):
    path = os.path.join(BUILD_DIR, sub, name)
    if not os.path.exists(path):
        print(f"skip: {path} not built")
        sys.exit(SKIP)
    return path


def probe(target, head, tokens, aux, tmp, n_chain=3, weights="stored"):
    inp, out = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
    save_file({"tokens": np.asarray(tokens, np.int32), "aux": np.asarray(aux, np.float32)}, inp)
    r = subprocess.run([binary("tests", "eagle_probe"), target, head, inp, out, str(n_chain), weights],
                       capture_output=True, text=True)
    return r, (load_file(out) if r.returncode == 0 else None)


def close(name, got, ref, failures, rel=1e-4):
    err = np.max(np.abs(got - ref))
    tol = rel * np.max(np.abs(ref)) + 1e-5
    if not err <= tol:
        failures.append(f"{name}: max |err| {err:.3g} > {tol:.3g}")
    return err


def check_forward(target, head, target_embed, tmp, rng, failures, label, want_layers):
    n = 12
    tokens = rng.integers(0, VOCAB, n)
    aux = rng.standard_normal((n, 3 * DIM)).astype(np.float32)
    r, out = probe(target, head, tokens, aux, tmp)
    if out is None:
        failures.append(f"{label}: probe failed: {r.stderr.strip()}")
        return
    got_layers = [int(x) for x in r.stdout.split()[1:4]]
    if got_layers != want_layers:
        failures.append(f"{label}: layers {got_layers}, want {want_layers}")
    ref = EagleRef(head, target_embed)
    fused = ref.fuse(aux)
    close(f"{label} fused", out["fused"], fused, failures)
    logits, hidden = [], []
    for t in range(n):
        lg, h = ref.row(tokens[t], fused[t])
        logits.append(lg)
        hidden.append(h)
    for c in range(3):
        tok = int(ref.d2t[int(np.argmax(out["logits"][n + c - 1]))])
        if tok != int(out["chain"][c]):
            failures.append(f"{label}: chain token {c}: {out['chain'][c]}, reference {tok}")
        lg, h = ref.row(tok, hidden[-1])
        logits.append(lg)
        hidden.append(h)
    close(f"{label} logits", out["logits"], np.array(logits), failures)
    close(f"{label} hidden", out["hidden"], np.array(hidden), failures)
    print(f"{label}: fused, {n} rows and a chain of 3 agree with the reference")
    check_q8(target, head, tokens, aux, tmp, failures, label, fused, np.array(logits[:n]), np.array(hidden[:n]))


def check_q8(target, head, tokens, aux, tmp, failures, label, fused, logits, hidden):
    """The default weights (Q8_0 at load, activations in blocks of 32 with a
    scale each): the same n rows within Q8_TOL x max|ref| of the float64
    reference, and not equal to it (the quantized path ran)."""
    r, out = probe(target, head, tokens, aux, tmp, n_chain=0, weights="q8_0")
    if out is None:
        failures.append(f"{label} q8_0: probe failed: {r.stderr.strip()}")
        return
    n = len(tokens)
    errs = [close(f"{label} q8_0 {name}", got, ref, failures, rel=Q8_TOL) / np.max(np.abs(ref))
            for name, got, ref in (("fused", out["fused"], fused), ("logits", out["logits"][:n], logits),
                                   ("hidden", out["hidden"][:n], hidden))]
    if not min(errs) > 1e-6:
        failures.append(f"{label} q8_0: relative errors {errs}: the weights were not quantized")
    print(f"{label}: q8_0 weights within {Q8_TOL} x max|ref| (fused, logits, hidden: "
          f"{', '.join(f'{e:.2g}' for e in errs)})")


REFUSALS = [  # (label, write_head edits, the error's words)
    ("hidden size", {"target_hidden": 32}, "target hidden states of size 32"),
    ("layer ids", {"layer_ids": [0, 2, LAYERS]}, "outside the target's"),
    ("vocabulary", {"config_edit": lambda c: c.update(vocab_size=VOCAB - 1)}, "vocabulary has 511 ids"),
    ("d2t range", {"tensors_edit": lambda t: t["d2t"].__setitem__(0, 10**6)}, "d2t maps draft id 0"),
    ("missing tensor", {"tensors_edit": lambda t: t.pop("lm_head.weight")}, "lacks the tensor lm_head.weight"),
    ("mis-shaped", {"tensors_edit": lambda t: t.__setitem__("midlayer.self_attn.q_proj.weight",
                                                            np.zeros((DIM, DIM), np.float32))},
     "midlayer.self_attn.q_proj.weight has shape"),
    ("dtype", {"tensors_edit": lambda t: t.__setitem__("fc.weight", np.zeros((DIM, 3 * DIM), np.int32))},
     "F32, F16 or BF16"),
    ("layout", {"config_edit": lambda c: c.update(architectures=["LlamaForCausalLM"])}, "neither a published"),
]


def generate(target, args):
    r = subprocess.run([binary("tools", "specd-generate"), "-m", target, "-t", "2", "--json"] + args,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"specd-generate {' '.join(args)} failed:\n{r.stderr}")
    return json.loads(r.stdout)


def check_dump(target, tmp, failures):
    d = os.path.join(tmp, "dump")
    os.makedirs(d)
    prompt = "the quick brown fox"
    r = subprocess.run([binary("tools", "specd-generate"), "-m", target, "-t", "2", "-p", prompt, "-n", "10",
                        "--ignore-eos", "--dump-features", d, "--eagle-layers", f"0,2,{LAYERS - 1}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"dump failed: {r.stderr}")
        return
    f = load_file(os.path.join(d, "000000.safetensors"))
    from safetensors import safe_open
    with safe_open(os.path.join(d, "000000.safetensors"), "np") as h:
        meta = h.metadata()
    plain = generate(target, ["-p", prompt, "-n", "10", "--ignore-eos"])
    want = list(plain["prompt_ids"]) + list(plain["ids"]) if "prompt_ids" in plain else None
    toks = f["tokens"]
    T = len(toks)
    if meta.get("layer_ids") != f"0,2,{LAYERS - 1}" or meta.get("hidden_size") != str(DIM) or \
            meta.get("vocab_size") != str(VOCAB) or meta.get("model") != os.path.basename(target) or \
            meta.get("n_prompt") != str(len(f["tokens"]) - len(plain["ids"])):
        failures.append(f"dump metadata {meta}")
    if f["aux"].shape != (T, 3 * DIM) or f["final"].shape != (T, DIM) or f["aux"].dtype != np.float32:
        failures.append(f"dump shapes {f['aux'].shape} {f['final'].shape}")
    gen = [int(x) for x in toks[T - len(plain["ids"]):]]
    if gen != [int(x) for x in plain["ids"]] or (want is not None and [int(x) for x in toks] != want):
        failures.append(f"dump tokens {list(toks)} differ from plain greedy {plain['ids']}")
    w = load_file(os.path.join(target, "model.safetensors"))
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    pred = np.argmax(f["final"].astype(np.float64) @ head.T.astype(np.float64), axis=1)
    n_prompt = T - len(plain["ids"])
    if list(pred[n_prompt - 1:T - 1]) != [int(x) for x in toks[n_prompt:]]:
        failures.append("dump: final's argmax through the LM head is not the next token")
    normed = rmsnorm(f["aux"][:, 2 * DIM:].astype(np.float64), w["model.norm.weight"].astype(np.float64), 1e-5)
    close("dump final vs the last layer's aux", f["final"], normed, failures)
    print(f"dump: {T} rows, tokens = plain greedy, final predicts the next token")


def check_prompt_file(target, tmp, failures):
    """--prompt-file reads bench/prompts' format: "#" lines and empty lines
    skipped, a backslash-n a newline; one file a prompt, in order."""
    d = os.path.join(tmp, "dump-file")
    pf = os.path.join(tmp, "prompts.txt")
    prompts = ["the quick\nbrown fox", "a tale of two"]
    with open(pf, "w") as f:
        f.write("# a comment line\n\n" + "\n".join(p.replace("\n", "\\n") for p in prompts) + "\n")
    r = subprocess.run([binary("tools", "specd-generate"), "-m", target, "-t", "2", "--prompt-file", pf, "-n", "3",
                        "--ignore-eos", "--dump-features", d], capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"--prompt-file dump failed: {r.stderr}")
        return
    names = sorted(os.listdir(d))
    if names != ["000000.safetensors", "000001.safetensors"]:
        failures.append(f"--prompt-file dump wrote {names}, expected one file per prompt")
        return
    for name, prompt in zip(names, prompts):
        toks = [int(x) for x in load_file(os.path.join(d, name))["tokens"]]
        want = generate(target, ["-p", prompt, "-n", "3", "--ignore-eos"])
        if toks != list(want["prompt_ids"]) + list(want["ids"]):
            failures.append(f"--prompt-file {prompt!r}: dumped {toks}, -p gives {want['prompt_ids']} + {want['ids']}")
    print("dump: --prompt-file skips comments and reads \\n as a newline")


def check_chains(target, head, tmp, failures):
    """The drafter's bookkeeping end to end: the chains specd-generate --eagle
    logs (-v) equal the reference's, replayed on the features of the same
    greedy sequence (--dump-features): rows 0..n-2 from the target's
    features, then K-1 rows on the head's own outputs."""
    prompt = ["-p", "a tale of two", "-n", "20", "--ignore-eos"]
    r = subprocess.run([binary("tools", "specd-generate"), "-m", target, "-t", "2", "--json", "-v", "--eagle", head,
                        "--eagle-weights", "stored", "-k", "3"] + prompt, capture_output=True, text=True)
    chains = [(int(ln.split(" context ")[1].split()[0]), [int(x) for x in ln.split(" drafted")[1].split()])
              for ln in r.stderr.splitlines() if " context " in ln and " drafted" in ln]
    d = os.path.join(tmp, "chains")
    os.makedirs(d)
    subprocess.run([binary("tools", "specd-generate"), "-m", target, "-t", "2", "--dump-features", d,
                    "--eagle-layers", "0,2,5"] + prompt, check=True, capture_output=True)
    f = load_file(os.path.join(d, "000000.safetensors"))
    tok = [int(x) for x in f["tokens"]]
    ref = EagleRef(head)
    g = ref.fuse(f["aux"])
    rows = [ref.row(tok[t + 1], g[t]) for t in range(len(tok) - 1)]  # (logits, pre-norm output) of each row
    ks, vs = list(ref.k), list(ref.v)
    if len(chains) < 10:
        failures.append(f"chains: only {len(chains)} logged")
    for n, drafts in chains:
        ref.k, ref.v = ks[:n - 1], vs[:n - 1]
        logits, h = rows[n - 2]
        want = []
        for i in range(len(drafts)):
            want.append(int(ref.d2t[int(np.argmax(logits))]))
            if i + 1 < len(drafts):
                logits, h = ref.row(want[-1], h)
        if want != drafts:
            failures.append(f"chain at context {n}: drafted {drafts}, reference {want}")
    print(f"{len(chains)} chains of K 3 drafted by specd-generate --eagle = the reference's replay")


def main():
    rng = np.random.default_rng(7)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        target = os.path.join(tmp, "target")
        r = subprocess.run([binary("tools", "specd-mkmodel"), "-o", target, "--format", "hf", "--dim", str(DIM),
                            "--layers", str(LAYERS), "--heads", "4", "--kv-heads", "2", "--ff", "128", "--vocab",
                            str(VOCAB), "--seed", "3"], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(r.stderr)
        cfg = json.load(open(os.path.join(target, "config.json")))
        eps = cfg.get("rms_norm_eps", 1e-5)
        assert abs(eps - 1e-5) < 1e-12, eps
        target_embed = load_file(os.path.join(target, "model.safetensors"))["model.embed_tokens.weight"]
        heads = {
            "published f32": dict(layer_ids=[0, 2, 5], with_embed=True, seed=1),
            "published bf16, target embedding": dict(with_embed=False, dtype="bfloat16", seed=2),
            "speculators f16": dict(layout="speculators", layer_ids=[1, 3, 6], norm_before_residual=True,
                                    dtype="float16", seed=3),
        }
        want_layers = {"published f32": [0, 2, 5], "published bf16, target embedding": [1, 2, 2],
                       "speculators f16": [0, 2, 5]}
        for label, kw in heads.items():
            path = os.path.join(tmp, label.replace(" ", "_").replace(",", ""))
            write_head(path, hidden=DIM, vocab=VOCAB, draft_vocab=128, **kw)
            check_forward(target, path, target_embed, tmp, rng, failures, label, want_layers[label])
        for label, kw, words in REFUSALS:
            path = os.path.join(tmp, "bad_" + label.replace(" ", "_"))
            write_head(path, hidden=DIM, vocab=VOCAB, draft_vocab=128, **kw)
            r, _ = probe(target, path, [1], np.zeros((1, 3 * DIM)), tmp)
            if r.returncode != 3 or words not in r.stderr:
                failures.append(f"refusal '{label}': rc {r.returncode}, stderr: {r.stderr.strip()[:300]}")
        print(f"{len(REFUSALS)} damaged heads refused, each with its own error")
        head = os.path.join(tmp, "published_f32")
        prompt = ["-p", "once upon a time", "-n", "24", "--ignore-eos"]
        plain = generate(target, prompt)["ids"]
        for k in (1, 2, 4, 8):
            for h in (head, os.path.join(tmp, "published_bf16_target_embedding")):
                out = generate(target, prompt + ["--eagle", h, "-k", str(k)])
                if out["spec"]["drafted"] < 10:  # the head must have drafted for the equality to mean anything
                    failures.append(f"--eagle {os.path.basename(h)} -k {k}: drafted only {out['spec']['drafted']}")
                if out["ids"] != plain:
                    failures.append(f"--eagle {os.path.basename(h)} -k {k}: {out['ids']} != plain {plain}")
        print("greedy --eagle = plain greedy at K 1, 2, 4, 8 (two random heads)")
        seeded = prompt + ["--temp", "0.8", "--top-p", "0.95", "--seed", "11"]
        plain_s = generate(target, seeded)["ids"]
        for k in (2, 5):
            out = generate(target, seeded + ["--eagle", head, "-k", str(k)])
            if out["ids"] != plain_s:
                failures.append(f"seeded --eagle -k {k}: {out['ids']} != plain {plain_s}")
        print("seeded sampling (T 0.8, top-p 0.95) with --eagle = plain seeded sampling at K 2, 5")
        check_dump(target, tmp, failures)
        check_prompt_file(target, tmp, failures)
        check_chains(target, head, tmp, failures)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
