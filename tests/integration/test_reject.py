"""The rejection rule through the service (Sampling.rule, specd-coordinator
--verify-rule). The coordinator runs with --verify-rule rejection, so
requests that name no rule are verified by rejection sampling (accept
min(1, p/q), replace from norm(max(0, p - q)), drafts drawn from the
drafter's q); tiny random models, self-draft drafter, adaptive K.

- Exactness: N seeded requests of one prompt at temperature 1.0 and top-k
  6 under the service's rule (seeds N..2N-1) against N target-only
  requests (max_k -1, seeds 0..N-1): for each of the first TOKENS positions
  a two-sample chi-square test of homogeneity (cells under MIN_CELL pooled)
  must not reject at SIGNIFICANCE; drafts must have been verified and some
  accepted.
- The per-request choice: the same seeds with rule = coupled give exactly
  the target-only tokens (the coupled rule's seeded output is plain
  decoding's), while under the service's default some differ (the rule
  in effect is not the coupled one).
- Greedy requests are unchanged: equal to target-only greedy output.
- Control (the chi-square test can fail): target-only requests at
  temperature 0.5 against the temperature-1.0 ones must be rejected."""
import harness as H

from scipy.stats import chi2_contingency

N, TOKENS, SIGNIFICANCE, MIN_CELL = 1000, 4, 1e-3, 10
CHUNK = 100  # requests in flight at once


def run_all(c, jobs):
    out = []
    for i in range(0, len(jobs), CHUNK):
        out += c.run(jobs[i:i + CHUNK], timeout=600)
    for i, r in enumerate(out):
        H.check(not r["error"] and len(r["ids"]) == TOKENS, "request %d: %s" % (i, r["error"] or r["ids"]))
    return out


def homogeneity(a, b, pos):
    """p-value of a two-sample chi-square test of the tokens at pos."""
    ca, cb = {}, {}
    for r in a:
        ca[r["ids"][pos]] = ca.get(r["ids"][pos], 0) + 1
    for r in b:
        cb[r["ids"][pos]] = cb.get(r["ids"][pos], 0) + 1
    rows, pool = [], [0, 0]
    for t in set(ca) | set(cb):
        x, y = ca.get(t, 0), cb.get(t, 0)
        if x + y < MIN_CELL:
            pool[0] += x
            pool[1] += y
        else:
            rows.append([x, y])
    if sum(pool) > 0:
        rows.append(pool)
    if len(rows) < 2:
        return 1.0
    return chi2_contingency(rows, correction=False)[1]


def run(h):
    target, _ = h.tiny_models(seed=3)
    h.start_service(target, drafter="layers", coord_extra=["--verify-rule", "rejection"])
    c = h.client()
    prompt = H.random_prompts(1, seed=11)[0]

    def jobs(seeds, temperature=1.0, **extra):
        return [dict(prompt=prompt, max_tokens=TOKENS, ignore_eos=True,
                     sampling=dict(dict(temperature=temperature, top_k=6, seed=s), **extra.get("samp", {})),
                     **{k: v for k, v in extra.items() if k != "samp"}) for s in seeds]

    plain = run_all(c, jobs(range(N), max_k=-1))
    rej = run_all(c, jobs(range(N, 2 * N)))
    drafted = sum(r["finished"]["stats"].get("drafted", 0) for r in rej)
    accepted = sum(r["finished"]["stats"].get("accepted", 0) for r in rej)
    H.check(drafted > 0 and accepted > 0, "rejection rule: drafted %d, accepted %d" % (drafted, accepted))
    H.log("rejection rule: drafted %d, accepted %d (%.3f)" % (drafted, accepted, accepted / drafted))
    for pos in range(TOKENS):
        pv = homogeneity(plain, rej, pos)
        H.log("position %d: rejection rule against target-only sampling, p %.3g" % (pos + 1, pv))
        H.check(pv >= SIGNIFICANCE, "position %d: the rejection rule's tokens do not follow the target's "
                "distribution (chi-square p %.3g < %g)" % (pos + 1, pv, SIGNIFICANCE))

    # The per-request rule: coupled = target-only, token for token; the
    # service's default (rejection) is not.
    m = 48
    coupled = run_all(c, jobs(range(m), samp=dict(rule=1)))
    H.expect_equal_ids(coupled, plain[:m], "seeded requests under the coupled rule (Sampling.rule = 1)")
    dflt = run_all(c, jobs(range(m)))
    H.check(any(d["ids"] != p["ids"] for d, p in zip(dflt, plain[:m])),
            "%d seeded requests under --verify-rule rejection all equal target-only sampling: "
            "the service's rule is not applied" % m)
    drafted = sum(r["finished"]["stats"].get("drafted", 0) for r in coupled)
    H.check(drafted > 0, "no draft was verified under the coupled rule")

    # Greedy requests ignore the rule.
    gp = H.random_prompts(16, seed=12)
    greedy = [dict(prompt=p, max_tokens=16, ignore_eos=True) for p in gp]
    g_spec = c.run(greedy + [dict(j, sampling=dict(temperature=0, rule=2)) for j in greedy], timeout=600)
    g_plain = c.run([dict(j, max_k=-1) for j in greedy], timeout=600)
    H.expect_equal_ids(g_spec[:16], g_plain, "greedy requests under --verify-rule rejection")
    H.expect_equal_ids(g_spec[16:], g_plain, "greedy requests naming the rejection rule")

    # Control: the test tells temperature 0.5 from 1.0.
    cold = run_all(c, jobs(range(2 * N, 3 * N), temperature=0.5, max_k=-1))
    pv = min(homogeneity(plain, cold, pos) for pos in range(TOKENS))
    H.log("control: temperature 0.5 against 1.0, smallest p %.3g" % pv)
    H.check(pv < SIGNIFICANCE, "control: the chi-square test cannot tell temperature 0.5 from 1.0 (p %.3g)" % pv)


if __name__ == "__main__":
    H.main(run)
