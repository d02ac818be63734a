"""N concurrent greedy requests through the service produce exactly the tokens
specd-generate gives each prompt alone.

  test_greedy.py --model tiny|smollm --drafter model|ngram|local-ngram|layers|none [--n 64] [--tokens 24] [--adaptive] [--hf]
                 [--warmup N]

tiny: a random 2-layer target (specd-mkmodel) with a random 1-layer draft
model sharing its tokenizer; requests ignore EOS so every one runs to
max_tokens. --arch A: both of architecture A (qwen2, qwen3, gemma3, mistral,
phi3-longrope: harness.TINY_ARCHS), so each family's speculative output
through the service is checked against its plain decoding. smollm: SmolLM2-135M-Instruct with chat prompts, stopping at EOS
as specd-generate does; gemma: the real Gemma 3 270M (gemma3 architecture,
SentencePiece tokenizer, Gemma's chat template) the same way. The coordinator runs with K fixed at 4
(harness.FIXED_K), and the test checks that speculation happened (drafted > 0
summed over requests) when a drafter is attached, and that the prompt token
counts equal specd-generate's. --adaptive: the coordinator's own adaptive K
instead (one batch or two cohorts, shadow drafts, K from the measured
costs); whether it speculates then depends on the machine, so drafted is
only logged. --hf: the service (coordinator, verifier, drafter) gets the
target as a Hugging Face directory converted from the GGUF (specd-mkmodel
--convert), the references still come from the GGUF: the two formats hold
the same numbers, so the tokens must be equal. --warmup N: verifier and
model drafter warm up to N tokens before registering (as they do by default
on a GPU); the coordinator must say it seeded its cost model from the
verifier's step times, and the tokens must still be equal. --drafter
local-ngram: no drafter process; the coordinator's own n-gram drafter
(specd-coordinator --local-ngram) drafts, and must have registered.
--drafter eagle: no drafter process; the verifier runs a random, untrained
EAGLE-3 head (tests/ref/eagle_ref.write_head, published layout, its own
embedding; its 4-token draft vocabulary is the target's most frequent output
tokens, so that drafts are accepted too) with --eagle, drafting after each
verify step; the coordinator must have registered its relay (kind eagle), and
the requests must have been drafted by that kind. Since a random head's
drafts are almost all rejected, equal tokens alone would not show that the
head reads the right features: one more request alone must make exactly the
chains specd-generate --eagle makes on the same prompt, context by context
(both logged at -v), which holds only when the verifier hands the head the
features of the right rows and positions and rolls it back.
--drafter eagle-drafter: the same head in its own process (specd-drafter
--eagle), fed the verifier's features of the committed positions through the
coordinator (VerifyResult.features -> DraftSeq.features); the same checks,
the chains read from the drafter's log: they equal specd-generate --eagle's
only when the features on the wire are those of the right positions, bit for
bit, and drafts must have been accepted."""
import os
import subprocess
import argparse

import harness as H

DRAFTER_KIND_EAGLE = 4


def eagle_head(h, refs):
    """A random head for the tiny target (dim 64, vocab 512), or a skip. Its
    draft vocabulary is the 4 tokens the target generates most often in
    refs, so that some drafts are accepted (the head picks among them by its
    features) and steps commit accepted drafts as well as rejections."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ref"))
    try:
        from eagle_ref import write_head
    except ImportError as e:
        H.skip("python packages for the head writer missing (%s); run scripts/setup" % e)
    import numpy as np
    counts = np.bincount([t for r in refs for t in r["ids"]], minlength=512)
    hot = np.sort(np.argsort(-counts, kind="stable")[:4])

    def to_hot(t):
        t["d2t"] = (hot - np.arange(4)).astype(np.int64)
        t["t2d"] = np.isin(np.arange(512), hot)
    path = os.path.join(h.tmp, "eagle-head")
    write_head(path, hidden=64, vocab=512, draft_vocab=4, seed=3, tensors_edit=to_hot)
    H.log("head drafts among tokens %s (%.0f%% of the references' tokens)"
          % (hot.tolist(), 100.0 * counts[hot].sum() / max(1, counts.sum())))
    return path


def chains_of(lines):
    """{context: drafts} from drafter_eagle.c's DEBUG lines."""
    out = {}
    for ln in lines:
        if "eagle: slot" in ln and " context " in ln and " drafted" in ln:
            out[int(ln.split(" context ")[1].split()[0])] = [int(x) for x in ln.split(" drafted")[1].split()]
    return out


def check_chains(h, c, ver, target, head, prompt, tokens, undrafted=2):
    """One request alone: the head in the verifier (or in the drafter
    process whose log ver is) drafts, at every context, the chain the
    single-process head drafts there (a prefix of it: the service asks for
    fewer near the end); all but `undrafted` of its verify steps drafted."""
    with open(ver.logpath, errors="replace") as f:
        f.seek(0, 2)
        start = f.tell()
    r = c.run([dict(prompt=prompt, max_tokens=tokens, ignore_eos=True)], timeout=300)[0]
    H.check(not r["error"], "the lone request failed: %s" % r["error"])
    st = r["finished"]["stats"]
    H.check(st.get("accepted", 0) > 0, "the lone request accepted no draft: its accepted rows are untested")
    with open(ver.logpath, errors="replace") as f:
        f.seek(start)
        served = chains_of(f.readlines())
    g = subprocess.run([h.bin("generate"), "-m", target, "-p", prompt, "-n", str(tokens), "--ignore-eos", "--json",
                        "-t", "1", "-v", "--eagle", head, "-k", "4"] + h.engine_args, capture_output=True, text=True,
                       timeout=600)
    H.check(g.returncode == 0, "specd-generate --eagle failed: %s" % g.stderr[-2000:])
    alone = chains_of(g.stderr.splitlines())
    common = sorted(set(served) & set(alone))
    # every verify step but the last few (no room left for drafts) drafts
    steps = st.get("target_steps", 0)
    H.check(len(served) >= steps - undrafted and len(common) >= len(served) - 1,
            "the verifier's head drafted at %d contexts for %d verify steps, %d of them where specd-generate did"
            % (len(served), steps, len(common)))
    bad = [(n, served[n], alone[n]) for n in common if not served[n] or served[n] != alone[n][:len(served[n])]]
    H.check(not bad, "%d chains differ from specd-generate --eagle's, e.g. context %d: verifier %s, alone %s"
            % ((len(bad),) + (bad[0] if bad else (0, [], []))))
    H.log("the verifier's head drafted specd-generate --eagle's chains at %d contexts" % len(common))
    return start


def fnv1a(b):
    h = 0xcbf29ce484222325
    for x in b:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def check_features(h, dr, start, target, prompt, tokens):
    """The features the head drafter received for the lone request (the
    DEBUG lines of draft_head.c from offset start of its log: positions and
    an FNV-1a of their f32 bytes) are, bit for bit, the target's own rows of
    those positions, as specd-generate --dump-features writes them for the
    same greedy sequence, and they cover every position but the last."""
    with open(dr.logpath, errors="replace") as f:
        layers = next(l for l in f if "reads target layers" in l)  # "... reads target layers 0, 0, 0: 192 floats"
        f.seek(start)
        lines = f.readlines()
    layers = layers.split("reads target layers ")[1].split(":")[0].replace(" ", "")
    runs = []
    for ln in lines:
        if "head features: request" in ln:
            pos = ln.split(" positions ")[1].split()[0]
            a, b = (int(x) for x in pos.split(".."))
            runs.append((a, b, int(ln.split(" fnv1a ")[1].split()[0], 16)))
    H.check(runs, "the head drafter logged no features for the lone request")
    d = os.path.join(h.tmp, "dump")
    os.makedirs(d, exist_ok=True)
    g = subprocess.run([h.bin("generate"), "-m", target, "-p", prompt, "-n", str(tokens), "--ignore-eos", "-t", "1",
                        "--dump-features", d, "--eagle-layers", layers] + h.engine_args, capture_output=True,
                       text=True, timeout=600)
    H.check(g.returncode == 0, "specd-generate --dump-features failed: %s" % g.stderr[-2000:])
    from safetensors.numpy import load_file
    aux = load_file(os.path.join(d, "000000.safetensors"))["aux"]
    bad = [(a, b) for a, b, x in runs if b >= len(aux) or fnv1a(aux[a:b + 1].tobytes()) != x]
    H.check(not bad, "%d of %d feature runs differ from the target's own rows, e.g. positions %s"
            % (len(bad), len(runs), bad[:1]))
    covered = sorted({p for a, b, _ in runs for p in range(a, b + 1)})
    H.check(covered[0] == 0 and covered == list(range(covered[-1] + 1)),
            "the runs do not cover positions 0..%d without a gap" % covered[-1])
    H.log("the head drafter received the target's own rows, bit for bit: %d runs, positions 0..%d"
          % (len(runs), covered[-1]))


def check_seeded(h, c, target, prompts, tokens):
    """Seeded sampled requests drafted by the head: under the coupled rule
    (spec.h) their tokens are seeded plain decoding's, whatever was drafted."""
    samp = [dict(temperature=0.8, top_p=0.95, seed=500 + i) for i in range(len(prompts))]
    refs = [h.reference(target, p, tokens, temp=s["temperature"], seed=s["seed"], ignore_eos=True, top_p=s["top_p"])
            for p, s in zip(prompts, samp)]
    res = c.run([dict(prompt=p, max_tokens=tokens, ignore_eos=True, sampling=s) for p, s in zip(prompts, samp)],
                timeout=300)
    H.expect_equal_ids(res, refs, "%d seeded requests (temperature 0.8, top-p 0.95) drafted by the head"
                       % len(prompts))
    drafted = sum(r["finished"]["stats"].get("drafted", 0) for r in res)
    accepted = sum(r["finished"]["stats"].get("accepted", 0) for r in res)
    H.check(drafted > 0, "no draft of the head was verified for the seeded requests")
    H.log("seeded requests = seeded plain decoding; drafted %d, accepted %d" % (drafted, accepted))
    # The rejection rule (Sampling.rule): its tokens depend on the drafts, so
    # it is not plain decoding's; a request alone, run twice, must give the
    # same tokens (the drafts, K and uniforms depend on the seed alone), and
    # drafts must have been verified under it.
    rej = [dict(prompt=p, max_tokens=tokens, ignore_eos=True, sampling=dict(s, rule=2))
           for p, s in zip(prompts, samp)]
    first = [c.run([j], timeout=300)[0] for j in rej]
    again = [c.run([j], timeout=300)[0] for j in rej]
    H.expect_equal_ids(again, first, "seeded requests under the rejection rule, run again")
    drafted = sum(r["finished"]["stats"].get("drafted", 0) for r in first)
    accepted = sum(r["finished"]["stats"].get("accepted", 0) for r in first)
    H.check(drafted > 0, "no draft was verified under the rejection rule")
    H.log("rejection rule: drafted %d, accepted %d" % (drafted, accepted))


def run(h, args):
    if args.model == "tiny":
        target, draft = h.tiny_models(arch=args.arch)
        prompts = H.random_prompts(args.n, seed=7)
        chat, ignore_eos = False, True
    else:
        target, draft = (h.gemma3() if args.model == "gemma" else h.smollm()), None
        base = ["What is the capital of France?", "Name three colors.", "Count from 1 to 10.",
                "Write a haiku about the sea.", "What is 12 times 12?", "Say hello in Spanish.",
                "List the planets of the solar system.", "Repeat after me: the cat sat on the mat, the cat sat."]
        prompts = [base[i % len(base)] + (" Answer briefly." * (i // len(base))) for i in range(args.n)]
        chat, ignore_eos = True, False
    # References first (one process per prompt, alone), then the service.
    refs = [h.reference(target, p, args.tokens, ignore_eos=ignore_eos, chat=chat) for p in prompts]
    H.log("computed %d references" % len(refs))
    if args.hf:
        hf_dir = os.path.join(h.tmp, "target-hf")
        subprocess.run([h.bin("mkmodel"), "-o", hf_dir, "--format", "hf", "--convert", target], check=True,
                       capture_output=True)
        target = hf_dir
    # K fixed (H.FIXED_K): the test is about the drafts' verification under
    # load; adaptive K may rightly choose K = 0 for a drafter that does not
    # pay (the tiny models; SmolLM2's 1-layer self-draft under ASan)
    warm = ("--warmup", str(args.warmup)) if args.warmup else ()
    local = args.drafter == "local-ngram"
    eagle = ("--eagle", eagle_head(h, refs), "-v") if args.drafter == "eagle" else ()
    if args.drafter == "eagle-drafter":  # the head in its own process: specd-drafter --eagle DIR --model TARGET
        draft = eagle_head(h, refs)
    coord, ver, dr = h.start_service(target, drafter=None if args.drafter in ("none", "local-ngram", "eagle")
                                     else "eagle" if args.drafter == "eagle-drafter" else args.drafter, draft=draft,
                                     coord_extra=list(() if args.adaptive else H.FIXED_K)
                                     + (["--local-ngram"] if local else []), verifier_extra=warm + eagle,
                                     drafter_extra=warm if args.drafter in ("model", "layers")
                                     else ("-v",) if args.drafter == "eagle-drafter" else ())
    if local:
        with open(coord.logpath, errors="replace") as f:
            H.check(any("drafter in-coordinator (DRAFTER_KIND_NGRAM) registered" in l for l in f),
                    "the coordinator's own n-gram drafter did not register")
    if eagle:
        def relay_registered():
            with open(coord.logpath, errors="replace") as f:
                return any("head relay" in l and "registered" in l for l in f)
        H.wait_until(relay_registered, 10, "the verifier's head to register as a drafter")
    if args.warmup:
        with open(coord.logpath, errors="replace") as f:
            seeded = [l for l in f if "cost model seeded" in l]
        H.check(len(seeded) == 1, "the coordinator did not seed its cost model from the verifier's warm-up")
        H.log(seeded[0].strip())
    c = h.client()
    jobs = [dict(prompt=p, max_tokens=args.tokens, ignore_eos=ignore_eos, chat=chat) for p in prompts]
    res = c.run(jobs, timeout=args.timeout)
    for i, (r, ref) in enumerate(zip(res, refs)):
        H.check(r["error"] or r.get("prompt_tokens") == len(ref["prompt_ids"]),
                "request %d: coordinator counted %s prompt tokens, specd-generate %d"
                % (i, r.get("prompt_tokens"), len(ref["prompt_ids"])))
    H.expect_equal_ids(res, refs, "%d concurrent greedy requests (%s, drafter %s)" % (args.n, args.model,
                                                                                      args.drafter))
    # Text too, on the real model (random models emit invalid UTF-8, which
    # reaches clients as U+FFFD and specd-generate's JSON as U+FFFD per
    # maximal subpart: decode with replacement on both sides).
    u = lambda b: b.decode("utf-8", "replace")
    bad_text = [(i, u(r["text"]), u(ref["text_bytes"])) for i, (r, ref) in enumerate(zip(res, refs))
                if args.model == "smollm" and u(r["text"]) != u(ref["text_bytes"])]
    H.check(not bad_text, "streamed text differs from specd-generate's for %d requests, e.g. request %d: "
            "service %r vs alone %r" % ((len(bad_text),) + (bad_text[0] if bad_text else (0, b"", b""))))
    drafted = sum(r["finished"]["stats"].get("drafted", 0) for r in res)
    accepted = sum(r["finished"]["stats"].get("accepted", 0) for r in res)
    H.log("all %d equal; drafted %d, accepted %d" % (len(res), drafted, accepted))
    if args.drafter != "none" and not args.adaptive:
        H.check(drafted > 0, "a %s drafter was attached but no request was speculated (drafted = 0)"
                % args.drafter)
    if args.drafter == "eagle-drafter":
        H.check(accepted > 0, "the head drafter's drafts were never accepted")
        eagle = ("--eagle", draft)
        ver = dr  # the chains are in the drafter's log
    if eagle:
        check_seeded(h, c, target, prompts[:4], args.tokens)
        best = max(range(len(res)), key=lambda i: res[i]["finished"]["stats"].get("accepted", 0))
        start = check_chains(h, c, ver, target, eagle[1], prompts[best], args.tokens)
        if args.drafter == "eagle-drafter":
            check_features(h, dr, start, target, prompts[best], args.tokens)
        kinds = [r["finished"]["stats"].get("drafter_kind", 0) for r in res]
        H.check(all(k == DRAFTER_KIND_EAGLE for k in kinds),
                "requests drafted by kinds %s, expected the verifier's head (%d) only" % (kinds, DRAFTER_KIND_EAGLE))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["tiny", "smollm", "gemma"], default="tiny")
    ap.add_argument("--drafter", choices=["model", "ngram", "local-ngram", "layers", "eagle", "eagle-drafter", "none"],
                    default="model")
    ap.add_argument("--arch", choices=sorted(H.TINY_ARCHS), help="tiny: target and draft of this architecture")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--adaptive", action="store_true", help="adaptive K (default: K fixed at 4)")
    ap.add_argument("--hf", action="store_true", help="serve the target as a Hugging Face directory")
    ap.add_argument("--warmup", type=int, default=0, help="verifier and model drafter --warmup N")
    a = ap.parse_args()
    H.main(lambda h: run(h, a))
