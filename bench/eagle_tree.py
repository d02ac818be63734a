"""eagle_tree.py — token trees against chains with an EAGLE-3 head, single
process (specd-generate), on this machine.

    .venv/bin/python bench/eagle_tree.py --model MODEL --head DIR [--n 96] [--rounds 2] [--threads 2]
                                         [--configs "plain;chain:2;chain:3;tree:2,4,3;tree:4,16,5"] [--temp T]

Each round runs every configuration once per prompt, interleaved (plain,
then each chain and tree, then the next prompt), so a shared machine's
drift hits all alike; greedy (or --temp T, seed 5: the coupled rule),
chat-formatted, the three prompts of bench/eagle_cost.py. Per
configuration: decode tok/s (the best round and the mean), tokens per
target step, accepted drafts per step, drafted nodes per step, the head's
and the target's ms per step, and the speed against plain of the same
round. A configuration is plain, chain:K (--eagle -k K), adaptive:K
(--eagle --adaptive-k -k K: K chosen per step, at most K) or tree:T,N,D
(--eagle --tree-topk T --tree-nodes N -k D).
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from eagle_cost import run  # noqa: E402  (one specd-generate --json runner for both)

PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short poem about the sea.",
    "What are three good habits for writing clean code?",
]


def args_of(config, head):
    kind, _, rest = config.partition(":")
    if kind == "plain":
        return []
    if kind == "chain":
        return ["--eagle", head, "-k", rest]
    if kind == "adaptive":
        return ["--eagle", head, "--adaptive-k", "-k", rest]
    if kind == "tree":
        t, n, d = rest.split(",")
        return ["--eagle", head, "--tree-topk", t, "--tree-nodes", n, "-k", d]
    sys.exit(f"unknown configuration {config}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--gen", default=os.path.join(ROOT, "build", "tools", "specd-generate"))
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="plain;chain:2;chain:3;tree:2,4,3;tree:3,8,4;tree:4,16,5")
    ap.add_argument("--temp", type=float, default=0.0)
    a = ap.parse_args()
    sampling = ["--temp", str(a.temp), "--seed", "5"] if a.temp > 0 else []
    configs = a.configs.split(";")
    rows = {c: [] for c in configs}  # per (round, prompt): the JSON
    for rnd in range(a.rounds):
        for prompt in PROMPTS:
            for c in configs:
                rows[c].append((rnd, run(a.gen, a.model, prompt, a.n, a.threads, sampling + args_of(c, a.head))))
    plain = {}
    for rnd, out in rows.get("plain", []):
        plain.setdefault(rnd, []).append(out["timings"]["decode_tok_s"])
    print("| configuration | tok/s best round | tok/s mean | x plain (same rounds) | tokens / target step | "
          "accepted / step | nodes / step | head ms / step | target ms / step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in configs:
        by_round = {}
        for rnd, out in rows[c]:
            by_round.setdefault(rnd, []).append(out)
        rates = [sum(o["timings"]["decode_tok_s"] for o in outs) / len(outs) for outs in by_round.values()]
        ratio = [r / (sum(plain[k]) / len(plain[k])) for k, r in zip(by_round, rates)] if plain else []
        sp = [o.get("spec") for _, o in rows[c] if o.get("spec")]
        steps = sum(s["target_steps"] for s in sp) if sp else 0
        per = (lambda key: sum(s[key] for s in sp) / steps) if steps else (lambda key: 0.0)
        tps = (sum(s["accepted"] for s in sp) + steps) / steps if steps else 1.0
        print(f"| {c} | {max(rates):.1f} | {sum(rates) / len(rates):.1f} | "
              f"{'/'.join(f'{x:.2f}' for x in ratio) if ratio else '-'} | {tps:.2f} | {per('accepted'):.2f} | "
              f"{per('drafted'):.1f} | {per('draft_ms'):.2f} | {per('target_ms'):.2f} |")


if __name__ == "__main__":
    main()
