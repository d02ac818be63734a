"""The prefix cache through the service: warm equals cold. Requests that
share prefixes with earlier ones (a common opening cut at and off block
boundaries, a conversation that grows turn by turn, the same prompt again)
run one after another on a service whose verifier and model drafter keep a
prefix cache (the default), and on a service without one (--prefix-cache
0): every request's tokens must be the same, greedy and seeded, with each
drafter kind (self-draft, draft model, n-gram, and with --drafter eagle an
EAGLE-3 head in the verifier). The cached service must have hit its cache
(WorkerStats.prefix_hit_tokens), or the test proves nothing. With the head,
the adopted blocks' rows are never computed, so their features must come
with the blocks: the head must draft, context by context, the very chains
it drafts without the cache (its DEBUG lines, in order), and each request's
drafted and accepted counts must be equal; greedy outputs must equal
specd-generate --eagle's.
Then a verifier is SIGKILLed while running requests share cached blocks and
is replaced: nothing is lost and every output still equals specd-generate's.
With --tp N the verifier is a tensor-parallel group of N CPU ranks (the
ranks write and read the leader's block ids, adopted ones included) and the
drafter the n-gram one: warm equals cold, with hits, greedy and seeded; with
--tp N --drafter eagle the head runs in the group's leader and the head's
checks above hold there too (its features of adopted rows come from the
leader's side rows; the greedy outputs equal specd-generate --eagle's).
With --window the target is a random Gemma 3 (5 windowed layers of 7, a
window of 12 tokens) and the draft model a 1-layer one with a window: their
caches keep a window group, whose cached blocks keep their window blocks
(engine/kv_window.c), and the same checks run with every drafter kind.
Tiny random models (a model's K/V do not depend on the batch or the
chunking: the exactness the cache relies on)."""
import argparse
import json
import os
import signal
import subprocess
import threading
import time

import harness as H
from test_greedy import chains_of, eagle_head
from test_verifier_restart import replace_verifier

TOKENS = 12


def jobs():
    base = H.random_prompts(1, seed=21, words=None)[0]
    base = " ".join([base] * 6)  # a long common opening
    words = base.split()
    out = [base]
    for cut in (len(words) // 2, len(words) // 2 + 1, len(words) - 3):
        out.append(" ".join(words[:cut]) + " river stone light")
    turn = base
    for t in range(3):  # a conversation: each turn extends the last
        turn = turn + " then %d sky over green hill" % t
        out.append(turn)
    out.append(base)  # the same prompt again
    js = []
    for i, p in enumerate(out):
        js.append(dict(prompt=p, max_tokens=TOKENS, ignore_eos=True))
        js.append(dict(prompt=p, max_tokens=TOKENS, ignore_eos=True,
                       sampling=dict(temperature=0.9, top_p=0.95, seed=300 + i)))
    return js


CHUNK = 32  # --prefill-chunk of the plain drafters' services: the prompts take several


def serve_all(h, target, draft, drafter, cache, head=None):
    """Every job, one after another; with head, the verifier drafts with it
    (at -v: its chains in the log) and K is fixed, so that the steps, and
    the chains they draft, do not depend on timing. Without head the
    coordinator's step budget is CHUNK tokens (at -v: its steps in the log),
    so a prompt goes in prefill chunks unless the coordinator expects the
    verifier to adopt its start (sched_dispatch.c: hinted), and a cached
    prompt's adopted rows then come in a normal step: checked below."""
    extra = () if cache else ("--prefix-cache", "0")
    ver_extra = extra + (("--eagle", head, "-v") if head else ())
    coord_extra = H.FIXED_K if head else ("--prefill-chunk", str(CHUNK), "-v")
    coord, ver, _ = h.start_service(target, drafter=None if head else drafter, draft=draft, verifier_extra=ver_extra,
                                    drafter_extra=extra, coord_extra=coord_extra)
    c = h.client()
    res = []
    for i, j in enumerate(jobs()):  # one after another: earlier ones are cached
        res.append(c.run([j], timeout=300)[0])
        if i == 0 and cache and not head:  # the coordinator trusts its record once heartbeats report lookups
            H.wait_until(lambda: looked_up(c) > 0, 10, "the verifier's heartbeat to report prefix lookups")
    for i, r in enumerate(res):
        H.check(not r["error"] and len(r["ids"]) == TOKENS, "request %d: %s" % (i, r["error"] or r["ids"]))

    def hits():  # from the workers' heartbeats: wait a few for the last requests to show
        st = c.stats() or {}
        return sum(int((w.get("stats") or {}).get("prefix_hit_tokens", 0)) for w in st.get("workers", []))

    n_hit = hits()
    for _ in range(20):
        if n_hit or not cache:
            break
        time.sleep(0.25)
        n_hit = hits()
    c.close()
    h.kill_all()
    if head:
        with open(ver.logpath, errors="replace") as f:
            return res, n_hit, chain_lines(f.readlines())
    with open(coord.logpath, errors="replace") as f:
        big = longest_normal_step(f.readlines())
    # a normal step carries at most CHUNK prompt tokens and drafts (SD_MAX_K
    # 32) unless it carries a prompt whose cached start is not charged
    H.check(big > CHUNK + 32 if cache else big <= CHUNK + 32,
            "drafter %s, cache %s: the longest normal verify step carried %d tokens" % (drafter, cache, big))
    return res, n_hit


def longest_normal_step(lines):
    """The most tokens a normal (not prefill-only) verify step carried, from
    the coordinator's -v lines."""
    import re
    steps = [re.search(r"verify step \d+: \d+ seqs, (\d+) tokens(.*)", ln) for ln in lines]
    return max([int(m.group(1)) for m in steps if m and "prefill only" not in m.group(2)] + [0])


def serve_tp(h, target, cache, tp, head=None):
    """Every job, one after another, on a TP group of tp ranks with the
    n-gram drafter, or with head in the leader (K fixed, its chains read
    from the leader's log): (results, prompt tokens hit[, chains])."""
    from test_tp import start_ranks
    h.start_coordinator(target, H.FIXED_K if head else ())
    h.group_addr = "tcp://127.0.0.1:%d" % H.free_port()
    extra = () if cache else ("--prefix-cache", "0")
    leader = start_ranks(h, target, tp, "split", [0], extra + (("--eagle", head, "-v") if head else ()))[0]
    start_ranks(h, target, tp, "split", range(1, tp), extra)
    if not head:
        h.start_drafter("ngram", extra=["-t", "1"])
    h.wait_registered(drafter=True)
    c = h.client()
    res = [c.run([j], timeout=300)[0] for j in jobs()]
    for i, r in enumerate(res):
        H.check(not r["error"] and len(r["ids"]) == TOKENS, "TP %d, request %d: %s" % (tp, i, r["error"] or r["ids"]))
    n_hit = hit_tokens(c)
    for _ in range(20):
        if n_hit or not cache:
            break
        time.sleep(0.25)
        n_hit = hit_tokens(c)
    c.close()
    h.kill_all()
    if head:
        with open(leader.logpath, errors="replace") as f:
            return res, n_hit, chain_lines(f.readlines())
    return res, n_hit


def chain_lines(lines):
    """The head's drafted chains in the order drafted: [(context, drafts)]."""
    return [next(iter(chains_of([ln]).items())) for ln in lines if chains_of([ln])]


def counts(res):
    return [(r["finished"]["stats"].get("drafted", 0), r["finished"]["stats"].get("accepted", 0)) for r in res]


def eagle(h, target, head=None, tp=1):
    """The EAGLE-3 head in the verifier (the leader of a TP group of tp
    ranks), with and without the prefix cache (head: a trained one for
    target; None: a random one for the tiny model)."""
    greedy = [j for j in jobs() if "sampling" not in j]
    if not head:
        head = eagle_head(h, [h.reference(target, j["prompt"], TOKENS, ignore_eos=True) for j in greedy])
    if tp > 1:
        cold, cold_hits, cold_chains = serve_tp(h, target, False, tp, head)
        warm, warm_hits, warm_chains = serve_tp(h, target, True, tp, head)
    else:
        cold, cold_hits, cold_chains = serve_all(h, target, None, None, cache=False, head=head)
        warm, warm_hits, warm_chains = serve_all(h, target, None, None, cache=True, head=head)
    H.expect_equal_ids(warm, cold, "EAGLE head: with the prefix cache against without")
    H.check(cold_hits == 0, "EAGLE head: the service without a cache reports %d hit tokens" % cold_hits)
    H.check(warm_hits > 0, "EAGLE head: the cache was never hit: the test proves nothing")
    # specd-generate --eagle on the greedy prompts (plain greedy's tokens, under the coupled rule)
    alone = []
    for j in greedy:
        g = subprocess.run([h.bin("generate"), "-m", target, "-p", j["prompt"], "-n", str(TOKENS), "--ignore-eos",
                            "--json", "-t", "1", "--eagle", head, "-k", "4"] + h.engine_args, capture_output=True,
                           timeout=600)
        H.check(g.returncode == 0, "specd-generate --eagle failed: %s" % g.stderr[-2000:])
        alone.append(json.loads(g.stdout.decode("utf-8", "surrogateescape")))
    H.expect_equal_ids([r for r, j in zip(warm, jobs()) if "sampling" not in j], alone,
                       "EAGLE head with the prefix cache against specd-generate --eagle")
    # the control: adopted rows without their features would draft nothing
    # (or other chains) at the first steps after a hit
    drafted = sum(d for d, _ in counts(warm))
    H.check(drafted > 0 and warm_chains, "EAGLE head: nothing was drafted: the test proves nothing")
    H.check(counts(warm) == counts(cold), "EAGLE head: (drafted, accepted) per request with the cache %s, "
            "without %s" % (counts(warm), counts(cold)))
    diff = next((i for i, (a, b) in enumerate(zip(warm_chains, cold_chains)) if a != b), None)
    H.check(len(warm_chains) == len(cold_chains) and diff is None,
            "EAGLE head: %d chains drafted with the cache, %d without; first difference at %s: %s vs %s"
            % (len(warm_chains), len(cold_chains), diff, warm_chains[diff] if diff is not None else None,
               cold_chains[diff] if diff is not None else None))
    H.log("EAGLE head: %d requests equal with and without the cache (%d prompt tokens hit), the same %d chains "
          "drafted (%d tokens, %d accepted)" % (len(warm), warm_hits, len(warm_chains), drafted,
                                                sum(a for _, a in counts(warm))))


def looked_up(c):
    st = c.stats(timeout=1.0) or {}
    return sum(int((w.get("stats") or {}).get("prefix_query_tokens", 0)) for w in st.get("workers", []))


def hit_tokens(c):
    st = c.stats(timeout=1.0) or {}
    return sum(int((w.get("stats") or {}).get("prefix_hit_tokens", 0)) for w in st.get("workers", []))


def killed_while_shared(h, target):
    """Four requests that adopt one cached opening run at once; once each has
    streamed, and the verifier has reported hits, it is SIGKILLed and
    replaced. Every output must equal specd-generate's. Hits reach the
    coordinator with the verifier's heartbeat (every 250 ms), so requests
    that finish first leave nothing to kill: then the same runs again with
    longer answers."""
    base = " ".join([H.random_prompts(1, seed=23, words=None)[0]] * 6)
    prompts = [base + " and then %s" % w for w in ("river", "stone", "light", "cloud")]
    _, verifier, _ = h.start_service(target, drafter="layers", coord_extra=H.FIXED_K)
    c = h.client()
    c.run([dict(prompt=base, max_tokens=2, ignore_eos=True)], timeout=300)  # caches the opening
    for n in (128, 512, 1024):
        refs = [h.reference(target, p, n, ignore_eos=True) for p in prompts]
        res, state = kill_during(h, c, verifier, prompts, n)
        if "killed" in state:
            break
        H.expect_equal_ids(res, refs, "unkilled %d-token run" % n)
        H.log("the %d-token requests finished before the verifier reported hits: again with longer answers" % n)
    H.check("killed" in state, "the requests finished before the verifier could be killed, at 1024 tokens too")
    H.expect_equal_ids(res, refs, "after a verifier SIGKILL while requests shared cached blocks")
    H.log("verifier SIGKILLed with %d prompt tokens hit, replaced: %d outputs of %d tokens equal specd-generate's" %
          (state["hits"], len(res), n))
    c.close()


def kill_during(h, c, verifier, prompts, n):
    """Runs prompts (n tokens each) and SIGKILLs and replaces the verifier
    once each has streamed and hits are reported, unless they finish first.
    Returns the results and what happened ("killed", "hits")."""
    state, done, over = {}, threading.Event(), threading.Event()

    def restart():
        try:
            w = h.client()
            H.wait_until(lambda: over.is_set() or hit_tokens(w) > 0, 30, "the verifier to report prefix cache hits")
            hits = hit_tokens(w)
            w.close()
            if over.is_set():
                return
            state["hits"] = hits
            replace_verifier(h, verifier, signal.SIGKILL)
            state["killed"] = True
        except Exception as e:  # reported below
            state["error"] = e
        done.wait(600)  # the thread that started the new verifier must outlive it

    def on_event(m, results):
        if "thread" not in state and all(r["ids"] for r in results.values()):
            state["thread"] = threading.Thread(target=restart)
            state["thread"].start()

    jobs = [dict(prompt=p, max_tokens=n, ignore_eos=True) for p in prompts]
    try:
        res = c.run(jobs, timeout=300, on_event=on_event)
        over.set()
        if "thread" in state and "killed" not in state:
            state["thread"].join(60)
        H.check("error" not in state, "killing and replacing the verifier failed: %s" % state.get("error"))
    finally:
        over.set()
        h.cleanups.append(done.set)
    return res, state


def window_models(h):
    """A random Gemma 3 target whose windowed layers see 12 tokens, and a
    1-layer windowed draft with its tokenizer."""
    target, draft = os.path.join(h.tmp, "gemma.gguf"), os.path.join(h.tmp, "gemma-draft.gguf")
    subprocess.run([h.bin("mkmodel"), "-o", target, "--arch", "gemma3", "--dim", "64", "--layers", "7",
                    "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--ff", "128", "--window", "12",
                    "--vocab", "512", "--tied", "--seed", "27"], check=True, capture_output=True)
    subprocess.run([h.bin("mkmodel"), "-o", draft, "--arch", "gemma3", "--dim", "32", "--layers", "1",
                    "--heads", "2", "--kv-heads", "1", "--head-dim", "32", "--ff", "64", "--window", "12", "--tied",
                    "--tokenizer-from", target, "--seed", "28"], check=True, capture_output=True)
    return target, draft


def run(h, args):
    if args.head:  # by hand: a trained head on the demo model (tools/train-eagle)
        eagle(h, h.smollm(), args.head)
        return
    target, draft = window_models(h) if args.window else h.tiny_models(seed=5)
    if args.drafter == "eagle":
        eagle(h, target, tp=args.tp)
        return
    if args.tp > 1:
        cold, cold_hits = serve_tp(h, target, False, args.tp)
        warm, warm_hits = serve_tp(h, target, True, args.tp)
        H.expect_equal_ids(warm, cold, "TP %d: with the prefix cache against without" % args.tp)
        H.check(cold_hits == 0, "TP %d: the group without a cache reports %d hit tokens" % (args.tp, cold_hits))
        H.check(warm_hits > 0, "TP %d: the cache was never hit: the test proves nothing" % args.tp)
        H.log("TP %d: %d requests equal with and without the cache (%d prompt tokens hit)" %
              (args.tp, len(warm), warm_hits))
        return
    for drafter in ("layers", "model", "ngram"):
        cold, cold_hits = serve_all(h, target, draft, drafter, cache=False)
        warm, warm_hits = serve_all(h, target, draft, drafter, cache=True)
        H.expect_equal_ids(warm, cold, "drafter %s: with the prefix cache against without" % drafter)
        H.check(cold_hits == 0, "drafter %s: the service without a cache reports %d hit tokens" % (drafter, cold_hits))
        H.check(warm_hits > 0, "drafter %s: the cache was never hit: the test proves nothing" % drafter)
        H.log("drafter %s: %d requests equal with and without the cache (%d prompt tokens hit)" %
              (drafter, len(warm), warm_hits))
    if not args.window:
        killed_while_shared(h, target)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", choices=["all", "eagle"], default="all",
                    help="all: self-draft, draft model and n-gram drafters, then a verifier killed while blocks are "
                         "shared; eagle: an EAGLE-3 head in the verifier")
    ap.add_argument("--head", help="with --drafter eagle: a trained head for the demo model (SmolLM2-135M-Instruct) "
                                   "instead of a random head on the tiny one")
    ap.add_argument("--tp", type=int, default=1, help="a TP group of this many CPU ranks (n-gram drafter, or the "
                                                      "head in its leader with --drafter eagle)")
    ap.add_argument("--window", action="store_true", help="sliding-window models (Gemma 3, a window of 12)")
    a = ap.parse_args()
    H.main(lambda h: run(h, a))
