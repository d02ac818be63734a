"""Seeded sampled requests reproduce their output exactly, alone and under
load: each request (temperature 0.8, top-p 0.95, its own seed) is first run
alone through the service, then all of them at once mixed with greedy
requests and with a second copy of each seeded request; every copy must
give the same tokens as the lone run; adaptive K is on (a sampled request's
K follows only its own acceptance, not the load, so its draws cannot
depend on the batch), and drafts must have been verified. Tiny random
models, self-draft drafter (speculative sampling must not change the
draws). A control makes sure the test can fail: two different seeds of the
same prompt do not all give the same output."""
import harness as H

N, TOKENS = 12, 32


def run(h):
    target, _ = h.tiny_models(seed=3)
    h.start_service(target, drafter="layers")
    c = h.client()
    prompts = H.random_prompts(N, seed=11)
    samp = [dict(temperature=0.8, top_p=0.95, seed=1000 + i) for i in range(N)]
    jobs = [dict(prompt=p, max_tokens=TOKENS, ignore_eos=True, sampling=s) for p, s in zip(prompts, samp)]
    alone = [c.run([j], timeout=300)[0] for j in jobs]
    for i, r in enumerate(alone):
        H.check(not r["error"] and len(r["ids"]) == TOKENS, "lone request %d: %s" % (i, r["error"] or r["ids"]))
    # Target-only copies (max_k -1) too: when they hold and the
    # speculative ones do not, the draws depend on the draft schedule (K).
    plain = [dict(j, max_k=-1) for j in jobs]
    alone_plain = [c.run([j], timeout=300)[0] for j in plain]
    greedy = [dict(prompt=p, max_tokens=TOKENS, ignore_eos=True) for p in H.random_prompts(N, seed=12)]
    load = jobs + greedy + jobs + plain
    res = c.run(load, timeout=600)
    H.expect_equal_ids(res[3 * N:], alone_plain, "seeded target-only requests (max_k -1) under load")
    H.expect_equal_ids(res[:N], alone, "seeded speculative requests under load (first copies)")
    H.expect_equal_ids(res[2 * N:3 * N], alone, "seeded speculative requests under load (second copies)")
    # Adaptive K (the coordinator's default) must have speculated on them, or
    # the test proves nothing: a sampled request's K ignores the load.
    drafted = sum(r["finished"]["stats"].get("drafted", 0) for r in res[:N])
    H.check(drafted > 0, "no draft was verified for the seeded requests under load")
    # Control: another seed changes something.
    other = c.run([dict(jobs[i], sampling=dict(samp[i], seed=5000 + i)) for i in range(N)], timeout=300)
    H.check(any(o["ids"] != a["ids"] for o, a in zip(other, alone)),
            "different seeds gave identical outputs for all %d prompts: sampling ignores the seed" % N)
    H.log("%d seeded requests reproduced alone and under load" % N)


if __name__ == "__main__":
    H.main(run)
