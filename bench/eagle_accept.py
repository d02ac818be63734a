"""eagle_accept.py — an EAGLE-3 head's acceptance per draft position and its
speed against plain decoding, single process (specd-generate), on the chat,
code-edit and summarization prompt sets, greedy and sampled under both
verification rules.

    .venv/bin/python bench/eagle_accept.py --model MODEL --head DIR [--k 3] [--n 96] [--prompts 4]
                                           [--rounds 2] [--temps 0.7,1.0] [--sets chat,code_edit,summarize]
                                           [--stop-at-eos] [--head-b DIR]

For each set (the first --prompts lines of bench/prompts/SET.txt), round
and prompt, interleaved in this order: plain greedy, the head greedy
(--eagle -k K), then per temperature T (seed = the round): plain, the head
under the coupled rule, the head under the rejection rule (--verify-rule).
Chat-formatted, 2 threads, --ignore-eos unless --stop-at-eos (with it
the answers end where the model ends them, as a user sees them: past the
end of an answer the model writes text no head trained on, which lowers
the measured acceptance; greedy and coupled runs still match plain token
for token). --head-b DIR adds a second head's greedy run after the first
(two heads side by side, interleaved). Per (set, mode): decode tok/s
(median), the median over (round, prompt) of the ratio to plain of the
same (round, prompt, temperature), tokens per target step, acceptance
(accepted / drafted), and acceptance per draft position given the ones
before (sd_spec_stats: accepted_at / reached_at, summed over the runs).
Under the coupled rule a seeded run's output equals plain's; the script
checks that, and that greedy with the head equals plain greedy.
"""
import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from eagle_cost import run  # noqa: E402  (one specd-generate --json runner)


def read_prompts(name, n):
    with open(os.path.join(HERE, "prompts", name + ".txt")) as f:
        lines = [ln.rstrip("\n").replace("\\n", "\n") for ln in f if ln.strip()]
    return lines[:n]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--gen", default=os.path.join(ROOT, "build", "tools", "specd-generate"))
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per set")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temps", default="0.7,1.0")
    ap.add_argument("--sets", default="chat,code_edit,summarize")
    ap.add_argument("--stop-at-eos", action="store_true", help="end answers at the end token (default: --ignore-eos)")
    ap.add_argument("--head-b", help="a second head, greedy, run after the first on each prompt")
    a = ap.parse_args()
    temps = [float(t) for t in a.temps.split(",") if t]
    head = ["--eagle", a.head, "-k", str(a.k)]
    modes = [("greedy", "plain", 0.0, []), ("greedy", "head", 0.0, head)]
    if a.head_b:
        modes.append(("greedy", "head B", 0.0, ["--eagle", a.head_b, "-k", str(a.k)]))
    for t in temps:
        modes += [(f"T {t}", "plain", t, []), (f"T {t}", "head, coupled", t, head + ["--verify-rule", "coupled"]),
                  (f"T {t}", "head, rejection", t, head + ["--verify-rule", "rejection"])]
    print(f"| set | sampling | mode | decode tok/s (median) | x plain (median) | tokens / step | acceptance | "
          f"acceptance at position 1..{a.k} given the ones before |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for set_name in a.sets.split(","):
        prompts = read_prompts(set_name, a.prompts)
        res = {(s, m): [] for s, m, _, _ in modes}  # (rate, ratio, spec)
        for rnd in range(a.rounds):
            for prompt in prompts:
                plain_rate, plain_ids = {}, {}
                for s, m, t, extra in modes:
                    samp = ["--temp", str(t), "--seed", str(rnd + 1)] if t > 0 else []
                    out = run(a.gen, a.model, prompt, a.n, a.threads, extra + samp, not a.stop_at_eos)
                    rate = out["timings"]["decode_tok_s"]
                    if m == "plain":
                        plain_rate[s], plain_ids[s] = rate, out["ids"]
                    elif (t == 0 or "coupled" in m) and out["ids"] != plain_ids[s]:
                        sys.exit(f"{set_name} / {s} / {m}: output differs from plain ({prompt[:40]!r})")
                    res[(s, m)].append((rate, rate / plain_rate[s], out.get("spec")))
        for s, m, _, _ in modes:
            rows = res[(s, m)]
            rate = statistics.median(r[0] for r in rows)
            ratio = statistics.median(r[1] for r in rows)
            specs = [r[2] for r in rows if r[2]]
            if not specs:
                print(f"| {set_name} | {s} | {m} | {rate:.1f} | {ratio:.3f}x | 1.00 | - | - |")
                continue
            steps = sum(x["target_steps"] for x in specs)
            drafted = sum(x["drafted"] for x in specs)
            acc = sum(x["accepted"] for x in specs)
            per = []
            for i in range(a.k):
                reached = sum(x["per_position"][i][1] for x in specs if len(x["per_position"]) > i)
                took = sum(x["per_position"][i][2] for x in specs if len(x["per_position"]) > i)
                per.append(f"{took / reached:.2f}" if reached else "-")
            tps = (acc + steps) / steps if steps else 0
            print(f"| {set_name} | {s} | {m} | {rate:.1f} | {ratio:.3f}x | {tps:.2f} | "
                  f"{acc / drafted if drafted else 0:.3f} | {' / '.join(per)} |")


if __name__ == "__main__":
    main()
