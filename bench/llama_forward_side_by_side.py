#!/usr/bin/env python3
"""Plain decoding, specd against llama.cpp, on the same GGUF files.

Usage: llama_forward_side_by_side.py MODEL.gguf... [--threads 2] [--cpus 0-1]
           [--prompt-len 512] [--decode 64] [--rounds 5] [--max-other-load 0.25]
           [--specd-generate build/tools/specd-generate] [--specd-base OLD/specd-generate] [--out FILE]

For every file, --rounds rounds, in one run; each round times, in an order
that alternates (ABBA), llama.cpp and specd on:
  - a prompt of --prompt-len tokens (prompt tokens/s: the prefill call);
  - --decode greedy tokens after it, one token per call (decode tokens/s:
    the tokens decoded over the time of the calls that decoded them).
llama.cpp runs in this process through llama-cpp-python (the model loaded
once per file; n_batch = n_ubatch = the prompt length, so the prompt is one
call as it is in specd); specd is `specd-generate --json` (its own prefill
and decode timings; the model load is not in them). The prompt is a fixed
English text cut to the same token count for both (each program tokenizes
it; the table says the counts). Both run on the same CPUs with the same
thread count (bench_common.pin). A ratio is the median over rounds of
specd / llama.cpp within the round.

Hygiene: around every timed run the CPU time of other processes is sampled
(bench_common.Hyg); rounds in which any run saw more than --max-other-load
cores are left out of the medians while some remain; the table gives the
shares and the count left out.

Needs llama-cpp-python (pip; it builds llama.cpp from source) and a Release
build of specd."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import Hyg, cpu_name, pin  # noqa: E402

TEXT = ("The history of the lighthouse begins with fires lit on hilltops to guide ships into harbour. "
        "Over centuries the fires became towers, the towers gained lenses, and the keepers who tended them "
        "wrote logs of every storm, every wreck and every ship that passed safely in the night. ")


def prompt_text(tokenize, n):
    """TEXT repeated until it holds at least n tokens, cut back to about n
    by whole words; returns the text and its token count."""
    text = TEXT
    while len(tokenize(text)) < n:
        text += TEXT
    words = text.split(" ")
    while len(words) > 1 and len(tokenize(" ".join(words[:-1]))) >= n:
        words.pop()
    text = " ".join(words)
    return text, len(tokenize(text))


def llama_run(llm, ids, n_decode):
    """Prefill ids in one call, then n_decode greedy tokens one per call;
    returns (prompt tok/s, decode tok/s, other-CPU share)."""
    import numpy as np

    n_vocab = llm.n_vocab()

    def last():
        # the last evaluated token's logits, straight from the context
        # (llama-cpp-python >= 0.3 keeps Llama.scores only with logits_all,
        # which would put the LM head on every prompt row)
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))

    llm.reset()
    with Hyg() as h:
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        tok = last()
        t2 = time.perf_counter()
        for _ in range(n_decode):
            llm.eval([tok])
            tok = last()
        t3 = time.perf_counter()
    return len(ids) / (t1 - t0), n_decode / (t3 - t2), h.other


def specd_run(exe, model, text, n_decode, threads, qpath=""):
    cmd = [exe, "-m", model, "-p", text, "-n", str(n_decode + 1), "-t", str(threads), "--json", "--temp", "0",
           "--ignore-eos"] + (["--cpu-qpath", qpath] if qpath else [])
    with Hyg() as h:
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    t = json.loads(r.stdout)["timings"]
    return t["prompt_tok_s"], t["decode_tok_s"], h.other, t["prompt_tokens"], t["decode_tokens"]


def bench_file(a, model, out):
    from llama_cpp import Llama

    n_ctx = a.prompt_len + a.decode + 16
    llm = Llama(model_path=model, n_threads=a.threads, n_threads_batch=a.threads, n_ctx=n_ctx,
                n_batch=a.prompt_len, n_ubatch=a.prompt_len, verbose=False)
    tokenize = lambda s: llm.tokenize(s.encode(), add_bos=False, special=False)  # noqa: E731
    text, n_llama = prompt_text(tokenize, a.prompt_len)
    ids = tokenize(text)
    bos = llm.token_bos()
    if llm.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true" and bos >= 0:
        ids = [bos] + ids
    # specd rows: (label, executable, --cpu-qpath); --specd-base adds the build before a change
    rows = [(q, a.specd_generate, q) for q in (a.specd_qpath.split(",") if a.specd_qpath else [""])]
    if a.specd_base:
        rows.append(("base", a.specd_base, ""))
    labels = [r[0] for r in rows]
    rounds = []
    for r in range(a.rounds):
        res = {}
        order = ["llama"] + labels if r % 2 == 0 else labels[::-1] + ["llama"]
        for who in order:
            if who == "llama":
                res["llama"] = llama_run(llm, ids, a.decode)
            else:
                _, exe, q = rows[labels.index(who)]
                res[who] = specd_run(exe, model, text, a.decode, a.threads, q)
        rounds.append(res)
        print(f"{os.path.basename(model)}: round {r + 1} of {a.rounds}", file=sys.stderr)
    del llm
    for q in labels:
        file_line(a, model, ids, [{"llama": x["llama"], "specd": x[q]} for x in rounds], q, out)


def file_line(a, model, ids, rounds, qpath, out):
    clean = [x for x in rounds if max(x["llama"][2], x["specd"][2]) <= a.max_other_load]
    used = clean or rounds
    med = lambda v: statistics.median(v)  # noqa: E731
    lp, ld = med([x["llama"][0] for x in used]), med([x["llama"][1] for x in used])
    sp, sd = med([x["specd"][0] for x in used]), med([x["specd"][1] for x in used])
    rp = med([x["specd"][0] / x["llama"][0] for x in used])
    rd = med([x["specd"][1] / x["llama"][1] for x in used])
    others = [x["llama"][2] for x in rounds] + [x["specd"][2] for x in rounds]
    n_specd = rounds[0]["specd"][3]
    mb = os.path.getsize(model) / 1e6
    name = os.path.basename(model) + (f" ({qpath})" if qpath else "")
    line = (f"| {name} | {mb:.0f} | {len(ids)} / {n_specd} | {lp:.1f} | {sp:.1f} | **{rp:.2f}x** | "
            f"{ld:.1f} | {sd:.1f} | **{rd:.2f}x** | {med(others):.2f} / {max(others):.2f} | "
            f"{len(rounds) - len(clean)} of {len(rounds)}{'' if clean else ' (all kept: none clean, unreliable)'} |")
    print(line)
    if out:
        out.write(line + "\n")
        out.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpus", default="", help="CPU list both programs run on (default: the first --threads)")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-other-load", type=float, default=0.25)
    ap.add_argument("--specd-generate", default="build/tools/specd-generate")
    ap.add_argument("--specd-qpath", default="", help="comma-separated --cpu-qpath values: one specd row "
                    "each, run in the same rounds (default: the path this CPU picks)")
    ap.add_argument("--specd-base", default="", help="a second specd-generate (the build before a change): one "
                    "more row, labelled (base), run in the same rounds")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    cpus = pin(a.cpus, a.threads)
    out = open(a.out, "a") if a.out else None
    head = (f"CPU: {cpu_name()}; both programs on CPUs {cpus} (process affinity, {a.threads} threads each, no thread "
            f"pinned to one core); prompt {a.prompt_len} tokens, then {a.decode} greedy tokens one per call; "
            f"{a.rounds} rounds, ABBA; rounds with other processes over {a.max_other_load} cores left out.\n\n"
            "| file | MB | prompt tokens llama.cpp / specd | llama.cpp prompt tok/s | specd prompt tok/s | specd / "
            "llama.cpp | llama.cpp decode tok/s | specd decode tok/s | specd / llama.cpp | other CPU, cores: median "
            "/ max | rounds left out |\n|---|---|---|---|---|---|---|---|---|---|---|")
    print(head)
    if out:
        out.write(head + "\n")
    for m in a.models:
        bench_file(a, m, out)


if __name__ == "__main__":
    main()
