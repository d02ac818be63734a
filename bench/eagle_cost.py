"""eagle_cost.py — what an EAGLE-3 head costs per drafted token, as a fraction
of a target token, single process (specd-generate).

    .venv/bin/python bench/eagle_cost.py --model MODEL --head DIR [--k 4] [--n 64] [--runs 3]
                                         [--variant LABEL=BUILD_DIR[:WEIGHTS]]...
    .venv/bin/python bench/eagle_cost.py --model MODEL --random-head DIR --draft-vocab 8192 [--dtype bfloat16]
                                         [--shape H,V,HEADS,KV,FF,THETA]  (default: SmolLM2-135M's)

Runs plain greedy decoding and `--eagle DIR -k K` on the same prompts,
alternating, and reports per run: the target's ms per token in plain
decoding (decode_ms / decode_tokens), the head's ms per drafted token
(draft_ms / drafted: its rows over the new target features, fc included,
and the chain) and their ratio; the best of the runs is the figure (a shared
machine's error is preemption), and the median. --variant (repeatable) runs
the head from other builds and --eagle-weights (q8_0 / stored) in the same
rounds, interleaved prompt by prompt, each against the same plain runs
(default: this build with its default weights), with each variant's acceptance
(accepted / drafted). --random-head first writes a random head
of the target's shape (tests/ref/eagle_ref.py) to DIR: its cost is a
trained head's of the same shape (its acceptance is not).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short poem about the sea.",
    "What are three good habits for writing clean code?",
]


def run(gen, model, prompt, n, threads, extra, ignore_eos=True):
    cmd = [gen, "-m", model, "-p", prompt, "-n", str(n)] + (["--ignore-eos"] if ignore_eos else []) + \
        ["--json", "--chat", "-t", str(threads)]
    r = subprocess.run(cmd + extra, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd + extra)} failed:\n{r.stderr}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--head")
    ap.add_argument("--random-head")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--shape", default="576,49152,9,3,1536,100000",
                    help="with --random-head: hidden,vocab,heads,kv_heads,ff,rope_theta (default SmolLM2-135M's)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--variant", action="append", default=[],
                    help="LABEL=BUILD_DIR[:WEIGHTS]: the head run by that build's specd-generate, with "
                         "--eagle-weights WEIGHTS when given")
    a = ap.parse_args()
    gen = os.path.join(a.build, "tools", "specd-generate")
    variants = []
    for v in a.variant or ["default=" + a.build]:
        label, _, rest = v.partition("=")
        bdir, _, weights = rest.partition(":")
        variants.append((label, os.path.join(bdir, "tools", "specd-generate"),
                         ["--eagle-weights", weights] if weights else []))
    head = a.head
    if a.random_head:
        sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
        from eagle_ref import write_head
        hidden, vocab, heads, kv, ff, theta = (int(x) for x in a.shape.split(","))
        write_head(a.random_head, hidden=hidden, vocab=vocab, draft_vocab=min(a.draft_vocab, vocab), n_heads=heads,
                   n_kv_heads=kv, ff=ff, with_embed=False, dtype=a.dtype, seed=1, rope_theta=float(theta))
        head = a.random_head
    if not head:
        sys.exit("--head DIR or --random-head DIR")
    results = {label: [] for label, _, _ in variants}  # (target ms, head ms, ratio) per run
    for i in range(a.runs):
        plain_ms, plain_tok = 0.0, 0
        draft = {label: [0.0, 0, 0] for label, _, _ in variants}  # ms, drafted, accepted
        for j, p in enumerate(PROMPTS):
            t = run(gen, a.model, p, a.n, a.threads, [])["timings"]
            plain_ms += t["decode_ms"]
            plain_tok += t["decode_tokens"]
            order = variants if (i + j) % 2 == 0 else variants[::-1]
            for label, vgen, extra in order:
                s = run(vgen, a.model, p, a.n, a.threads, ["--eagle", head, "-k", str(a.k)] + extra)["spec"]
                draft[label][0] += s["draft_ms"]
                draft[label][1] += s["drafted"]
                draft[label][2] += s["accepted"]
        target = plain_ms / max(plain_tok, 1)
        for label, _, _ in variants:
            per_draft = draft[label][0] / max(draft[label][1], 1)
            acc = draft[label][2] / max(draft[label][1], 1)
            results[label].append((target, per_draft, per_draft / target, acc))
            print(f"run {i} {label}: target {target:.2f} ms/token, head {per_draft:.3f} ms/drafted token, "
                  f"ratio {per_draft / target:.3f}, acceptance {acc:.3f}")
    for label, rs in results.items():
        best = min(rs, key=lambda r: r[2])
        med = sorted(r[2] for r in rs)[len(rs) // 2]
        print(f"{label}: best: target {best[0]:.2f} ms/token, head {best[1]:.3f} ms/drafted token = "
              f"{100 * best[2]:.1f}% of a target token; median ratio {100 * med:.1f}%; acceptance "
              f"{statistics.median(r[3] for r in rs):.3f} (median) "
              f"(K {a.k}, {a.runs} runs x {len(PROMPTS)} prompts x {a.n} tokens)")


if __name__ == "__main__":
    main()
