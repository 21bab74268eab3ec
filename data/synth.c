#include "data/synth.h"

#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/strbuf.h"
#include "core/rng.h"

typedef enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV } Op;

static const char op_sym[] = {'+', '-', '*', '/'};
static const char op_inv[] = {'-', '+', '/', '*'};
static const char *const op_verb[] = {"add", "subtract", "multiply by", "divide by"};
static const char *const op_title[] = {"Add", "Subtract", "Multiply by", "Divide by"};

typedef struct {
    Op op;
    int a, b, r; // a op b = r
} Step;

// Phrase pools for the verbose trace. Placeholders: {a} value before, {b} operand, {r} result,
// {op} "add 5", {sym}/{inv} the operator and its inverse, {w} a plausible wrong result, {i} the step
// number. None may contain "answer:" (the grader keys on the last one) or digits of its own.
static const char *const phr_open[] = {
    "We start with {a}.",
    "The starting number is {a}.",
    "Let me begin with {a}.",
    "Okay, the initial value is {a}.",
    "First, note that we start from {a}.",
};
static const char *const phr_intro[] = {
    "Next, we {op}.",
    "The next step says to {op}.",
    "Now I need to {op}.",
    "Step {i}: {op}.",
    "Then we have to {op}.",
    "The instruction is to {op}.",
};
static const char *const phr_check[] = {
    "Let me double-check: {r} {inv} {b} = {a}, so {r} is right.",
    "Checking again: {a} {sym} {b} is {r}.",
    "Wait, let me verify that. {a} {sym} {b} = {r}. Yes.",
    "Hmm, is it {w}? No, {a} {sym} {b} = {r}.",
    "To be safe, I will recompute: {a} {sym} {b} gives {r}.",
    "Let me make sure I did not slip: going back, {r} {inv} {b} = {a}. Good.",
    "Actually, wait. Could it be {w}? Let me redo it: {a} {sym} {b} = {r}. No, {r} is correct.",
};
static const char *const phr_restate[] = {
    "So now we have {r}.",
    "The current value is {r}.",
    "That leaves us with {r}.",
    "Okay, {r} so far.",
    "So after step {i}, the number is {r}.",
};
static const char *const phr_recap[] = {
    "Let me go over the whole chain once more: ",
    "Before answering, let me retrace every step: ",
    "Going through it all again to be sure: ",
};
static const char *const phr_final[] = {
    "So the result is {r}.",
    "Therefore the final value is {r}.",
    "That means the result is {r}.",
    "Everything checks out, so we end at {r}.",
};

#define NPHR(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))

static void put_phrase(StrBuf *b, const char *t, const Step *s, int step_no, int wrong) {
    while (*t) {
        if (*t != '{') {
            const char *e = strchr(t, '{');
            size_t n = e ? (size_t)(e - t) : strlen(t);
            strbuf_put(b, t, n);
            t += n;
            continue;
        }
        const char *e = strchr(t, '}');
        size_t n = (size_t)(e - t + 1);
        if (strncmp(t, "{a}", n) == 0)
            strbuf_int(b, s->a);
        else if (strncmp(t, "{b}", n) == 0)
            strbuf_int(b, s->b);
        else if (strncmp(t, "{r}", n) == 0)
            strbuf_int(b, s->r);
        else if (strncmp(t, "{w}", n) == 0)
            strbuf_int(b, wrong);
        else if (strncmp(t, "{i}", n) == 0)
            strbuf_int(b, step_no);
        else if (strncmp(t, "{sym}", n) == 0)
            strbuf_put(b, &op_sym[s->op], 1);
        else if (strncmp(t, "{inv}", n) == 0)
            strbuf_put(b, &op_inv[s->op], 1);
        else if (strncmp(t, "{op}", n) == 0) {
            strbuf_puts(b, op_verb[s->op]);
            strbuf_puts(b, " ");
            strbuf_int(b, s->b);
        }
        t += n;
    }
}

static void put_step_line(StrBuf *b, const Step *s) {
    strbuf_int(b, s->a);
    strbuf_puts(b, " ");
    strbuf_put(b, &op_sym[s->op], 1);
    strbuf_puts(b, " ");
    strbuf_int(b, s->b);
    strbuf_puts(b, " = ");
    strbuf_int(b, s->r);
}

void chains_config_default(ChainsConfig *c) {
    c->min_steps = 1;
    c->max_steps = CHAINS_MAX_STEPS;
    c->max_start = 20;
    c->max_operand = 9;
    c->max_factor = 3;
    c->max_value = 49;
}

int chains_config_check(const ChainsConfig *c) {
    if (c->min_steps < 1 || c->max_steps > CHAINS_MAX_STEPS || c->min_steps > c->max_steps)
        return er_error(ER_ERANGE, "chains: steps must satisfy 1 <= min (%d) <= max (%d) <= %d", c->min_steps,
                        c->max_steps, CHAINS_MAX_STEPS);
    if (c->max_value < 2 || c->max_value > 1000000)
        return er_error(ER_ERANGE, "chains: max value %d must be in 2..1000000", c->max_value);
    if (c->max_start < 1 || c->max_start > c->max_value)
        return er_error(ER_ERANGE, "chains: max start %d must be in 1..max value (%d)", c->max_start, c->max_value);
    if (c->max_operand < 1 || c->max_operand > c->max_value)
        return er_error(ER_ERANGE, "chains: max operand %d must be in 1..max value (%d)", c->max_operand,
                        c->max_value);
    if (c->max_factor < 2 || c->max_factor > c->max_value)
        return er_error(ER_ERANGE, "chains: max factor %d must be in 2..max value (%d)", c->max_factor, c->max_value);
    return ER_OK;
}

static int imin(int a, int b) { return a < b ? a : b; }

// Draws one operation whose result stays in 0..max_value. Add or subtract always fits (v is in
// range and max_value >= 2), so a choice always exists.
static Step draw_step(const ChainsConfig *c, ErRng *rng, int v) {
    Op ok[4];
    int nok = 0;
    if (v < c->max_value)
        ok[nok++] = OP_ADD;
    if (v > 0)
        ok[nok++] = OP_SUB;
    if (v > 0 && 2 * v <= c->max_value)
        ok[nok++] = OP_MUL;
    int divisors[64], ndiv = 0;
    for (int d = 2; d <= c->max_factor && ndiv < 64; d++)
        if (v > 0 && v % d == 0)
            divisors[ndiv++] = d;
    if (ndiv)
        ok[nok++] = OP_DIV;
    Step s = {ok[rng_below(rng, (uint32_t)nok)], v, 0, 0};
    switch (s.op) {
    case OP_ADD:
        s.b = 1 + (int)rng_below(rng, (uint32_t)imin(c->max_operand, c->max_value - v));
        s.r = v + s.b;
        break;
    case OP_SUB:
        s.b = 1 + (int)rng_below(rng, (uint32_t)imin(c->max_operand, v));
        s.r = v - s.b;
        break;
    case OP_MUL:
        s.b = 2 + (int)rng_below(rng, (uint32_t)(imin(c->max_factor, c->max_value / v) - 1));
        s.r = v * s.b;
        break;
    case OP_DIV:
        s.b = divisors[rng_below(rng, (uint32_t)ndiv)];
        s.r = v / s.b;
        break;
    }
    return s;
}

// A wrong value a second guess might propose: off by one or by ten, never negative, never right.
static int draw_wrong(ErRng *rng, int r) {
    static const int delta[] = {1, -1, 10, -10, 2};
    for (;;) {
        int w = r + delta[rng_below(rng, 5)];
        if (w >= 0 && w != r)
            return w;
    }
}

void chains_example_free(ChainsExample *ex) {
    er_free(ex->problem);
    er_free(ex->answer);
    er_free(ex->direct);
    er_free(ex->terse);
    er_free(ex->concise);
    er_free(ex->verbose);
    memset(ex, 0, sizeof *ex);
}

int chains_generate(const ChainsConfig *c, uint64_t seed, uint64_t index, ChainsExample *ex) {
    memset(ex, 0, sizeof *ex);
    ER_TRY(chains_config_check(c));
    ErRng base, rng;
    rng_seed(&base, seed);
    rng_fork(&rng, &base, index);

    int k = c->min_steps + (int)rng_below(&rng, (uint32_t)(c->max_steps - c->min_steps + 1));
    int v0 = 1 + (int)rng_below(&rng, (uint32_t)c->max_start), v = v0;
    Step steps[CHAINS_MAX_STEPS];
    for (int i = 0; i < k; i++) {
        steps[i] = draw_step(c, &rng, v);
        v = steps[i].r;
    }

    StrBuf prob = {0}, ans = {0}, direct = {0}, terse = {0}, concise = {0}, verbose = {0};
    strbuf_puts(&prob, "Start with ");
    strbuf_int(&prob, v0);
    strbuf_puts(&prob, ".");
    for (int i = 0; i < k; i++) {
        strbuf_puts(&prob, " ");
        strbuf_puts(&prob, op_title[steps[i].op]);
        strbuf_puts(&prob, " ");
        strbuf_int(&prob, steps[i].b);
        strbuf_puts(&prob, ".");
    }
    strbuf_puts(&prob, " What is the result?");
    strbuf_int(&ans, v);
    strbuf_puts(&direct, "Answer: ");
    strbuf_int(&direct, v);
    for (int i = 0; i < k; i++) {
        if (i)
            strbuf_puts(&terse, " ");
        strbuf_int(&terse, steps[i].r);
    }
    strbuf_puts(&terse, "\nAnswer: ");
    strbuf_int(&terse, v);
    for (int i = 0; i < k; i++) {
        put_step_line(&concise, &steps[i]);
        strbuf_puts(&concise, "\n");
    }
    strbuf_puts(&concise, "Answer: ");
    strbuf_int(&concise, v);

    // Verbose: every concise line appears verbatim, wrapped in redundant talk.
    Step start = {OP_ADD, v0, 0, v0};
    put_phrase(&verbose, phr_open[rng_below(&rng, NPHR(phr_open))], &start, 0, 0);
    strbuf_puts(&verbose, "\n");
    // Per step: an optional restatement of the instruction, the concise line, often one re-check
    // or second guess, sometimes the running value again; then sometimes a recap of the
    // whole chain. Tuned to ~3.5x the concise length in tiny-tokenizer tokens (~5.5x in characters).
    for (int i = 0; i < k; i++) {
        const Step *s = &steps[i];
        if (rng_uniform(&rng) < 0.5f) {
            put_phrase(&verbose, phr_intro[rng_below(&rng, NPHR(phr_intro))], s, i + 1, 0);
            strbuf_puts(&verbose, "\n");
        }
        put_step_line(&verbose, s);
        strbuf_puts(&verbose, "\n");
        if (rng_uniform(&rng) < 0.6f) {
            put_phrase(&verbose, phr_check[rng_below(&rng, NPHR(phr_check))], s, i + 1, draw_wrong(&rng, s->r));
            strbuf_puts(&verbose, "\n");
        }
        if (rng_uniform(&rng) < 0.3f) {
            put_phrase(&verbose, phr_restate[rng_below(&rng, NPHR(phr_restate))], s, i + 1, 0);
            strbuf_puts(&verbose, "\n");
        }
    }
    if (k > 1 && rng_uniform(&rng) < 0.4f) {
        strbuf_puts(&verbose, phr_recap[rng_below(&rng, NPHR(phr_recap))]);
        for (int i = 0; i < k; i++) {
            if (i)
                strbuf_puts(&verbose, ", ");
            put_step_line(&verbose, &steps[i]);
        }
        strbuf_puts(&verbose, ".\n");
    }
    put_phrase(&verbose, phr_final[rng_below(&rng, NPHR(phr_final))], &steps[k - 1], k, 0);
    strbuf_puts(&verbose, "\nAnswer: ");
    strbuf_int(&verbose, v);

    ex->problem = prob.p;
    ex->answer = ans.p;
    ex->direct = direct.p;
    ex->terse = terse.p;
    ex->concise = concise.p;
    ex->verbose = verbose.p;
    ex->steps = k;
    ex->result = v;
    if (prob.oom || ans.oom || direct.oom || terse.oom || concise.oom || verbose.oom) {
        chains_example_free(ex);
        return er_error(ER_ENOMEM, "chains: out of memory generating example %llu", (unsigned long long)index);
    }
    return ER_OK;
}

const char *chains_completion(const ChainsExample *ex, ChainsStyle style) {
    switch (style) {
    case CHAINS_DIRECT: return ex->direct;
    case CHAINS_TERSE: return ex->terse;
    case CHAINS_CONCISE: return ex->concise;
    case CHAINS_VERBOSE: return ex->verbose;
    default: return NULL;
    }
}

// The record; with ntok (the completions' lengths in a tokenizer's tokens) also {"tokens": {style: n}}.
const char *chains_style_name(ChainsStyle style) {
    static const char *const names[CHAINS_NSTYLES] = {"direct", "terse", "concise", "verbose"};
    return style >= 0 && style < CHAINS_NSTYLES ? names[style] : NULL;
}

static char *example_json(const ChainsExample *ex, const int *ntok) {
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    char *s = NULL;
    int ok = cJSON_AddStringToObject(o, "problem", ex->problem) && cJSON_AddStringToObject(o, "answer", ex->answer) &&
             cJSON_AddNumberToObject(o, "steps", ex->steps) &&
             cJSON_AddBoolToObject(o, "needs_reasoning", ex->steps > 1);
    for (ChainsStyle k = 0; ok && k < CHAINS_NSTYLES; k++)
        ok = cJSON_AddStringToObject(o, chains_style_name(k), chains_completion(ex, k)) != NULL;
    if (ok && ntok) {
        cJSON *t = cJSON_AddObjectToObject(o, "tokens");
        ok = t != NULL;
        for (ChainsStyle k = 0; ok && k < CHAINS_NSTYLES; k++)
            ok = cJSON_AddNumberToObject(t, chains_style_name(k), ntok[k]) != NULL;
    }
    if (ok)
        s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

// Example i as one JSONL line of af; its completions' characters and tokens, and its steps, added to the sums.
static int write_example(const ChainsConfig *c, uint64_t seed, long i, const Tokenizer *tok, AtomicFile *af,
                         const char *path, double *sum, double *sum_tok, double *sum_steps) {
    ChainsExample ex; // zeroed by chains_generate first thing
    char *line = NULL;
    int rc = ER_OK, ntok[CHAINS_NSTYLES] = {0};
    ER_CHECK(chains_generate(c, seed, (uint64_t)i, &ex));
    for (int s = 0; s < CHAINS_NSTYLES; s++) {
        const char *text = chains_completion(&ex, (ChainsStyle)s);
        sum[s] += (double)strlen(text);
        int *ids = NULL;
        if (tok)
            ER_CHECK(tok_encode(tok, text, strlen(text), &ids, &ntok[s]));
        sum_tok[s] += ntok[s];
        er_free(ids);
    }
    *sum_steps += ex.steps;
    if (!(line = example_json(&ex, tok ? ntok : NULL))) {
        rc = er_error(ER_ENOMEM, "%s: out of memory formatting example %ld", path, i);
        goto done;
    }
    if (fputs(line, af->fp) == EOF || fputc('\n', af->fp) == EOF)
        rc = er_error(ER_EIO, "%s: write failed", path);
done:
    cJSON_free(line);
    chains_example_free(&ex);
    return rc;
}

int chains_write_jsonl(const ChainsConfig *c, long n, uint64_t seed, const char *path, const Tokenizer *tok,
                       ChainsStats *stats) {
    ER_TRY(chains_config_check(c));
    if (n < 1)
        return er_error(ER_ERANGE, "chains: number of examples must be >= 1 (got %ld)", n);
    AtomicFile af;
    ER_TRY(atomic_open(&af, path));
    double sum[CHAINS_NSTYLES] = {0}, sum_tok[CHAINS_NSTYLES] = {0}, sum_steps = 0;
    for (long i = 0; i < n; i++) {
        int rc = write_example(c, seed, i, tok, &af, path, sum, sum_tok, &sum_steps);
        if (rc < 0) {
            atomic_abort(&af);
            return rc;
        }
    }
    ER_TRY(atomic_commit(&af));
    if (stats) {
        stats->n = n;
        for (int s = 0; s < CHAINS_NSTYLES; s++) {
            stats->mean_chars[s] = sum[s] / (double)n;
            stats->mean_tokens[s] = sum_tok[s] / (double)n;
        }
        stats->mean_steps = sum_steps / (double)n;
    }
    return ER_OK;
}
