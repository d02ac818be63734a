/* drafter.c — the drafter interface (drafter.h) and the n-gram drafter.
 *
 * The n-gram drafter is prompt lookup: code edits, summaries that quote
 * their source and repetitive chat reuse long runs of the context (the
 * prompt and the request's own output so far), so the tokens that followed
 * an earlier occurrence of the context's suffix are a free draft.
 *
 * Lookup. Every earlier position holding the context's last token is
 * extended backwards to the length of its common suffix with the context
 * (up to ngram_max tokens): all match lengths are measured in one pass and
 * the longest wins, which is the "longest n first" of a fixed list of
 * n-gram sizes without trying each size. The positions sharing that length
 * are the candidates (the 64 most recent); each proposes the token that
 * followed it; a token most of them propose wins, else the most recent
 * candidate's (plain most-frequent was accepted less often than most
 * recent on the copy-heavy prompts: generation repeats what it just did),
 * and whether they agreed feeds the confidence below. The candidates
 * that agreed match one token longer and propose the next token; the
 * others drop out. A candidate may run into the draft itself, which drafts
 * a periodic text ("say it three times") past the context's end.
 *
 * Length. A draft is as long as it is likely to be accepted: each token
 * gets an acceptance estimate from the match length behind it and whether
 * the candidates agreed on it, and the draft stops before the estimated
 * probability that every token so far is accepted falls below ngram_min_p
 * (or at k). The estimates start from a prior and, for greedy requests, are
 * calibrated per sequence: the next call's context shows which of the
 * previous draft's tokens were accepted.
 *
 * Shared cache. Where nothing in the context continues the suffix, the
 * drafter asks a bounded, evicting cache of what followed each 1..4-gram in
 * the outputs of the requests it served before (their chat preambles, code
 * layout, list formats), drafting a continuation seen at least twice that
 * holds most of its n-gram's count. On the copy-heavy prompt set
 * (bench/prompts/copy_heavy.txt, demo model, 64 greedy tokens each, prompts
 * in order) this is what lifts tokens per step above the previous
 * single-lookup drafter (1.75 against 1.65 at K = 8, acceptance 0.47
 * against 0.18); without it the lookup alone matched the old drafter's
 * tokens per step and the length cut only traded tokens per step for
 * acceptance (tests/test_ngram_copy.c measures both).
 *
 * Sampled requests use the prior alone and never read the cache, so that
 * their drafts, and with them their seeded output, depend on nothing but
 * their own context (not on other requests, nor on what a restarted drafter
 * forgot). Greedy output is the argmax whatever was drafted.
 *
 * Compared with llama.cpp's lookup decoding (n-gram caches over the
 * context, a static corpus and earlier generations, drafts cut by
 * per-n-gram-size count and share thresholds) and SuffixDecoding (suffix
 * trees over the prompt and earlier outputs, draft length growing with the
 * match length, cut by the product of empirical continuation frequencies):
 * the same ideas (match length, agreement and frequency of continuations,
 * a cache across requests) without a suffix index over the context: a
 * lookup is one scan of the context, O(n_context) plus O(max_len) per
 * position holding the last token, which is nothing next to a forward pass
 * at the context sizes we serve.
 *
 * q is one-hot (the draft is deterministic), so verification accepts y with
 * probability p(y) and is exact whatever the draft is. Model drafters live
 * in drafter_model.c. */
#include "drafter_impl.h"
#include "specd/eagle.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NGRAM_DEFAULT_MIN_P 0.15f /* see sd_drafter_params.ngram_min_p */

sd_drafter_params sd_drafter_default_params(void) {
    sd_drafter_params p = {
        .max_seqs = 1,
        .max_ctx = 4096,
        .top_n = SD_SPEC_DEFAULT_TOP_N,
        .ngram_min = 1,
        .ngram_max = 16,
        .ngram_min_p = NGRAM_DEFAULT_MIN_P,
        .ngram_cache_entries = 65536,
        .n_threads = 0,
        .device = -1,
        .backend = NULL,
        .draft_vocab = SD_DRAFTER_DEFAULT_VOCAB,
        .prefix_cache_pct = 50,
    };
    return p;
}

sd_status drafter_params_check(const sd_drafter_params *in, sd_drafter_params *out) {
    sd_drafter_params p = in ? *in : sd_drafter_default_params();
    sd_drafter_params def = sd_drafter_default_params();
    if (p.max_seqs == 0) p.max_seqs = def.max_seqs;
    if (p.max_ctx == 0) p.max_ctx = def.max_ctx;
    if (p.top_n == 0) p.top_n = def.top_n;
    if (p.ngram_min == 0) p.ngram_min = def.ngram_min;
    if (p.ngram_max == 0) p.ngram_max = p.ngram_min > def.ngram_max ? p.ngram_min : def.ngram_max;
    if (p.ngram_min_p == 0.0f) p.ngram_min_p = def.ngram_min_p;
    if (p.ngram_cache_entries == 0) p.ngram_cache_entries = def.ngram_cache_entries;
    if (p.prefix_cache_pct == 0) p.prefix_cache_pct = def.prefix_cache_pct;
    if (p.max_seqs < 0 || p.max_ctx < 0 || p.top_n < 0 || p.ngram_min < 0 || p.ngram_max < p.ngram_min ||
        !(p.ngram_min_p > 0.0f && p.ngram_min_p <= 1.0f) || p.ngram_cache_entries > 1 << 24 || p.n_threads < 0 ||
        p.max_seqs > 1 << 16 || p.max_ctx > 1 << 24 || p.top_n > 1 << 16 || p.draft_vocab < 0 ||
        p.prefix_cache_pct > 100 || p.eagle_weights < SD_EAGLE_WEIGHTS_DEFAULT ||
        p.eagle_weights > SD_EAGLE_WEIGHTS_STORED) {
        SD_ERROR("drafter: bad parameters (max_seqs %d, max_ctx %d, top_n %d, ngram %d..%d, ngram_min_p %g, "
                 "threads %d, draft vocabulary %d, prefix cache %d%%, EAGLE weights %d)",
                 (int)p.max_seqs, (int)p.max_ctx, (int)p.top_n, (int)p.ngram_min, (int)p.ngram_max,
                 (double)p.ngram_min_p, (int)p.n_threads, (int)p.draft_vocab, (int)p.prefix_cache_pct,
                 (int)p.eagle_weights);
        return SD_ERR_INVALID_ARG;
    }
    *out = p;
    return SD_OK;
}

void sd_drafter_free(sd_drafter **pd) {
    if (!pd || !*pd) return;
    sd_drafter *d = *pd;
    if (d->ops && d->ops->destroy) d->ops->destroy(d);
    free(d);
    *pd = NULL;
}

sd_drafter_kind sd_drafter_kind_of(const sd_drafter *d) { return d ? d->kind : 0; }

const char *sd_drafter_name(const sd_drafter *d) { return d && d->ops ? d->ops->name : "none"; }

int32_t sd_drafter_max_q(const sd_drafter *d) {
    if (!d) return 0;
    return d->kind == SD_DRAFTER_NGRAM ? 1 : d->params.top_n;
}

void sd_drafter_set_constraint(sd_drafter *d, sd_constraint *c) {
    if (d) d->constraint = c;
}

sd_status sd_drafter_propose(sd_drafter *d, int32_t seq, const int32_t *context, int32_t n_context, int32_t k,
                             const sd_sampling *s, int32_t *tokens, sd_spec_q *q, int32_t *n_drafted) {
    SD_TRY(sd_sampling_validate(s)); /* a public entry point: the one check */
    return sd_drafter_propose_given(d, seq, context, n_context, k, s, tokens, q, n_drafted);
}

sd_status sd_drafter_propose_given(sd_drafter *d, int32_t seq, const int32_t *context, int32_t n_context, int32_t k,
                                   const sd_sampling *s, int32_t *tokens, sd_spec_q *q, int32_t *n_drafted) {
    if (!d || !context || !s || !tokens || !q || !n_drafted || n_context <= 0 || k < 0 || k > SD_MAX_K) {
        SD_ERROR("drafter: propose needs a drafter, a non-empty context, sampling, outputs and 0 <= k <= %d "
                 "(n_context %d, k %d)",
                 SD_MAX_K, (int)n_context, (int)k);
        return SD_ERR_INVALID_ARG;
    }
    if (seq < 0 || seq >= d->params.max_seqs) {
        SD_ERROR("drafter: sequence slot %d outside [0, %d)", (int)seq, (int)d->params.max_seqs);
        return SD_ERR_RANGE;
    }
    *n_drafted = 0;
    if (k == 0) return SD_OK;
    return d->ops->propose(d, seq, context, n_context, k, s, tokens, q, n_drafted);
}

sd_status sd_drafter_rollback(sd_drafter *d, int32_t seq, int32_t len) {
    if (!d || seq < 0 || seq >= d->params.max_seqs || len < 0) {
        SD_ERROR("drafter: rollback of slot %d to %d is out of range", (int)seq, (int)len);
        return SD_ERR_RANGE;
    }
    return d->ops->rollback ? d->ops->rollback(d, seq, len) : SD_OK;
}

void sd_drafter_release(sd_drafter *d, int32_t seq) {
    if (!d || seq < 0 || seq >= d->params.max_seqs) return;
    if (d->ops->release) d->ops->release(d, seq);
}

sd_status sd_drafter_pair_vocab(sd_drafter *d, int32_t target_n_vocab) {
    if (!d || target_n_vocab <= 0) return SD_ERR_INVALID_ARG;
    return d->ops->pair_vocab ? d->ops->pair_vocab(d, target_n_vocab) : SD_OK; /* n-gram: the context's ids */
}

int32_t sd_drafter_embed_rows(const sd_drafter *d) {
    return d && d->ops->embed_rows ? d->ops->embed_rows(d) : INT32_MAX;
}

sd_status sd_draft_batch(sd_drafter *d, int32_t n_seqs, const sd_draft_seq *seqs, sd_draft_result *results) {
    if (!d || n_seqs < 0 || (n_seqs > 0 && (!seqs || !results))) {
        SD_ERROR("drafter: draft_batch needs a drafter, sequences and results (n_seqs %d)", (int)n_seqs);
        return SD_ERR_INVALID_ARG;
    }
    for (int32_t i = 0; i < n_seqs; i++) {
        const sd_draft_seq *v = &seqs[i];
        sd_draft_result *r = &results[i];
        r->outcome = SD_SEQ_OK;
        r->n_drafted = 0;
        bool dup = false;
        for (int32_t j = 0; j < i && !dup; j++) dup = seqs[j].slot == v->slot;
        if (v->slot < 0 || v->slot >= d->params.max_seqs || dup || v->keep_len < 0 || v->n_append < 1 || !v->append ||
            v->k < 0 || v->k > SD_MAX_K || (int64_t)v->keep_len + v->n_append > d->params.max_ctx) {
            SD_WARN("drafter: sequence %d: bad request (slot %d%s, keep_len %d, n_append %d, k %d, max_ctx %d)", (int)i,
                    (int)v->slot, dup ? " repeated" : "", (int)v->keep_len, (int)v->n_append, (int)v->k,
                    (int)d->params.max_ctx);
            r->outcome = SD_SEQ_INVALID;
        }
    }
    return d->ops->propose_batch(d, n_seqs, seqs, results);
}

/* ---- n-gram drafter ---- */

/* Calibration buckets: the match length behind a draft token (1, 2, 3,
 * 4-5, 6-8, 9-15, 16+) times whether the candidates agreed on it. */
#define NGRAM_LEN_BUCKETS    7
#define NGRAM_BUCKETS        (2 * NGRAM_LEN_BUCKETS)
#define NGRAM_BUCKET_CACHE   255 /* a draft token from the shared cache: not calibrated */
#define NGRAM_MAX_CANDIDATES 64  /* most recent earlier matches kept per lookup */
#define NGRAM_PRIOR_WEIGHT   3.0 /* pseudo-observations of the prior in each bucket */

/* The cache shared by all sequences of a drafter: what followed each
 * n-gram (n = 1..NGRAM_CACHE_N) in the outputs of requests served so far
 * (greedy and sampled), read by greedy requests only. Set-associative,
 * NGRAM_CACHE_WAYS ways a set, the least recently touched way evicted; each
 * entry counts up to NGRAM_CACHE_NEXT continuations, the least seen
 * replaced. A hash collision can only cost a rejected draft. */
#define NGRAM_CACHE_N        4
#define NGRAM_CACHE_WAYS     4
#define NGRAM_CACHE_NEXT     4
#define NGRAM_CACHE_MIN_SEEN 2 /* times an n-gram was seen before its continuation is drafted */

typedef struct ngram_entry {
    uint64_t key;   /* hash of (n, tokens); 0 = empty */
    uint32_t stamp; /* last touched */
    int32_t next[NGRAM_CACHE_NEXT];
    uint16_t count[NGRAM_CACHE_NEXT];
} ngram_entry;

typedef struct ngram_cache {
    ngram_entry *entries; /* [n_sets][NGRAM_CACHE_WAYS] */
    uint32_t n_sets;
    uint32_t clock;
} ngram_cache;

static uint64_t gram_key(const int32_t *tokens, int32_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)(n + 1);
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)tokens[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
    }
    return h ? h : 1;
}

static ngram_entry *cache_find(ngram_cache *c, uint64_t key, bool insert) {
    ngram_entry *set = c->entries + (size_t)(key % c->n_sets) * NGRAM_CACHE_WAYS;
    ngram_entry *victim = &set[0];
    for (int w = 0; w < NGRAM_CACHE_WAYS; w++) {
        if (set[w].key == key) return &set[w];
        if (set[w].key == 0 || (victim->key != 0 && set[w].stamp < victim->stamp)) victim = &set[w];
    }
    if (!insert) return NULL;
    memset(victim, 0, sizeof *victim);
    victim->key = key;
    for (int i = 0; i < NGRAM_CACHE_NEXT; i++) victim->next[i] = -1;
    return victim;
}

/* Records that tokens[pos] followed the n-grams ending at pos - 1 (those
 * starting at or after from). */
static void cache_add(ngram_cache *c, const int32_t *tokens, int32_t from, int32_t pos) {
    for (int32_t n = 1; n <= NGRAM_CACHE_N && pos - n >= from; n++) {
        ngram_entry *e = cache_find(c, gram_key(tokens + pos - n, n), true);
        e->stamp = ++c->clock;
        int slot = -1, least = 0;
        for (int i = 0; i < NGRAM_CACHE_NEXT && slot < 0; i++)
            if (e->next[i] == tokens[pos]) slot = i;
        if (slot < 0) {
            for (int i = 1; i < NGRAM_CACHE_NEXT; i++)
                if (e->count[i] < e->count[least]) least = i;
            slot = least;
            e->next[slot] = tokens[pos];
            e->count[slot] = 0;
        }
        if (e->count[slot] == UINT16_MAX)
            for (int i = 0; i < NGRAM_CACHE_NEXT; i++) e->count[i] /= 2;
        e->count[slot]++;
    }
}

/* The continuation of the longest n-gram ending the virtual context that
 * the cache has seen at least NGRAM_CACHE_MIN_SEEN times, if one
 * continuation holds most of its count; *p gets its share, discounted. */
static int32_t cache_lookup(ngram_cache *c, const int32_t *context, int32_t n_context, const int32_t *draft, int32_t k,
                            double *p) {
    int32_t gram[NGRAM_CACHE_N];
    int32_t len = n_context + k;
    for (int32_t n = NGRAM_CACHE_N < len ? NGRAM_CACHE_N : len; n >= 1; n--) {
        for (int32_t i = 0; i < n; i++) {
            int32_t at = len - n + i;
            gram[i] = at < n_context ? context[at] : draft[at - n_context];
        }
        const ngram_entry *e = cache_find(c, gram_key(gram, n), false);
        if (!e) continue;
        int best = 0;
        uint32_t total = 0;
        for (int i = 0; i < NGRAM_CACHE_NEXT; i++) {
            total += e->count[i];
            if (e->count[i] > e->count[best]) best = i;
        }
        if (total < NGRAM_CACHE_MIN_SEEN || 2u * e->count[best] <= total) continue;
        *p = (double)e->count[best] / (total + 1.0);
        return e->next[best];
    }
    return -1;
}

typedef struct ngram_calib {
    uint32_t drafted[NGRAM_BUCKETS];  /* draft tokens verified while every earlier one was accepted */
    uint32_t accepted[NGRAM_BUCKETS]; /* of those, accepted */
} ngram_calib;

/* Per sequence slot: the last draft (what q points into) and what it rested on. */
typedef struct ngram_slot {
    int32_t draft[SD_MAX_K];
    uint8_t bucket[SD_MAX_K]; /* calibration bucket of each draft token */
    int32_t k;
    int32_t n_context;  /* context length the draft continued; 0 = none pending */
    int32_t last_token; /* context[n_context - 1] then */
    bool greedy;        /* drafted for a greedy request (calibration is greedy-only) */
    ngram_calib calib;
    int32_t out_start; /* context length at the sequence's first call: its output starts here */
    int32_t fed;       /* tokens before this position are in the shared cache */
    bool started;
} ngram_slot;

typedef struct ngram_state {
    float one;            /* 1.0f, what every q.probs points at */
    ngram_slot *slots;    /* [max_seqs] */
    ngram_cache cache;    /* entries NULL: no shared cache */
    int32_t *history;     /* [max_seqs][max_ctx] committed tokens per slot (batched path), lazily */
    int32_t *history_len; /* [max_seqs] */
} ngram_state;

static int len_bucket(int32_t len) {
    if (len <= 3) return len - 1;
    if (len <= 5) return 3;
    if (len <= 8) return 4;
    if (len <= 15) return 5;
    return 6;
}

/* Prior acceptance of a draft token continuing a match of len tokens,
 * before a request has shown how it copies: len / (len + 1.5), i.e. 0.4
 * after one token, 0.73 after four, 0.91 after sixteen, halved when the
 * candidates disagree (a split vote at a short match is close to a guess).
 * Chosen by hand (a match of length L taken as right L times in L + 1.5),
 * not fitted; the per-request calibration below corrects it. */
static double prior_p(int b) {
    static const double mid[NGRAM_LEN_BUCKETS] = {1, 2, 3, 4.5, 7, 12, 20};
    int lb = b % NGRAM_LEN_BUCKETS;
    double p = mid[lb] / (mid[lb] + 1.5);
    return b >= NGRAM_LEN_BUCKETS ? 0.5 * p : p;
}

static double bucket_p(const ngram_slot *sl, int b, bool calibrated) {
    double prior = prior_p(b);
    if (!calibrated) return prior;
    return (sl->calib.accepted[b] + NGRAM_PRIOR_WEIGHT * prior) / (sl->calib.drafted[b] + NGRAM_PRIOR_WEIGHT);
}

/* Folds the outcome of the slot's previous draft into its calibration: the
 * committed context now shows which draft tokens were accepted. Only
 * tokens whose predecessors were all accepted are counted (the estimate is
 * of acceptance given the match so far), and only greedy drafts: a sampled
 * request's drafts must depend on its context alone, or its seeded output
 * would change when a restarted drafter forgets what it had learnt. */
static void ngram_observe(ngram_slot *sl, const int32_t *context, int32_t n_context) {
    int32_t from = sl->n_context;
    if (from <= 0 || !sl->greedy || n_context <= from || context[from - 1] != sl->last_token) {
        if (n_context != from) sl->n_context = 0;
        return;
    }
    for (int32_t i = 0; i < sl->k && from + i < n_context; i++) {
        bool ok = context[from + i] == sl->draft[i];
        int b = sl->bucket[i];
        if (b < NGRAM_BUCKETS && sl->calib.drafted[b] < UINT32_MAX / 2) {
            sl->calib.drafted[b]++;
            sl->calib.accepted[b] += ok;
        }
        if (!ok) break;
    }
    sl->n_context = 0;
}

/* The token at position i of the context followed by the draft so far. */
static inline int32_t virt_at(const int32_t *context, int32_t n_context, const int32_t *draft, int32_t i) {
    return i < n_context ? context[i] : draft[i - n_context];
}

/* Earlier occurrences of the context's suffix, longest match first: for
 * every position j < n - 1 holding the last token, the length of the common
 * suffix of context[0..j] and the context (capped at max_len). Writes the
 * positions following the matches of the greatest length (at least
 * min_len), most recent first, to next[] (at most NGRAM_MAX_CANDIDATES) and
 * returns how many; *len gets that length. */
static int32_t find_candidates(const int32_t *context, int32_t n, int32_t min_len, int32_t max_len, int32_t *next,
                               int32_t *len) {
    int32_t best = 0, n_next = 0;
    const int32_t last = context[n - 1];
    for (int32_t j = n - 2; j >= 0; j--) {
        if (context[j] != last) continue;
        int32_t l = 1, cap = max_len < j + 1 ? max_len : j + 1;
        while (l < cap && context[j - l] == context[n - 1 - l]) l++;
        if (l < min_len || l < best) continue;
        if (l > best) {
            best = l;
            n_next = 0;
        }
        if (n_next < NGRAM_MAX_CANDIDATES) next[n_next++] = j + 1;
    }
    *len = best;
    return n_next;
}

/* Prompt lookup with several match lengths at once and drafts as long as
 * they are likely to be accepted (see the file comment). */
static sd_status ngram_propose(sd_drafter *d, int32_t seq, const int32_t *context, int32_t n_context, int32_t k,
                               const sd_sampling *s, int32_t *tokens, sd_spec_q *q, int32_t *n_drafted) {
    ngram_state *st = d->impl;
    ngram_slot *sl = &st->slots[seq];
    const bool greedy = sd_sampling_is_greedy(s);
    ngram_observe(sl, context, n_context);
    const bool use_cache = greedy && st->cache.entries;
    if (st->cache.entries) { /* this sequence's new output tokens into the shared cache */
        if (!sl->started) {
            sl->started = true;
            sl->out_start = sl->fed = n_context;
        }
        if (sl->fed > n_context) sl->fed = n_context;
        int32_t from = sl->out_start > NGRAM_CACHE_N ? sl->out_start - NGRAM_CACHE_N : 0;
        for (int32_t pos = sl->fed > sl->out_start ? sl->fed : sl->out_start; pos < n_context; pos++)
            cache_add(&st->cache, context, from, pos);
        sl->fed = n_context;
    }
    *n_drafted = 0;
    sl->k = 0;
    int32_t next[NGRAM_MAX_CANDIDATES], votes[NGRAM_MAX_CANDIDATES];
    int32_t len = 0;
    int32_t n_cand =
        n_context >= 2 ? find_candidates(context, n_context, d->params.ngram_min, d->params.ngram_max, next, &len) : 0;
    double p_all = 1.0; /* estimated probability that every token drafted so far is accepted */
    int32_t nd = 0;
    while (nd < k) {
        if (n_cand == 0) {
            /* Nothing in the context continues the suffix: what other
             * requests' outputs did after it. */
            double p = 0.0;
            int32_t y = use_cache ? cache_lookup(&st->cache, context, n_context, sl->draft, nd, &p) : -1;
            if (y < 0) break;
            p_all *= p;
            if (p_all < d->params.ngram_min_p) break;
            sl->draft[nd] = y;
            sl->bucket[nd] = NGRAM_BUCKET_CACHE;
            nd++;
            continue;
        }
        /* Vote: each candidate proposes the token after its match; a
         * token most of them propose wins, else the most recent one's
         * (generation repeats what it just did: on the copy-heavy prompts
         * the plain most frequent token was accepted less often). */
        int32_t win = 0;
        for (int32_t c = 0; c < n_cand; c++) {
            int32_t y = virt_at(context, n_context, sl->draft, next[c]);
            votes[c] = 0;
            for (int32_t e = 0; e < n_cand; e++) votes[c] += virt_at(context, n_context, sl->draft, next[e]) == y;
            if (votes[c] > votes[win]) win = c;
        }
        if (2 * votes[win] <= n_cand) win = 0; /* no majority: the most recent */
        int32_t y = virt_at(context, n_context, sl->draft, next[win]);
        int b = len_bucket(len) + (votes[win] < n_cand ? NGRAM_LEN_BUCKETS : 0);
        p_all *= bucket_p(sl, b, greedy);
        if (p_all < d->params.ngram_min_p) break;
        sl->draft[nd] = y;
        sl->bucket[nd] = (uint8_t)b;
        nd++;
        /* Candidates that agreed now match one token longer; the others
         * drop out (their match with the drafted suffix is broken). */
        int32_t kept = 0;
        for (int32_t c = 0; c < n_cand; c++)
            if (virt_at(context, n_context, sl->draft, next[c]) == y) next[kept++] = next[c] + 1;
        n_cand = kept;
        if (len < d->params.ngram_max) len++;
    }
    for (int32_t i = 0; i < nd; i++) {
        tokens[i] = sl->draft[i];
        q[i] = (sd_spec_q){1, &sl->draft[i], &st->one};
    }
    sl->k = nd;
    sl->n_context = nd > 0 ? n_context : 0;
    sl->last_token = context[n_context - 1];
    sl->greedy = greedy;
    *n_drafted = nd;
    return SD_OK;
}

/* The batched path: the drafter keeps each slot's committed tokens (the
 * protocol sends only what is new), then looks up as ngram_propose does. */
static sd_status ngram_propose_batch(sd_drafter *d, int32_t n_seqs, const sd_draft_seq *seqs,
                                     sd_draft_result *results) {
    ngram_state *st = d->impl;
    const size_t max_ctx = (size_t)d->params.max_ctx;
    if (!st->history) {
        st->history = malloc((size_t)d->params.max_seqs * max_ctx * sizeof *st->history);
        st->history_len = calloc((size_t)d->params.max_seqs, sizeof *st->history_len);
        if (!st->history || !st->history_len) {
            free(st->history);
            free(st->history_len);
            st->history = st->history_len = NULL;
            SD_ERROR("drafter: out of memory for the n-gram drafter's histories");
            return SD_ERR_NOMEM;
        }
    }
    for (int32_t i = 0; i < n_seqs; i++) {
        const sd_draft_seq *v = &seqs[i];
        sd_draft_result *r = &results[i];
        if (r->outcome != SD_SEQ_OK) continue;
        if (st->history_len[v->slot] < v->keep_len) {
            r->outcome = SD_SEQ_CACHE_MISS;
            continue;
        }
        int32_t *h = st->history + (size_t)v->slot * max_ctx;
        memcpy(h + v->keep_len, v->append, (size_t)v->n_append * sizeof *h);
        int32_t n = v->keep_len + v->n_append;
        st->history_len[v->slot] = n;
        if (v->k > 0) SD_TRY(ngram_propose(d, v->slot, h, n, v->k, &v->sampling, r->tokens, r->q, &r->n_drafted));
    }
    return SD_OK;
}

static sd_status ngram_rollback(sd_drafter *d, int32_t seq, int32_t len) {
    ngram_state *st = d->impl;
    if (st->history_len && st->history_len[seq] > len) st->history_len[seq] = len;
    return SD_OK;
}

static void ngram_release(sd_drafter *d, int32_t seq) {
    ngram_state *st = d->impl;
    if (st->history_len) st->history_len[seq] = 0;
    memset(&st->slots[seq], 0, sizeof st->slots[seq]);
}

static void ngram_destroy(sd_drafter *d) {
    ngram_state *st = d->impl;
    if (st) {
        free(st->slots);
        free(st->cache.entries);
        free(st->history);
        free(st->history_len);
    }
    free(st);
    d->impl = NULL;
}

static const drafter_ops ngram_ops = {
    .name = "ngram",
    .propose = ngram_propose,
    .propose_batch = ngram_propose_batch,
    .rollback = ngram_rollback,
    .release = ngram_release,
    .destroy = ngram_destroy,
};

sd_status sd_drafter_ngram_create(const sd_drafter_params *p, sd_drafter **out) {
    if (!out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_drafter_params params;
    SD_TRY(drafter_params_check(p, &params));
    sd_drafter *d = calloc(1, sizeof *d);
    ngram_state *st = calloc(1, sizeof *st);
    ngram_slot *slots = calloc((size_t)params.max_seqs, sizeof *slots);
    if (!d || !st || !slots) {
        free(d);
        free(st);
        free(slots);
        SD_ERROR("drafter: out of memory creating the n-gram drafter");
        return SD_ERR_NOMEM;
    }
    st->one = 1.0f;
    st->slots = slots;
    if (params.ngram_cache_entries > 0) {
        st->cache.n_sets = (uint32_t)(params.ngram_cache_entries + NGRAM_CACHE_WAYS - 1) / NGRAM_CACHE_WAYS;
        st->cache.entries = calloc((size_t)st->cache.n_sets * NGRAM_CACHE_WAYS, sizeof *st->cache.entries);
        if (!st->cache.entries) {
            free(slots);
            free(st);
            free(d);
            SD_ERROR("drafter: out of memory for the n-gram cache (%d entries)", (int)params.ngram_cache_entries);
            return SD_ERR_NOMEM;
        }
    }
    d->kind = SD_DRAFTER_NGRAM;
    d->ops = &ngram_ops;
    d->params = params;
    d->impl = st;
    *out = d;
    return SD_OK;
}
