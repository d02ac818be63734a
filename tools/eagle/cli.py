"""cli.py — tools/train-eagle: train an EAGLE-3 draft head for a llama
target and write it in the published layout (head.py).

  1. data: the target's own answers to a prompt set (self-distillation):
     `specd-generate --chat --dump-features` answers each prompt greedily
     as a chat turn and writes the sequence's tokens and the engine's own
     features (target.py's format) to the dump directory, DIR/NNNNNN for
     prompt NNNNNN; with --samples N it also answers each prompt N times
     sampled (seed k, DIR/s<k>/NNNNNN), which gives the head more and more
     varied contexts of the target's own text. With --prompt-ids (tiny
     test targets) the numpy reference (tests/ref/llama_ref.py) answers and
     computes the features. Existing dump files are kept, so an interrupted
     run resumes. --dump DIR alone trains on a dump made elsewhere.
  2. training: draft vocabulary by token frequency, EAGLE-3's training-time
     test, soft labels from the target's logits (train.py).
  3. output: config.json + model.safetensors (+ specd_train.json, the
     run's provenance and figures) in --out, by default
     $SPECD_CACHE/eagle3/<model name>/ (SPECD_CACHE: ~/.cache/specd).

With no arguments it trains the head of the demo model (tools/fetch-model)
on all 520 prompts of tools/eagle/prompts/train.txt, each answered greedily
and twice sampled, then DEMO_MINUTES of training (docs/eagle-train.md has
the timed run).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import target as TG  # noqa: E402
import head as H  # noqa: E402
import train as TR  # noqa: E402

ROOT = TG.ROOT
DEFAULT_PROMPTS = os.path.join(HERE, "prompts", "train.txt")
DEMO_SAMPLES = 2        # the demo run's sampled answers per prompt, beside the greedy one
DEMO_MINUTES = 25.0     # and its training time
CHUNK = 32              # prompts per specd-generate --dump-features run (what an interruption can cost)


def cache_dir():
    return os.environ.get("SPECD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specd")


def model_stem(path):
    b = os.path.basename(path.rstrip("/"))
    return b[:-5] if b.endswith(".gguf") else b


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="tools/train-eagle",
        description="Train an EAGLE-3 draft head for a llama GGUF target (self-distillation) and write it "
                    "in the published layout (config.json + model.safetensors, LlamaForCausalLMEagle3).",
        epilog="With no arguments: the demo model (tools/fetch-model), tools/eagle/prompts/train.txt, the "
               "head cached in $SPECD_CACHE/eagle3/<model>/ (about an hour on 2 cores). Layer ids: id L is "
               "the output of layer L (0-based), SGLang's convention.")
    ap.add_argument("--model", help="target GGUF (default: the demo model, tools/fetch-model)")
    ap.add_argument("--dump", help="feature dump directory: read it, and write the answers' features "
                                   "into it first when --prompts/--prompt-ids are given "
                                   "(default: $SPECD_CACHE/eagle3-data/<model>)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--prompts", help="prompt file, one a line (\\n escapes), answered by specd-generate "
                                       "(default when no --dump: tools/eagle/prompts/train.txt)")
    src.add_argument("--prompt-ids", help="prompts as token ids, one comma-separated line each, answered by "
                                          "the numpy reference (tiny targets, tests)")
    ap.add_argument("--out", help="output head directory (default: $SPECD_CACHE/eagle3/<model>)")
    ap.add_argument("--steps", type=int, default=20000, help="optimizer steps at most (default 20000)")
    ap.add_argument("--minutes", type=float, default=0,
                    help="training time at most, in minutes (0 = no limit; with no --dump nor prompts "
                         "given, the demo run: 25)")
    ap.add_argument("--draft-vocab", type=int, default=None,
                    help="draft vocabulary size, capped at the target's (default 4096; with --init, the head's)")
    ap.add_argument("--init", metavar="HEAD",
                    help="continue training this head (published layout, trained on this target and the "
                         "dump's layers): its weights and draft vocabulary are the start, and the "
                         "learning rate's warm-up and decay run again over this run's --minutes / --steps")
    ap.add_argument("--ttt", type=int, default=5, help="training-time-test steps (default 5; EAGLE-3 uses 7)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the initialisation, the held-out split and the batch order (default 0)")
    ap.add_argument("--layers", help="captured layers a,b,c (output-of-layer ids; default EAGLE-3's "
                                     "1, N/2-1, N-4)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step (default 4)")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    ap.add_argument("--samples", type=int, default=None,
                    help="sampled answers per prompt besides the greedy one, in DUMP/s1 .. DUMP/sN (seed k); "
                         "default 0, the demo run 2")
    ap.add_argument("--sample-temp", type=float, default=0.8, help="their temperature (default 0.8)")
    ap.add_argument("--sample-top-p", type=float, default=0.95, help="their top-p (default 0.95)")
    ap.add_argument("--n-predict", type=int, default=160, help="answer length cap in tokens (default 160)")
    ap.add_argument("--max-prompts", type=int, default=0,
                    help="use only the first N prompts (0 = all, the default and the demo run's)")
    ap.add_argument("--max-len", type=int, default=1024, help="cut sequences to this many tokens")
    ap.add_argument("--holdout", type=float, default=0.05, help="share of sequences held out for the "
                                                                "final evaluation (default 0.05)")
    ap.add_argument("--threads", type=int, default=2, help="specd-generate threads (default 2)")
    ap.add_argument("--dtype", choices=["float16", "float32"], default="float16",
                    help="stored weights (default float16, as published heads)")
    ap.add_argument("--train-on-prompt", action="store_true",
                    help="also train on the prompt's positions (default: answers only, when known)")
    ap.add_argument("--act-quant", action="store_true",
                    help="with --prompt-ids: the reference's features with the engine's 8-bit activation "
                         "rounding modelled (slower; default: the plain dequantized-weight forward)")
    ap.add_argument("--gen-only", action="store_true", help="write the dump and stop")
    return ap.parse_args(argv)


def demo_model():
    r = subprocess.run([os.path.join(ROOT, "tools", "fetch-model")], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"train-eagle: tools/fetch-model failed: {r.stderr.strip()}")
    return r.stdout.strip()


def generate_ref(a, tgt, layer_ids, log):
    """--prompt-ids: the numpy reference answers and writes the features of
    the missing dump files (tiny targets, tests)."""
    with open(a.prompt_ids) as f:
        prompts = [[int(x) for x in ln.split(",")] for ln in f if ln.strip()]
    if a.max_prompts:
        prompts = prompts[:a.max_prompts]
    ref, t0, n_tok, made = None, time.time(), 0, 0
    for i, p in enumerate(prompts):
        if os.path.exists(os.path.join(a.dump, f"{i:06d}.safetensors")):
            continue
        ref = ref or TG.make_ref(a.model, act_quant=a.act_quant)
        pids, ans = TG.answer_ref(ref, p, a.n_predict, tgt.eos)
        toks = (pids + ans)[:a.max_len]
        aux, fin = TG.features(ref, toks, layer_ids)
        TG.write_dump(a.dump, i, toks, aux, fin, layer_ids, tgt.vocab, a.model, n_prompt=len(pids))
        n_tok += len(toks)
        made += 1
    log(f"data: {made} new sequences ({n_tok} tokens) in {time.time() - t0:.0f} s; dump {a.dump}")


def dump_pass(a, binary, prompts, out_dir, layer_ids, sampling, log):
    """specd-generate --dump-features over the prompts whose files out_dir
    lacks, CHUNK at a time; each file renamed to its prompt's index."""
    os.makedirs(out_dir, exist_ok=True)
    missing = [i for i in range(len(prompts)) if not os.path.exists(os.path.join(out_dir, f"{i:06d}.safetensors"))]
    t0 = time.time()
    for c0 in range(0, len(missing), CHUNK):
        chunk = missing[c0:c0 + CHUNK]
        tmp = tempfile.mkdtemp(prefix=".part-", dir=out_dir)
        try:
            pf = os.path.join(tmp, "prompts.txt")
            with open(pf, "w", encoding="utf-8") as f:
                f.writelines(prompts[i].replace("\n", "\\n") + "\n" for i in chunk)
            cmd = [binary, "-m", a.model, "--chat", "--prompt-file", pf, "--dump-features", tmp, "-n",
                   str(a.n_predict), "-t", str(a.threads), "--eagle-layers", ",".join(map(str, layer_ids))] + sampling
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"train-eagle: specd-generate --dump-features failed ({r.returncode}): "
                                 f"{r.stderr.strip()[-600:]}")
            for j, i in enumerate(chunk):
                os.replace(os.path.join(tmp, f"{j:06d}.safetensors"), os.path.join(out_dir, f"{i:06d}.safetensors"))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log(f"data: {out_dir}: {c0 + len(chunk)}/{len(missing)} new sequences, {time.time() - t0:.0f} s")


def generate(a, tgt, layer_ids, log):
    """Answers the prompts (greedy, then a.samples sampled passes) into the
    dump's missing files."""
    if a.prompt_ids:
        return generate_ref(a, tgt, layer_ids, log)
    prompts = TG.read_prompts(a.prompts)
    if a.max_prompts:
        prompts = prompts[:a.max_prompts]
    binary = TG.find_specd_generate()
    if binary is None:
        raise SystemExit("train-eagle: no build/tools/specd-generate (or build-asan/): build it first")
    dump_pass(a, binary, prompts, a.dump, layer_ids, [], log)
    for k in range(1, a.samples + 1):
        dump_pass(a, binary, prompts, os.path.join(a.dump, f"s{k}"), layer_ids,
                  ["--temp", str(a.sample_temp), "--top-p", str(a.sample_top_p), "--seed", str(k)], log)


def split_held_out(seqs, share, seed):
    """(held out, training): the held-out share of the prompts, drawn with
    seed; a held-out prompt's greedy answer is evaluated and none of its
    answers is trained on."""
    keys = sorted({s["prompt"] for s in seqs})
    rng = np.random.default_rng(seed)
    n_hold = int(round(share * len(keys))) if len(keys) >= 10 else 0
    held_keys = {keys[i] for i in rng.permutation(len(keys))[:n_hold]}
    held = [s for s in seqs if s["prompt"] in held_keys and s["sample"] == 0]
    return held, [s for s in seqs if s["prompt"] not in held_keys]


def load_init(a, tgt, layer_ids):
    """The head to continue (--init): (cfg, params, d2t, t2d), refused with
    the reason when it is not a head of this target over the dump's layers
    or its draft vocabulary is not the one asked for."""
    try:
        cfg, params, d2t, t2d = H.load_head(a.init)
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"train-eagle: --init {a.init}: {e}")
    want = H.HeadConfig.from_target(tgt, cfg.draft_vocab, layer_ids)
    for what, got, exp in (("hidden size", cfg.hidden, want.hidden), ("vocabulary", cfg.vocab, want.vocab),
                           ("attention heads", (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim),
                            (want.n_heads, want.n_kv_heads, want.head_dim)),
                           ("intermediate size", cfg.ff, want.ff), ("layer ids", cfg.layer_ids, layer_ids)):
        if got != exp:
            raise SystemExit(f"train-eagle: --init {a.init}: {what} {got}, the target and dump have {exp}")
    if a.draft_vocab is not None and a.draft_vocab != cfg.draft_vocab:
        raise SystemExit(f"train-eagle: --init {a.init}: its draft vocabulary is {cfg.draft_vocab}, "
                         f"--draft-vocab asks for {a.draft_vocab}")
    used = np.nonzero(t2d)[0]
    if len(used) != cfg.draft_vocab or not np.array_equal(used, np.arange(cfg.draft_vocab) + d2t):
        raise SystemExit(f"train-eagle: --init {a.init}: d2t and t2d do not name the same draft vocabulary")
    return cfg, params, d2t, t2d


def main(argv=None):
    a = parse_args(argv)
    log = lambda s: print(s, flush=True)
    a.model = a.model or demo_model()
    stem = model_stem(a.model)
    if not a.dump:
        a.dump = os.path.join(cache_dir(), "eagle3-data", stem)
        if not a.prompts and not a.prompt_ids:
            a.prompts = DEFAULT_PROMPTS
            a.minutes = a.minutes or DEMO_MINUTES   # the demo run
            a.samples = DEMO_SAMPLES if a.samples is None else a.samples
    a.out = a.out or os.path.join(cache_dir(), "eagle3", stem)
    a.samples = a.samples or 0
    if a.samples < 0 or (a.samples and a.prompt_ids):
        raise SystemExit("train-eagle: --samples takes N >= 0, with --prompts (specd-generate samples the answers)")
    tgt = TG.Target(a.model)
    layer_ids = TG.check_layer_ids(a.layers.split(",") if a.layers else TG.default_layer_ids(tgt.n_layers),
                                   tgt.n_layers)
    if a.prompts or a.prompt_ids:
        generate(a, tgt, layer_ids, log)
        if a.gen_only:
            return 0
    seqs, meta = TG.read_dumps(a.dump)
    if meta["hidden_size"] != tgt.hidden or meta["vocab_size"] != tgt.vocab:
        raise SystemExit(f"train-eagle: dump {a.dump} is of hidden {meta['hidden_size']} / vocab "
                         f"{meta['vocab_size']}, the target {tgt.hidden} / {tgt.vocab}")
    layer_ids = TG.check_layer_ids(meta["layer_ids"], tgt.n_layers)
    if a.init:
        init_cfg, init_params, d2t, t2d = load_init(a, tgt, layer_ids)
        dv = init_cfg.draft_vocab
        used = np.nonzero(t2d)[0].astype(np.int64)
        cov = TR.vocab_coverage(seqs, tgt.vocab, used)
    else:
        dv = min(a.draft_vocab or 4096, tgt.vocab)
        used, d2t, t2d, cov = TR.choose_vocab(seqs, tgt.vocab, dv, keep=(tgt.eos,))
    log(f"dump: {len(seqs)} sequences, {sum(len(s['tokens']) for s in seqs)} tokens, layers {layer_ids}; "
        f"draft vocabulary {dv} covers {cov:.1%} of the counted tokens")
    held, train_set = split_held_out(seqs, a.holdout, a.seed)
    held = TR.prepare(held, tgt, t2d, a.train_on_prompt, a.max_len)
    train_set = TR.prepare(train_set, tgt, t2d, a.train_on_prompt, a.max_len)
    passes = sorted({q["sample"] for q in seqs})
    del seqs
    cfg = H.HeadConfig.from_target(tgt, dv, layer_ids)
    lm_d = tgt.lm_head[used]
    params = init_params if a.init else H.init_params(cfg, a.seed, lm_head=lm_d, norm=tgt.output_norm)
    embed = tgt.embed
    ev = TR.make_eval(cfg, a.ttt)
    before = TR.evaluate(ev, params, held, a.ttt, embed, lm_d, a.batch) if held else None
    t0 = time.time()
    params, hist = TR.train(cfg, params, train_set, embed, lm_d, a.steps, a.ttt, a.lr, a.batch, a.seed, log,
                            seconds=a.minutes * 60.0)
    secs = time.time() - t0
    extra = {"target": os.path.basename(a.model), "dump": a.dump, "sequences": len(train_set),
             "held_out": len(held), "passes": passes,
             "tokens": int(sum(len(d["tokens"]) for d in train_set)),
             "layer_ids_convention": "output of layer id (0-based)", "steps": hist[-1][0] + 1 if hist else 0, "ttt_steps": a.ttt,
             "batch": a.batch, "lr": a.lr, "seed": a.seed, "draft_vocab_coverage": cov,
             "train_seconds": round(secs, 1), "history": hist}
    if a.init:
        extra["init"] = os.path.abspath(a.init)
    if held:
        after = TR.evaluate(ev, params, held, a.ttt, embed, lm_d, a.batch)
        extra["held_out_before"] = {"loss": before[0].tolist(), "acc": before[1].tolist()}
        extra["held_out_after"] = {"loss": after[0].tolist(), "acc": after[1].tolist()}
        log("held out, per TTT step: loss " + " ".join(f"{x:.3f}" for x in after[0]) + "  acc "
            + " ".join(f"{x:.3f}" for x in after[1]) + "  (before: acc "
            + " ".join(f"{x:.3f}" for x in before[1]) + ")")
    H.save_head(a.out, cfg, params, d2t, t2d, a.dtype, extra)
    log(f"head written to {a.out} ({secs:.0f} s of training)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
