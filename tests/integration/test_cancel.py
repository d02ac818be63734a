"""Client cancel and client disconnect free the request's KV blocks on the
drafter and the verifier. Block counts come from `specd-client --stats
--json` (the coordinator's ServiceStats.workers, fed by worker heartbeats),
polled with a bound. Four long requests: two are cancelled (each Finished
with reason CANCELLED or an Error CANCELLED), the client of the other two
goes silent (socket closed: no heartbeats), which the coordinator must treat
as gone. Tiny random models, self-draft drafter (it holds KV too)."""
import harness as H


def worker_blocks(h, pump=None):
    """{role: (free, total, n_sequences)} of the alive workers."""
    out = {}
    st = h.cli_stats(pump=pump)
    for w in st.get("workers", []):
        if not w.get("alive", True):
            continue
        role = str(w.get("role", "")).lower()
        s = w.get("stats", w)
        key = "verifier" if "verif" in role or role == "3" else "drafter" if "draft" in role or role == "2" else role
        out[key] = (s.get("kv_blocks_free"), s.get("kv_blocks_total"), s.get("n_sequences"))
    return out


def run(h):
    # Long-lived requests: a 4096-token context, generations of 3500 tokens.
    target, _ = h.tiny_models(seed=13, ctx=4096)
    h.start_service(target, drafter="layers", coord_extra=H.FIXED_K,
                    drafter_extra=["--max-ctx", "4096", "--max-seqs", "8"])
    base = H.wait_until(lambda: (lambda b: b if {"verifier", "drafter"} <= set(b) else None)(worker_blocks(h)),
                        30, "both workers in specd-client --stats --json")
    H.log("idle blocks: %s" % base)
    for role in ("verifier", "drafter"):
        H.check(base[role][0] == base[role][1], "%s holds blocks while idle: %s" % (role, base[role]))
    prompts = H.random_prompts(4, seed=41)
    jobs = [dict(prompt=p, max_tokens=3500, ignore_eos=True) for p in prompts]
    keep = h.client()     # cancels its two requests
    gone = h.client()     # goes silent
    ids = {}

    def collect(cl, n):
        for j in (jobs[:2] if cl is keep else jobs[2:]):
            cl.submit(**j)
        got = []
        while len(got) < n:
            m = cl.recv(30)
            H.check(m is not None, "no Accepted within 30 s")
            if "accepted" in m:
                got.append(m["accepted"]["request_id"])
            H.check("error" not in m, "unexpected error %s" % m.get("error"))
        return got

    ids["keep"] = collect(keep, 2)
    ids["gone"] = collect(gone, 2)

    ends = {}

    def pump():
        # Keep both clients heartbeating and read their streams.
        for cl in (keep, gone):
            if cl.sock.closed:
                continue
            m = cl.recv(0.01)
            if m and "finished" in m:
                f = m["finished"]
                H.check(f["request_id"] in ids["keep"], "a long request finished on its own: %s" % f)
                ends[f["request_id"]] = H.pb.STOP_REASON.get(f.get("reason"), f.get("reason"))
            if m and "error" in m:
                e = m["error"]
                H.check(e.get("request_id") in ids["keep"], "unexpected error %s" % e)
                ends[e["request_id"]] = H.pb.CODE.get(e.get("code"))

    busy = H.wait_until(lambda: (lambda b: b if all(b.get(r, (0, 0, 0))[2] >= 4 and b[r][0] < b[r][1]
                                                    for r in ("verifier", "drafter")) else None)(worker_blocks(h, pump)),
                        60, "the four requests to hold KV blocks on both workers")
    H.log("busy blocks: %s" % busy)
    for rid in ids["keep"]:
        keep.send({"cancel": {"request_id": rid}})
    gone.close()  # no more heartbeats: the coordinator must cancel its requests after the liveness period

    def cancelled():
        pump()
        return len(ends) == 2
    H.wait_until(cancelled, 20, "Finished/Error for both cancelled requests")
    H.check(all(v == "CANCELLED" for v in ends.values()), "cancelled requests ended with %s" % ends)
    H.wait_until(lambda: (lambda b: all(b.get(r, (0, 1, 1))[0] == b[r][1] and b[r][2] == 0
                                        for r in ("verifier", "drafter")))(worker_blocks(h, pump)),
                 30, "every KV block to be free again on verifier and drafter")
    H.log("all blocks free again: %s" % worker_blocks(h))
    # The service still serves.
    r = h.client().run([dict(prompt="after cancel", max_tokens=8, ignore_eos=True)], timeout=120)[0]
    H.check(not r["error"] and len(r["ids"]) == 8, "request after the cancels failed: %s" % r)


if __name__ == "__main__":
    H.main(run)
