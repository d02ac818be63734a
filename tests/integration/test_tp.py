"""A tensor-parallel verifier group (specd-verifier --tp N --rank R --group
ADDR) through the whole service: N concurrent greedy requests produce exactly
the tokens specd-generate (TP = 1) gives each prompt alone.

  test_tp.py --tp N --model tiny|smollm|gemma [--lm-head split|leader]
             [--drafter layers|ngram|model|eagle|eagle-drafter|none] [--n 6] [--tokens 32] [--curve]
             [--cpu-weights stored|f32|copy]

--curve: every link keyed, the group's too (the leader admits only the rank
key: a rank with another key is refused and exits 3 while the leader waits).

Also checked: the leader registers with the coordinator only once every rank
has joined (it is started first and must stay unregistered until the ranks
come); a TP size that does not divide the model's heads is refused at
start-up with exit status 2 and a line saying so; a rank that disagrees with
the leader (another LM head mode) is refused and both exit 3; every rank stops cleanly
(exit 0) when the leader is stopped with SIGTERM.

tiny: a random 2-layer target with 4 heads and 2 KV heads (TP 2, and TP 4 with
the KV heads replicated), requests ignore EOS. smollm: SmolLM2-135M-Instruct
(9 heads, 3 KV heads: TP 3) with chat prompts, stopping at EOS as
specd-generate does. gemma: a random Gemma 3 (5 windowed layers of 7, a
window of 12, 4 heads, 2 KV heads) whose caches keep a window group on every
rank (the plans carry the window table), requests longer than the window.

Prompt logprobs (echo) on the group: a prompt_only request's entries equal
the TP = 1 engine's log-softmax within TP_LP_TOL.

--drafter eagle: the group's leader runs a random EAGLE-3 head
(specd-verifier --tp N --rank 0 --eagle DIR; group_head: it borrows the
target's embedding, its draft vocabulary the references' 4 most frequent
tokens) on the hidden
states it captures after each layer's all-reduce; --drafter eagle-drafter:
the same head in its own process (specd-drafter --eagle), fed the group's
features (VerifyResult.features) through the coordinator. K is fixed at 4.
Beyond greedy = TP 1 plain greedy: every request was drafted by the head
(kind eagle), drafts were accepted, and one request alone drafts, context by
context, the chains specd-generate --eagle (TP 1) drafts on the same prompt
(the group's features equal TP 1's within the all-reduce's rounding,
tests/test_tp_capture.c: the chains' argmaxes do not move), and the features
the head was fed (the leader's DEBUG lines) or received (the drafter's) for
that request have the norms of specd-generate --dump-features' rows of the
same positions within FEATURE_TOL; with the drafter process, they cover
positions 0..N without a gap."""
import argparse
import math
import os
import re
import signal
import subprocess
import time

import harness as H
import pbwire as pb

PROMPT_LP_TOKENS = 80
TP_LP_TOL = 2e-4  # measured worst: 2e-6 (tiny, TP 2), 2e-5 (SmolLM2 f32, TP 3)


def rank_keys(h, r, key=None):
    """With --curve: the leader holds the verifier key (a worker to the
    coordinator, the server of the group) and the ranks' allow-list; ranks
    hold the rank key (or `key`) and trust the leader's public key."""
    if not getattr(h, "keys", None):
        return []
    if r == 0:
        return h.key_args("verifier") + ["--rank-keys", os.path.join(h.key_dir, "ranks.allow")]
    return ["--curve-secret", h.keys[key or "rank"]["key"], "--curve-server", h.keys["verifier"]["pub"]]


def start_ranks(h, target, tp, lm_head, ranks, extra=(), key=None):
    """Starts the given ranks of a group at h.group_addr."""
    procs = []
    for r in ranks:
        procs.append(h.start("verifier" if r == 0 else "rank%d" % r,
                             [h.bin("verifier"), "--model", target, "--coordinator", h.worker_addr,
                              "--tp", str(tp), "--rank", str(r), "--group", h.group_addr, "--lm-head", lm_head,
                              "-t", "1"] + rank_keys(h, r, key) + h.engine_args + list(extra)))
    return procs


def verifier_registered(c):
    st = c.stats(timeout=1.0) or {}
    return any(w.get("alive") and w.get("role") == pb.ROLE_VERIFIER for w in st.get("workers", []))


def check_prompt_logprobs(h, c, target, refs, args):
    """Prompt logprobs (echo) from the group's prefill: a prompt_only
    request over PROMPT_LP_TOKENS ids (two 64-row chunks) gets one entry
    per token, the first without a logprob, the others within TP_LP_TOL of
    numpy's log-softmax of the TP = 1 engine's logits (tests/specd_logits):
    the group's partial sums and gathered LM head add their rounding."""
    from test_gateway_logprobs import engine_logits, log_softmax
    ids = []
    for r in refs:
        ids += list(r["prompt_ids"]) + list(r["ids"])
    while len(ids) < PROMPT_LP_TOKENS:
        ids += ids
    ids = ids[:PROMPT_LP_TOKENS]
    got = []
    res = c.run([dict(prompt_ids=ids, max_tokens=0, prompt_only=True, prompt_logprobs=True, top_logprobs=2)],
                timeout=args.timeout,
                on_event=lambda m, _: got.append(m["prompt_logprobs"]) if "prompt_logprobs" in m else None)
    H.check(res[0]["error"] is None and res[0]["finished"]["reason"] == 2 and not res[0]["ids"],
            "prompt_only on the group: %s" % res[0])
    entries = []
    for m in got:
        H.check(m.get("from", 0) == len(entries) and m["tokens"] == ids[len(entries):len(entries) + len(m["tokens"])],
                "PromptLogprobs out of order: from %s after %d entries" % (m.get("from", 0), len(entries)))
        entries += m["logprobs"]
    H.check(len(entries) == len(ids) and math.isnan(entries[0].get("logprob", 0.0)),
            "%d prompt entries for %d tokens, the first %s" % (len(entries), len(ids), entries[:1]))
    logits = engine_logits(h, target, ids, -1)
    H.check(logits is not None, "tests/specd_logits is not built")
    worst = 0.0
    for i in range(1, len(ids)):
        row = log_softmax(logits[i - 1].astype("float64"))
        e = entries[i]
        d = max(abs(e.get("logprob", 0.0) - row[ids[i]]),
                max(abs(a - b) for a, b in zip(e.get("top_logprobs", []), sorted(row, reverse=True)[:2])))
        worst = max(worst, d)
        H.check(len(e.get("top_ids", [])) == 2 and d <= TP_LP_TOL,
                "position %d: %s vs TP = 1 %.6f (limit %g)" % (i, e, row[ids[i]], TP_LP_TOL))
    H.log("prompt logprobs on the TP %d group: %d positions within %.2g of TP = 1 (worst %.2g)" %
          (args.tp, len(ids) - 1, TP_LP_TOL, worst))


def group_head(h, refs, model):
    """A random EAGLE-3 head for the target (tiny: hidden 64, vocab 512;
    smollm: 576, 49152) that borrows the target's embedding (the leader's
    replicated token_embd in a group), its 4-token draft vocabulary the
    tokens the references generate most (test_greedy.eagle_head's choice,
    so that drafts are accepted)."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ref"))
    try:
        import numpy as np
        from eagle_ref import write_head
    except ImportError as e:
        H.skip("python packages for the head writer missing (%s); run scripts/setup" % e)
    hidden, vocab, heads, kv = (576, 49152, 9, 3) if model == "smollm" else (64, 512, 4, 2)
    counts = np.bincount([t for r in refs for t in r["ids"]], minlength=vocab)
    hot = np.sort(np.argsort(-counts, kind="stable")[:4])

    def to_hot(t):
        t["d2t"] = (hot - np.arange(4)).astype(np.int64)
        t["t2d"] = np.isin(np.arange(vocab), hot)
    path = os.path.join(h.tmp, "eagle-head")
    write_head(path, hidden=hidden, vocab=vocab, draft_vocab=4, n_heads=heads, n_kv_heads=kv, with_embed=False,
               seed=3, tensors_edit=to_hot)
    H.log("head (the target's embedding) drafts among tokens %s (%.0f%% of the references' tokens)"
          % (hot.tolist(), 100.0 * counts[hot].sum() / max(1, counts.sum())))
    return path


FEATURE_TOL = 1e-5  # relative, on a run's norm; measured worst: see the log line


def check_feature_norms(h, log_proc, start, target, prompt, args):
    """The head's feature runs for the lone request (log_proc's DEBUG lines
    from offset start: positions a..b and the norm of their f32 rows, as
    the verifier's head was fed them or the drafter received them) against
    the same positions' rows of specd-generate --dump-features (TP 1): the
    norms agree within FEATURE_TOL relative (a group's features differ from
    TP 1's in the last bits: tests/test_tp_capture.c bounds them row by
    row). Returns the runs [(a, b)]."""
    import numpy as np
    from safetensors.numpy import load_file
    with open(log_proc.logpath, errors="replace") as f:
        layers = next(l for l in f if "eagle: head" in l and "target layers " in l)
        f.seek(start)
        lines = [ln for ln in f if "head features: " in ln and " l2 " in ln]
    layers = layers.split("target layers ")[1].split(":")[0].split(";")[0].replace(" ", "").strip()
    runs = []
    for ln in lines:
        a, b = (int(x) for x in ln.split(" positions ")[1].split()[0].split(".."))
        runs.append((a, b, float(ln.split(" l2 ")[1].split()[0])))
    H.check(runs, "%s logged no feature runs for the lone request" % log_proc.name)
    d = os.path.join(h.tmp, "dump")
    os.makedirs(d, exist_ok=True)
    g = subprocess.run([h.bin("generate"), "-m", target, "-p", prompt, "-n", str(args.tokens), "--ignore-eos",
                        "-t", "1", "--dump-features", d, "--eagle-layers", layers] + h.engine_args,
                       capture_output=True, text=True, timeout=900)
    H.check(g.returncode == 0, "specd-generate --dump-features failed: %s" % g.stderr[-2000:])
    aux = load_file(os.path.join(d, "000000.safetensors"))["aux"].astype(np.float64)
    worst, bad = 0.0, []
    for a, b, l2 in runs:
        if b >= len(aux):
            bad.append((a, b, l2, None))
            continue
        ref = float(np.sqrt(np.sum(aux[a:b + 1] ** 2)))
        rel = abs(l2 - ref) / max(ref, 1e-30)
        worst = max(worst, rel)
        if rel > FEATURE_TOL:
            bad.append((a, b, l2, ref))
    H.check(not bad, "%d of %d feature runs differ from TP 1's rows by more than %g of their norm, e.g. %s"
            % (len(bad), len(runs), FEATURE_TOL, bad[0] if bad else None))
    H.log("%d feature runs (layers %s) within %g of TP 1's norms (worst %.2g)"
          % (len(runs), layers, FEATURE_TOL, worst))
    return [(a, b) for a, b, _ in runs]


def check_head(h, c, res, log_proc, target, head, prompts, args):
    """The head (in the leader, or in the drafter process log_proc) drafted
    every request, had drafts accepted, and drafts specd-generate --eagle's
    chains (TP 1) for a request alone; a drafter process received features
    of every position."""
    from test_greedy import DRAFTER_KIND_EAGLE, check_chains
    kinds = [r["finished"]["stats"].get("drafter_kind", 0) for r in res]
    H.check(all(k == DRAFTER_KIND_EAGLE for k in kinds), "requests drafted by kinds %s, expected the head's (%d)"
            % (kinds, DRAFTER_KIND_EAGLE))
    accepted = sum(r["finished"]["stats"].get("accepted", 0) for r in res)
    H.check(accepted > 0, "no draft of the head was accepted")
    best = max(range(len(res)), key=lambda i: res[i]["finished"]["stats"].get("accepted", 0))
    # SmolLM2's lone request (16 tokens, 14 target steps at this head's
    # acceptance) was measured drafting at 11 contexts: three steps without
    # a chain where the tiny model's have at most two
    start = check_chains(h, c, log_proc, target, head, prompts[best], args.tokens,
                         undrafted=3 if args.model == "smollm" else 2)
    runs = check_feature_norms(h, log_proc, start, target, prompts[best], args)
    if args.drafter == "eagle-drafter":
        covered = sorted({p for a, b in runs for p in range(a, b + 1)})
        H.check(covered and covered[0] == 0 and covered == list(range(covered[-1] + 1)),
                "the group's features reached the drafter for positions %s, expected 0..N without a gap"
                % covered[:40])
        H.log("the TP %d group sent features of positions 0..%d in %d runs" % (args.tp, covered[-1], len(runs)))
    H.log("the head in %s drafted %s; accepted %d"
          % ("the leader" if args.drafter == "eagle" else "its own process",
             "specd-generate --eagle's chains", accepted))


def run(h, args):
    if args.cpu_weights:
        h.engine_args = ["--cpu-weights", args.cpu_weights]
    if args.curve:
        h.enable_curve(extra_names=["rank", "rogue"])
        with open(os.path.join(h.key_dir, "ranks.allow"), "w") as f:
            f.write("%s rank\n" % h.keys["rank"]["public"].decode())
    if args.model == "tiny":
        target, draft = h.tiny_models()
        prompts = H.random_prompts(args.n, seed=17)
        chat, ignore_eos = False, True
    elif args.model == "gemma":
        target, draft = os.path.join(h.tmp, "gemma.gguf"), None
        subprocess.run([h.bin("mkmodel"), "-o", target, "--arch", "gemma3", "--dim", "64", "--layers", "7",
                        "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--ff", "128", "--window", "12",
                        "--vocab", "512", "--tied", "--seed", "23"], check=True, capture_output=True)
        prompts = H.random_prompts(args.n, seed=19)
        chat, ignore_eos = False, True
    else:
        target, draft = h.smollm(), None
        base = ["What is the capital of France?", "Name three colors.", "Count from 1 to 10.",
                "Write a haiku about the sea.", "What is 12 times 12?", "Say hello in Spanish."]
        prompts = [base[i % len(base)] for i in range(args.n)]
        chat, ignore_eos = True, False

    # A TP size that does not divide the heads: a clear refusal at start-up.
    bad_tp = 2 if args.model == "smollm" else 3
    r = subprocess.run([h.bin("verifier"), "--model", target, "--tp", str(bad_tp), "--rank", "0",
                        "--group", "tcp://127.0.0.1:%d" % H.free_port(), "-t", "1"],
                       capture_output=True, text=True, timeout=300)
    H.check(r.returncode == 2 and "does not divide" in r.stderr,
            "--tp %d on this model: exit %d, expected 2 with 'does not divide' in:\n%s"
            % (bad_tp, r.returncode, r.stderr[-2000:]))
    H.log("--tp %d refused: %s" % (bad_tp, next(l for l in r.stderr.splitlines() if "does not divide" in l)))

    # Ranks that disagree with the leader (here on the LM head mode) are a
    # configuration error: the leader refuses the join, both exit 3.
    h.group_addr = "tcp://127.0.0.1:%d" % H.free_port()
    h.worker_addr = "tcp://127.0.0.1:%d" % H.free_port()  # no coordinator: the group never forms
    other = "leader" if args.lm_head == "split" else "split"
    pair = start_ranks(h, target, 2 if args.tp % 2 == 0 else args.tp, args.lm_head, [0])
    pair += start_ranks(h, target, 2 if args.tp % 2 == 0 else args.tp, other, [1])
    for p in pair:
        H.wait_until(lambda: not p.alive(), 120, "%s to exit after a refused join" % p.name)
        H.check(p.popen.returncode == 3, "%s exited %s after a refused join, expected 3" % (p.name,
                                                                                           p.popen.returncode))
    H.check("computes the LM head" in pair[0].log_tail(50), "the leader did not say why it refused the rank")
    h.procs = [p for p in h.procs if p not in pair]

    refs = [h.reference(target, p, args.tokens, ignore_eos=ignore_eos, chat=chat) for p in prompts]
    H.log("computed %d references (TP = 1)" % len(refs))

    head = None
    if args.drafter in ("eagle", "eagle-drafter"):
        head = group_head(h, refs, args.model)
    h.start_coordinator(target, H.FIXED_K if head else ())
    h.group_addr = "tcp://127.0.0.1:%d" % H.free_port()
    leader = start_ranks(h, target, args.tp, args.lm_head, [0],
                         extra=("--eagle", head, "-v") if args.drafter == "eagle" else ())[0]
    # The leader alone must not register: it waits for its ranks.
    c = h.client()
    H.wait_until(lambda: "waiting for ranks" in leader.log_tail(50) or not leader.alive(), 300,
                 "the leader to wait for its ranks")
    H.check(leader.alive(), "the leader exited (%s) while waiting for its ranks" % leader.popen.returncode)
    t_end = time.monotonic() + 1.5
    while time.monotonic() < t_end:
        H.check(not verifier_registered(c), "the leader registered before its ranks joined")
    if args.curve:
        # a rank with a key off the leader's list is refused at the handshake
        # (exit 3, saying so); so is one without keys; the leader waits on
        for key in ("rogue", "client"):
            rogue = start_ranks(h, target, args.tp, args.lm_head, [1], key=key)[0]
            H.wait_until(lambda: not rogue.alive(), 60, "the rank with the %s key to exit" % key)
            H.check(rogue.popen.returncode == 3 and "refused this rank" in rogue.log_tail(20),
                    "a rank with the %s key exited %s" % (key, rogue.popen.returncode))
            h.procs.remove(rogue)
        H.check(leader.alive() and not verifier_registered(c), "a refused rank disturbed the leader")
        H.log("ranks with unknown keys refused; the leader waits on")
    ranks = start_ranks(h, target, args.tp, args.lm_head, range(1, args.tp))
    dr = None
    if args.drafter not in ("none", "eagle"):
        dr = h.start_drafter("eagle" if head else args.drafter, draft=head or draft,
                             extra=["-t", "1"] + (["-v"] if head else []))
    h.wait_registered(drafter=args.drafter != "none")
    H.check("group: %d ranks ready" % args.tp in leader.log_tail(200), "the leader did not report its ranks ready")
    H.log("group of %d registered" % args.tp)

    jobs = [dict(prompt=p, max_tokens=args.tokens, ignore_eos=ignore_eos, chat=chat) for p in prompts]
    res = c.run(jobs, timeout=args.timeout)
    H.expect_equal_ids(res, refs, "TP %d (%s head), %d concurrent greedy requests (%s, drafter %s)"
                       % (args.tp, args.lm_head, args.n, args.model, args.drafter))
    drafted = sum(x["finished"]["stats"].get("drafted", 0) for x in res)
    H.log("all %d equal to TP = 1; drafted %d" % (len(res), drafted))
    if head:
        check_head(h, c, res, leader if args.drafter == "eagle" else dr, target, head, prompts, args)
    check_prompt_logprobs(h, c, target, refs, args)
    if args.model == "gemma":  # every rank keeps the leader's window group
        for p in ranks:
            m = re.search(r"\((\d+) window blocks\)", p.log_tail(400))
            H.check(m is not None and int(m.group(1)) > 0, "%s has no window group" % p.name)
        H.log("ranks hold window groups of %s blocks" % m.group(1))

    # A clean stop of the leader stops every rank cleanly.
    rc = h.stop(leader, signal.SIGTERM)
    H.check(rc == 0, "the leader exited %s on SIGTERM, expected 0" % rc)
    for p in ranks:
        H.wait_until(lambda: not p.alive(), 30, "%s to stop after the leader" % p.name)
        H.check(p.popen.returncode == 0, "%s exited %s after the leader's clean stop, expected 0"
                % (p.name, p.popen.returncode))
    c.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--model", choices=["tiny", "smollm", "gemma"], default="tiny")
    ap.add_argument("--lm-head", choices=["split", "leader"], default="split")
    ap.add_argument("--drafter", choices=["model", "ngram", "layers", "eagle", "eagle-drafter", "none"],
                    default="layers")
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--cpu-weights", choices=["stored", "f32", "copy"], default=None,
                    help="passed to every process that loads a model (verifier ranks, model drafters, "
                         "specd-generate, specd_logits)")
    ap.add_argument("--curve", action="store_true", help="CurveZMQ on every link, the group's included")
    a = ap.parse_args()
    H.main(lambda h: run(h, a))
