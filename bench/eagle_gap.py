"""eagle_gap.py — what a head's held-out accuracy predicts for its greedy
acceptance, and whether the engine gets it: the head run in JAX
(tools/eagle/head.py, teacher-forced) over the target's own greedy answers
to a bench prompt set, beside specd-generate --eagle on the same prompts.

    .venv/bin/python bench/eagle_gap.py --model MODEL --head DIR [--set chat] [--prompts 8] [--n 96]
                                        [--k 1,2,3]

1. specd-generate --dump-features answers the prompts greedily (chat
   format, stopping at EOS, as bench/eagle_accept.py --stop-at-eos), with
   the head's layers captured.
2. In JAX, per answer row t (from the prompt's last position), the head's
   TTT steps 0..K-1 on the true tokens: step j is right when its top draft
   token is the target's top token at t+1+j (what a greedy chain accepts).
   Reported: the accuracy of step 0 over every row (as train-eagle's
   held-out figure, but unconditional: rows whose target token is outside
   the draft vocabulary count as misses), and that of step j given
   steps 0..j-1 right.
3. Per K, the chain a greedy decoder walks over those rows: from row t, the
   first wrong step j commits j + 1 tokens (the accepted drafts and the
   target's own token) and the walk goes on from row t + j + 1; all K right
   commits K + 1. The walk drafts only at the rows it reaches, so its
   acceptance can sit below the per-row average when the right rows
   cluster: it is what the engine should measure, and the script prints the
   engine's own (specd-generate --eagle -k K --json, the same prompts)
   beside it. Greedy, so both walk the same tokens; a gap between them is
   a fault of the engine's drafting, not of the head.
Also: the share of rows whose target token the draft vocabulary holds (a
bound on every step's accuracy), and how often the target's token is among
step 0's first n drafts (what n branches at a tree's first depth accept).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "eagle"))
import head as H  # noqa: E402
import target as TG  # noqa: E402


def dump(binary, model, prompts, out, layer_ids, n):
    pf = os.path.join(out, "prompts.txt")
    with open(pf, "w", encoding="utf-8") as f:
        f.writelines(p.replace("\n", "\\n") + "\n" for p in prompts)
    cmd = [binary, "-m", model, "--chat", "--prompt-file", pf, "--dump-features", out, "-n", str(n), "-t", "2",
           "--eagle-layers", ",".join(map(str, layer_ids))]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"eagle_gap: {' '.join(cmd)} failed: {r.stderr[-600:]}")


def step_right(params, cfg, d2t, tgt, seq, K, topn=8):
    """([rows, K] bool: step j of the head at answer row t is right, on the
    true tokens (rows whose labels all exist); [rows, topn] bool: the
    target's token is among step 0's first n + 1 draft tokens, what a tree
    of that many branches at its first depth would accept)."""
    import jax.numpy as jnp
    tok, aux, fin = seq["tokens"], seq["aux"], seq["final"]
    T = len(tok)
    top = np.argmax(fin @ tgt.lm_head.T, axis=-1)            # top[t]: the target's token at t + 1
    emb = tgt.embed[np.concatenate([tok, np.zeros(K, tok.dtype)])][None]
    outs = H.ttt_forward(params, cfg, jnp.asarray(aux[None]), jnp.asarray(emb), K)
    r0 = max(0, (seq["n_prompt"] or 1) - 1)
    rows = np.arange(r0, T - 1 - K + 1)                       # row t, step j labels top[t + 1 + j] <= T - 1
    right = np.zeros((len(rows), K), bool)
    for j, lg in enumerate(outs):
        d = np.argmax(np.asarray(lg[0]), axis=-1)
        right[:, j] = (d[rows] + d2t[d[rows]]) == top[rows + 1 + j]
    first = np.argsort(-np.asarray(outs[0][0])[rows], axis=-1)[:, :topn]
    in_top = np.cumsum((first + d2t[first]) == top[rows + 1][:, None], axis=1) > 0
    return right, in_top


def walk(right, K):
    """(drafted, accepted, steps, tokens) of a greedy K-chain over the rows."""
    t, drafted, accepted, steps, tokens = 0, 0, 0, 0, 0
    n = len(right)
    while t < n:
        j = 0
        while j < K and right[t, j]:
            j += 1
        drafted += K
        accepted += j
        steps += 1
        tokens += j + 1
        t += j + 1
    return drafted, accepted, steps, tokens


def engine(binary, model, headdir, prompt, n, k):
    cmd = [binary, "-m", model, "--chat", "-p", prompt, "-n", str(n), "-t", "2", "--eagle", headdir, "-k", str(k),
           "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"eagle_gap: {' '.join(cmd)} failed: {r.stderr[-600:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--set", default="chat")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--k", default="1,2,3")
    a = ap.parse_args()
    ks = [int(x) for x in a.k.split(",")]
    binary = TG.find_specd_generate()
    prompts = TG.read_prompts(os.path.join(HERE, "prompts", a.set + ".txt"))[:a.prompts]
    cfg, params, d2t, t2d = H.load_head(a.head)
    tgt = TG.Target(a.model)
    Kmax = max(ks)
    with tempfile.TemporaryDirectory() as d:
        dump(binary, a.model, prompts, d, cfg.layer_ids, a.n)
        seqs, _ = TG.read_dump(d)
    both = [step_right(params, cfg, d2t, tgt, s, Kmax) for s in seqs]
    rights = [b[0] for b in both]
    allr = np.concatenate(rights)
    in_top = np.concatenate([b[1] for b in both]).mean(axis=0)
    cover = np.mean(np.concatenate([t2d[np.argmax(s["final"] @ tgt.lm_head.T, -1)[max(0, s["n_prompt"] - 1):-1]]
                                    for s in seqs]))
    print(f"{a.set}: {len(seqs)} answers, {len(allr)} rows; the target's token in the draft vocabulary at "
          f"{cover:.1%} of them")
    cond = [allr[:, 0].mean()]
    for j in range(1, Kmax):
        ok = allr[:, :j].all(axis=1)
        cond.append(allr[ok, j].mean() if ok.any() else float("nan"))
    print("teacher-forced, step j right given steps < j right: " + " ".join(f"{c:.3f}" for c in cond))
    print("step 0, the target's token among the head's first n drafts: "
          + " ".join(f"n={i + 1} {x:.3f}" for i, x in enumerate(in_top)))
    print("| K | walk: acceptance | walk: tokens/step | engine: acceptance | engine: tokens/step |")
    print("| --- | --- | --- | --- | --- |")
    for k in ks:
        dr = ac = st = tk = 0
        for r in rights:
            d_, a_, s_, t_ = walk(r[:, :k], k)
            dr, ac, st, tk = dr + d_, ac + a_, st + s_, tk + t_
        e_dr = e_ac = e_st = e_tk = 0
        for p in prompts:
            j = engine(binary, a.model, a.head, p, a.n, k)
            sp = j["spec"]
            e_dr += sp["drafted"]
            e_ac += sp["accepted"]
            e_st += sp["target_steps"] - 1                # the verify steps: the prompt's step is one
            e_tk += j["timings"]["generated_tokens"] - 1  # and its token is not theirs
        print(f"| {k} | {ac / max(dr, 1):.3f} | {tk / max(st, 1):.3f} | {e_ac / max(e_dr, 1):.3f} | "
              f"{e_tk / max(e_st, 1):.3f} |")


if __name__ == "__main__":
    main()
