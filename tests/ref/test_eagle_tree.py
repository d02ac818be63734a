#!/usr/bin/env python3
"""Token trees drafted by an EAGLE-3 head (specd-generate --eagle DIR
--tree-topk T --tree-nodes N -k DEPTH) leave the output exactly plain
decoding's:

  * a random target (specd-mkmodel) with a random, untrained head
    (eagle_ref.write_head): greedy output = plain greedy, token for token,
    at several tree shapes (a one-child tree is the chain); seeded sampling
    (T 0.8, top-p 0.95) = plain seeded sampling; with presence and
    frequency penalties = plain with the same penalties;
  * the demo model (SPECD_MODEL, else tools/fetch-model's path) with its
    trained head (~/.cache/specd/eagle3/<model name> or quiet-run, written
    by tools/train-eagle): greedy = plain greedy over 64 tokens of a chat
    prompt, and the head's drafts are accepted (so the kept paths, copied
    down in the cache, are exercised); a one-child tree drafts and accepts
    exactly what the chain of the same depth does. Skipped with a message when the
    model or the head is absent;
  * refusals: --tree-topk without --eagle, the rejection rule on sampled
    requests.

Environment: SPECD_BUILD_DIR, SPECD_MODEL. Exit 77 when a binary or package
is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
SKIP = 77
try:
    from eagle_ref import write_head
except ImportError as e:  # pragma: no cover
    print(f"skip: python packages missing ({e}); run scripts/setup")
    sys.exit(SKIP)

SOURCE_DIR = os.environ.get("SPECD_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
BUILD_DIR = os.environ.get("SPECD_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
DIM, LAYERS, VOCAB = 64, 6, 512
SHAPES = [(1, 1, 3), (2, 4, 3), (4, 16, 5), (8, 64, 8)]  # (top-k, nodes, depth)


def binary(sub, name):
    path = os.path.join(BUILD_DIR, sub, name)
    if not os.path.exists(path):
        print(f"skip: {path} not built")
        sys.exit(SKIP)
    return path


def run(model, args, check=True):
    r = subprocess.run([binary("tools", "specd-generate"), "-m", model, "-t", "2", "--json"] + args,
                       capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"specd-generate {' '.join(args)} failed:\n{r.stderr}")
    return r


def generate(model, args):
    return json.loads(run(model, args).stdout)


def tree_args(head, topk, nodes, depth):
    return ["--eagle", head, "--tree-topk", str(topk), "--tree-nodes", str(nodes), "-k", str(depth)]


def check_random(tmp, failures):
    target = os.path.join(tmp, "target")
    subprocess.run([binary("tools", "specd-mkmodel"), "-o", target, "--format", "hf", "--dim", str(DIM), "--layers",
                    str(LAYERS), "--heads", "4", "--kv-heads", "2", "--ff", "128", "--vocab", str(VOCAB), "--seed",
                    "3"], check=True, capture_output=True)
    head = os.path.join(tmp, "head")
    write_head(head, hidden=DIM, vocab=VOCAB, draft_vocab=128, layer_ids=[0, 2, 5], with_embed=True, seed=1)
    prompt = ["-p", "once upon a time", "-n", "32", "--ignore-eos"]
    variants = {
        "greedy": [],
        "seeded": ["--temp", "0.8", "--top-p", "0.95", "--seed", "11"],
        "penalties": ["--presence-penalty", "0.5", "--frequency-penalty", "0.3"],
    }
    for label, extra in variants.items():
        plain = generate(target, prompt + extra)["ids"]
        for topk, nodes, depth in SHAPES:
            out = generate(target, prompt + extra + tree_args(head, topk, nodes, depth))
            if out["spec"]["drafted"] < 10:  # the head must have drafted for the equality to mean anything
                failures.append(f"{label} tree {topk}/{nodes}/{depth}: drafted only {out['spec']['drafted']}")
            if out["ids"] != plain:
                failures.append(f"{label} tree {topk}/{nodes}/{depth}: {out['ids']} != plain {plain}")
        print(f"{label}: --eagle --tree-topk = plain at shapes {SHAPES} (random head)")
    r = run(target, prompt + ["--tree-topk", "2"], check=False)
    if r.returncode == 0 or "--tree-topk needs --eagle" not in r.stderr:
        failures.append(f"--tree-topk without --eagle: rc {r.returncode}, {r.stderr.strip()[:200]}")
    r = run(target, prompt + variants["seeded"] + ["--verify-rule", "rejection"] + tree_args(head, 2, 4, 3),
            check=False)
    if r.returncode == 0 or "coupled rule only" not in r.stderr:
        failures.append(f"trees under the rejection rule: rc {r.returncode}, {r.stderr.strip()[-300:]}")
    print("refused: --tree-topk without --eagle, trees under the rejection rule")


def demo_model():
    path = os.environ.get("SPECD_MODEL")
    if not path:
        r = subprocess.run([os.path.join(SOURCE_DIR, "tools", "fetch-model")], capture_output=True, text=True)
        path = r.stdout.strip() if r.returncode == 0 else ""
    return path if path and os.path.exists(path) else None


def trained_head(model):
    root = os.path.join(os.path.expanduser("~"), ".cache", "specd", "eagle3")
    name = os.path.basename(model)
    for d in (os.path.join(root, "quiet-run"), os.path.join(root, name.removesuffix(".gguf"))):
        meta = os.path.join(d, "specd_train.json")
        if os.path.exists(meta) and json.load(open(meta)).get("target") == name:
            return d
    return None


def check_trained(failures):
    model = demo_model()
    head = trained_head(model) if model else None
    if not head:
        print("skip (trained head): no demo model or no head trained for it (tools/train-eagle)")
        return
    prompt = ["--chat", "-p", "Explain in a few sentences why the sky is blue.", "-n", "64", "--ignore-eos"]
    plain = generate(model, prompt)["ids"]
    for topk, nodes, depth in ((4, 16, 5), (2, 8, 4)):
        out = generate(model, prompt + tree_args(head, topk, nodes, depth))
        if out["ids"] != plain:
            failures.append(f"trained head tree {topk}/{nodes}/{depth}: {out['ids']} != plain {plain}")
        if out["spec"]["accepted"] < 4:  # accepted paths are copied down in the cache: exercise that
            failures.append(f"trained head tree {topk}/{nodes}/{depth}: only {out['spec']['accepted']} accepted")
        print(f"trained head, tree {topk}/{nodes}/{depth}: = plain greedy, {out['spec']['accepted']} of "
              f"{out['spec']['drafted']} nodes accepted")
    # a one-child tree is the chain: the head's tree rows (attending along
    # their path) draft what its chain rows draft, step for step
    # (greedy: the argmax child; sampled: the chain's coupled draft first)
    for label, extra in (("greedy", []), ("seeded", ["--temp", "0.7", "--seed", "5"])):
        chain = generate(model, prompt + extra + ["--eagle", head, "-k", "3"])["spec"]
        tree = generate(model, prompt + extra + tree_args(head, 1, 3, 3))["spec"]
        if [chain[k] for k in ("target_steps", "drafted", "accepted")] != \
                [tree[k] for k in ("target_steps", "drafted", "accepted")]:
            failures.append(f"{label}: one-child tree {tree} drafts otherwise than the chain {chain}")
        print(f"trained head, {label}: a one-child tree of depth 3 = the chain of K 3 ({chain['accepted']} "
              f"accepted in {chain['target_steps']} steps)")


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        check_random(tmp, failures)
    check_trained(failures)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
