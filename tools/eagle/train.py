"""train.py — training an EAGLE-3 head on a feature dump (target.py's
format): the draft vocabulary by token frequency, the target's soft labels,
batches, AdamW, and the training-time test's loss (head.py).

Labels: at the position a row's step predicts from, the target's logits
(final @ W_lm^T) restricted to the draft vocabulary and softmaxed, as
EAGLE-3 trains; positions where the target's own top token (over the full
vocabulary) is not in the draft vocabulary carry no loss, nor do the
prompt's positions when the dump says where the prompt ends (n_prompt)
unless train_on_prompt.
"""
import math
import time

import numpy as np
import jax
import jax.numpy as jnp

import head as H


def choose_vocab(seqs, vocab, draft_vocab, keep=()):
    """The draft vocabulary: the draft_vocab most frequent tokens of the
    sequences (answers only where n_prompt is known; ties and unseen ids by
    lowest id), the ids in keep (the end token) always in. Returns (used
    ids ascending, d2t int64 [Vd], t2d bool [V], coverage: the share of the
    counted tokens in the draft vocabulary)."""
    if not 0 < draft_vocab <= vocab:
        raise ValueError(f"draft vocabulary {draft_vocab} must be in [1, {vocab}]")
    counts = token_counts(seqs, vocab)
    order = np.lexsort((np.arange(vocab), -counts))          # count desc, then id asc
    chosen = list(order[:draft_vocab])
    for k in keep:
        if k is not None and 0 <= k < vocab and k not in chosen:
            chosen[-1 - list(keep).index(k)] = k
    used = np.array(sorted(int(i) for i in chosen), np.int64)
    t2d = np.zeros(vocab, np.bool_)
    t2d[used] = True
    d2t = used - np.arange(draft_vocab, dtype=np.int64)
    return used, d2t, t2d, _share(counts, used)


def token_counts(seqs, vocab):
    """Each id's count in the sequences (answers only where n_prompt is
    known)."""
    counts = np.zeros(vocab, np.int64)
    for s in seqs:
        tok = s["tokens"][s["n_prompt"]:] if s.get("n_prompt") else s["tokens"]
        counts += np.bincount(tok, minlength=vocab)
    return counts


def vocab_coverage(seqs, vocab, used):
    """The share of the counted tokens that the draft vocabulary `used`
    holds (as choose_vocab reports it)."""
    return _share(token_counts(seqs, vocab), used)


def _share(counts, used):
    return float(counts[used].sum()) / max(1, int(counts.sum()))


def prepare(seqs, target, t2d, train_on_prompt=False, max_len=1024, chunk=256):
    """Per sequence: the label weight of every position (the target's top
    token in the draft vocabulary, and an answer position unless
    train_on_prompt), sequences cut to max_len."""
    lm = target.lm_head
    out = []
    for s in seqs:
        T = min(len(s["tokens"]), max_len)
        fin = s["final"][:T]
        top = np.concatenate([np.argmax(fin[i:i + chunk] @ lm.T, axis=-1) for i in range(0, T, chunk)])
        w = t2d[top].astype(np.float32)
        if s.get("n_prompt") and not train_on_prompt:
            w[:max(0, s["n_prompt"] - 1)] = 0.0          # position n_prompt-1 predicts the answer's first token
        out.append({"tokens": s["tokens"][:T].astype(np.int64), "aux": s["aux"][:T], "final": fin, "weight": w})
    return out


def batches(data, batch, n_steps, embed, rng, bucket=64):
    """Yields padded batches, forever: sequences of similar length together,
    padded to a multiple of `bucket` (each shape is compiled once: a
    compile costs seconds, the padding a little work), in a random order
    each pass."""
    order = np.argsort([len(d["tokens"]) for d in data], kind="stable")
    groups = [order[i:i + batch] for i in range(0, len(order), batch)]
    while True:
        for gi in rng.permutation(len(groups)):
            g = [data[i] for i in groups[gi]]
            yield pad_batch(g, n_steps, embed, bucket)


def pad_batch(g, n_steps, embed, bucket=64):
    L = max(len(d["tokens"]) for d in g)
    L = ((L + bucket - 1) // bucket) * bucket
    B, Hd = len(g), g[0]["final"].shape[1]
    aux = np.zeros((B, L, g[0]["aux"].shape[1]), np.float32)
    tok = np.zeros((B, L + n_steps), np.int64)
    fin = np.zeros((B, L + n_steps, Hd), np.float32)
    w = np.zeros((B, L + n_steps), np.float32)
    for i, d in enumerate(g):
        T = len(d["tokens"])
        aux[i, :T], tok[i, :T], fin[i, :T], w[i, :T] = d["aux"], d["tokens"], d["final"], d["weight"]
    return aux, embed[tok], fin, w


def lr_at(step, progress, lr, warmup):
    """Linear warmup over `warmup` steps, then a cosine from lr to lr/10 as
    progress goes from 0 to 1."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def make_step(cfg, n_steps, clip=1.0, b1=0.9, b2=0.95, eps=1e-8, wd=0.0):
    """A jitted AdamW step over the TTT loss; returns (params, opt, loss,
    per-step losses, per-step accuracies)."""
    def step(params, opt, aux, emb, fin, w, lm_d, lr):
        tgt = fin @ lm_d.T                                                  # [B, T + K, Vd]
        (loss, (ls, accs)), grads = jax.value_and_grad(H.ttt_loss, has_aux=True)(
            params, cfg, aux, emb, tgt, w, n_steps)
        gn = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
        scale = jnp.minimum(1.0, clip / (gn + 1e-6))
        t = opt["t"] + 1
        new_p, new_m, new_v = {}, {}, {}
        for k in params:
            g = grads[k] * scale
            m = b1 * opt["m"][k] + (1 - b1) * g
            v = b2 * opt["v"][k] + (1 - b2) * g * g
            mh = m / (1 - b1 ** t)
            vh = v / (1 - b2 ** t)
            upd = mh / (jnp.sqrt(vh) + eps) + (wd * params[k] if params[k].ndim > 1 else 0.0)
            new_p[k] = params[k] - lr * upd
            new_m[k], new_v[k] = m, v
        return new_p, {"m": new_m, "v": new_v, "t": t}, loss, ls, accs
    return jax.jit(step)


def make_eval(cfg, n_steps):
    def ev(params, aux, emb, fin, w, lm_d):
        return H.ttt_loss(params, cfg, aux, emb, fin @ lm_d.T, w, n_steps)
    return jax.jit(ev)


def evaluate(ev, params, data, n_steps, embed, lm_d, batch):
    """Per-step loss and accuracy over data, weighted by labelled positions."""
    tot_l, tot_a, tot_n = 0.0, 0.0, 0.0
    for i in range(0, len(data), batch):
        aux, emb, fin, w = pad_batch(data[i:i + batch], n_steps, embed)
        _, (ls, accs) = ev(params, aux, emb, fin, w, lm_d)
        n = float(w.sum())
        tot_l = tot_l + np.asarray(ls) * n
        tot_a = tot_a + np.asarray(accs) * n
        tot_n += n
    return tot_l / max(tot_n, 1.0), tot_a / max(tot_n, 1.0)


def train(cfg, params, data, embed, lm_d, steps, n_steps, lr=1e-3, batch=4, seed=0, log=print,
          log_every=10, warmup=None, seconds=0.0):
    """Trains params (dict of float32 numpy arrays) for `steps` optimizer
    steps, or until `seconds` have passed when that is > 0 (the learning
    rate's schedule follows whichever is further along, so a time-bounded
    run still ends at the low rate); returns (params as numpy, history: list
    of (step, loss, per-step losses, per-step accuracies))."""
    rng = np.random.default_rng(seed)
    p = {k: jnp.asarray(v) for k, v in params.items()}
    opt = {"m": {k: jnp.zeros_like(v) for k, v in p.items()},
           "v": {k: jnp.zeros_like(v) for k, v in p.items()}, "t": jnp.zeros((), jnp.float32)}
    step_fn = make_step(cfg, n_steps)
    lm_d = jnp.asarray(lm_d)
    warmup = warmup if warmup is not None else max(1, min(20, steps // 10))
    it = batches(data, batch, n_steps, embed, rng)
    hist, t0 = [], time.time()
    for s in range(steps):
        aux, emb, fin, w = next(it)
        progress = max(s / steps, (time.time() - t0) / seconds if seconds > 0 else 0.0)
        last = s == steps - 1 or progress >= 1.0
        p, opt, loss, ls, accs = step_fn(p, opt, aux, emb, fin, w, lm_d, lr_at(s, progress, lr, warmup))
        if s % log_every == 0 or last:
            loss, ls, accs = float(loss), np.asarray(ls), np.asarray(accs)
            hist.append((s, loss, ls.tolist(), accs.tolist()))
            log(f"step {s:5d}  loss {loss:.4f}  step-0 loss {ls[0]:.4f}  acc "
                + " ".join(f"{a:.2f}" for a in accs) + f"  ({time.time() - t0:.0f} s)")
        if last:
            break
    return {k: np.asarray(v) for k, v in p.items()}, hist
