#include "data/synth.h"

#include <stdio.h>
#include <stdlib.h>
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

void synth_example_free(SynthExample *ex) {
    er_free(ex->problem);
    er_free(ex->answer);
    er_free(ex->direct);
    er_free(ex->terse);
    er_free(ex->concise);
    er_free(ex->verbose);
    memset(ex, 0, sizeof *ex);
}

// Moves a generated example's texts into ex (the completions in SynthStyle order); ER_ENOMEM, ex freed, when any
// ran out of memory.
static int example_take(SynthExample *ex, StrBuf *prob, StrBuf *ans, StrBuf *const *styles, int steps, int result,
                        const char *family, uint64_t index) {
    char **dst[SYNTH_NSTYLES] = {&ex->direct, &ex->terse, &ex->concise, &ex->verbose};
    int oom = prob->oom || ans->oom;
    ex->problem = prob->p;
    ex->answer = ans->p;
    for (int s = 0; s < SYNTH_NSTYLES; s++) {
        *dst[s] = styles[s]->p;
        oom |= styles[s]->oom;
    }
    ex->steps = steps;
    ex->result = result;
    if (oom) {
        synth_example_free(ex);
        return er_error(ER_ENOMEM, "%s: out of memory generating example %llu", family, (unsigned long long)index);
    }
    return ER_OK;
}

int chains_generate(const ChainsConfig *c, uint64_t seed, uint64_t index, SynthExample *ex) {
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

    return example_take(ex, &prob, &ans, (StrBuf *[]){&direct, &terse, &concise, &verbose}, k, v, "chains", index);
}

// The guess family's phrase pools (verbose trace). Placeholders: {g} the candidate, {v} its check value,
// {c} the target. None may contain "answer:" or digits of its own.
static const char *const gph_open[] = {
    "I will try values of x and check each one.",
    "Let me guess a value and check it.",
    "Let me check a few candidates.",
    "I will test numbers until one fits.",
};
static const char *const gph_pick[] = {
    "Let me try {g}.",
    "What about {g}?",
    "Next candidate: {g}.",
    "Maybe it is {g}.",
};
static const char *const gph_no[] = {
    "That gives {v}, not {c}.",
    "So {g} is wrong: {v} is not {c}.",
    "No match, {v} instead of {c}.",
};
static const char *const gph_yes[] = {
    "That gives {c} exactly, so {g} works.",
    "It matches: {v} is {c}.",
    "Yes, {g} fits.",
};
static const char *const gph_none[] = {
    "None of them fits; {g} came closest.",
    "No luck, the closest was {g}.",
};

static void put_gphrase(StrBuf *b, const char *t, int g, int v, int c) {
    for (; *t; t++) {
        if (*t == '{' && (t[1] == 'g' || t[1] == 'v' || t[1] == 'c') && t[2] == '}') {
            strbuf_int(b, t[1] == 'g' ? g : t[1] == 'v' ? v : c);
            t += 2;
        } else {
            strbuf_put(b, t, 1);
        }
    }
}

void guess_config_default(GuessConfig *c) {
    c->max_x = 12;
    c->min_factor = 2;
    c->max_factor = 5;
    c->max_offset = 9;
    c->max_tries = 4;
}

int guess_config_check(const GuessConfig *c) {
    if (c->max_x < 2 || c->max_x > 1000)
        return er_error(ER_ERANGE, "guess: max x %d must be in 2..1000", c->max_x);
    if (c->min_factor < 1 || c->max_factor > 1000 || c->min_factor > c->max_factor)
        return er_error(ER_ERANGE, "guess: factors must satisfy 1 <= min (%d) <= max (%d) <= 1000", c->min_factor,
                        c->max_factor);
    if (c->max_offset < 1 || c->max_offset > 1000)
        return er_error(ER_ERANGE, "guess: max offset %d must be in 1..1000", c->max_offset);
    if (c->max_tries < 1 || c->max_tries > c->max_x)
        return er_error(ER_ERANGE, "guess: max tries %d must be in 1..max x (%d)", c->max_tries, c->max_x);
    return ER_OK;
}

// "try 5: 5 * 4 + 3 = 23, 23 - 31 = -8, no": the check value minus the target, so the verdict reads one local token
// (the difference is 0 or not) instead of comparing two numbers.
static void put_try_line(StrBuf *b, int g, int a, int off, int target) {
    int v = g * a + off;
    strbuf_puts(b, "try ");
    strbuf_int(b, g);
    strbuf_puts(b, ": ");
    strbuf_int(b, g);
    strbuf_puts(b, " * ");
    strbuf_int(b, a);
    strbuf_puts(b, " + ");
    strbuf_int(b, off);
    strbuf_puts(b, " = ");
    strbuf_int(b, v);
    strbuf_puts(b, ", ");
    strbuf_int(b, v);
    strbuf_puts(b, " - ");
    strbuf_int(b, target);
    strbuf_puts(b, " = ");
    strbuf_int(b, v - target);
    strbuf_puts(b, v == target ? ", yes" : ", no");
}

int guess_generate(const GuessConfig *c, uint64_t seed, uint64_t index, SynthExample *ex) {
    memset(ex, 0, sizeof *ex);
    ER_TRY(guess_config_check(c));
    ErRng base, rng;
    rng_seed(&base, seed);
    rng_fork(&rng, &base, index);
    int x = 1 + (int)rng_below(&rng, (uint32_t)c->max_x);
    int a = c->min_factor + (int)rng_below(&rng, (uint32_t)(c->max_factor - c->min_factor + 1));
    int off = 1 + (int)rng_below(&rng, (uint32_t)c->max_offset), target = x * a + off;
    // The candidates: consecutive from a random start, wrapping from max_x to 1, cut after the answer or at
    // max_tries. The start is a trace's only free choice, so no candidate repeats within a trace.
    int tries[1000], n = 0, closest = 0, start = (int)rng_below(&rng, (uint32_t)c->max_x);
    for (int i = 0; i < c->max_tries; i++) {
        tries[i] = 1 + (start + i) % c->max_x;
        n++;
        if (abs(tries[i] - x) < abs(tries[closest] - x))
            closest = i;
        if (tries[i] == x)
            break;
    }
    int found = tries[n - 1] == x, said = tries[closest];

    StrBuf prob = {0}, ans = {0}, direct = {0}, terse = {0}, concise = {0}, verbose = {0};
    strbuf_puts(&prob, "Find x from 1 to ");
    strbuf_int(&prob, c->max_x);
    strbuf_puts(&prob, " such that x * ");
    strbuf_int(&prob, a);
    strbuf_puts(&prob, " + ");
    strbuf_int(&prob, off);
    strbuf_puts(&prob, " = ");
    strbuf_int(&prob, target);
    strbuf_puts(&prob, ".");
    strbuf_int(&ans, x);
    strbuf_puts(&direct, "Answer: ");
    strbuf_int(&direct, x);
    put_gphrase(&verbose, gph_open[rng_below(&rng, NPHR(gph_open))], 0, 0, target);
    strbuf_puts(&verbose, "\n");
    for (int i = 0; i < n; i++) {
        int g = tries[i], v = g * a + off;
        strbuf_int(&terse, g);
        strbuf_puts(&terse, g == x ? " yes" : " no ");
        put_try_line(&concise, g, a, off, target);
        strbuf_puts(&concise, "\n");
        if (rng_uniform(&rng) < 0.6f) {
            put_gphrase(&verbose, gph_pick[rng_below(&rng, NPHR(gph_pick))], g, v, target);
            strbuf_puts(&verbose, "\n");
        }
        put_try_line(&verbose, g, a, off, target);
        strbuf_puts(&verbose, "\n");
        if (g == x)
            put_gphrase(&verbose, gph_yes[rng_below(&rng, NPHR(gph_yes))], g, v, target);
        else
            put_gphrase(&verbose, gph_no[rng_below(&rng, NPHR(gph_no))], g, v, target);
        strbuf_puts(&verbose, "\n");
    }
    if (!found) {
        strbuf_puts(&terse, "closest ");
        strbuf_int(&terse, said);
        strbuf_puts(&concise, "closest: ");
        strbuf_int(&concise, said);
        strbuf_puts(&concise, "\n");
        put_gphrase(&verbose, gph_none[rng_below(&rng, NPHR(gph_none))], said, 0, target);
        strbuf_puts(&verbose, "\n");
    }
    strbuf_puts(&terse, "\nAnswer: ");
    strbuf_int(&terse, said);
    strbuf_puts(&concise, "Answer: ");
    strbuf_int(&concise, said);
    strbuf_puts(&verbose, "Answer: ");
    strbuf_int(&verbose, said);

    return example_take(ex, &prob, &ans, (StrBuf *[]){&direct, &terse, &concise, &verbose}, n, x, "guess", index);
}

const char *synth_completion(const SynthExample *ex, SynthStyle style) {
    switch (style) {
    case SYNTH_DIRECT: return ex->direct;
    case SYNTH_TERSE: return ex->terse;
    case SYNTH_CONCISE: return ex->concise;
    case SYNTH_VERBOSE: return ex->verbose;
    default: return NULL;
    }
}

// The record; with ntok (the completions' lengths in a tokenizer's tokens) also {"tokens": {style: n}}.
const char *synth_style_name(SynthStyle style) {
    static const char *const names[SYNTH_NSTYLES] = {"direct", "terse", "concise", "verbose"};
    return style >= 0 && style < SYNTH_NSTYLES ? names[style] : NULL;
}

static char *example_json(const SynthExample *ex, int needs_reasoning, const int *ntok) {
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    char *s = NULL;
    int ok = cJSON_AddStringToObject(o, "problem", ex->problem) && cJSON_AddStringToObject(o, "answer", ex->answer) &&
             cJSON_AddNumberToObject(o, "steps", ex->steps) &&
             cJSON_AddBoolToObject(o, "needs_reasoning", needs_reasoning);
    for (SynthStyle k = 0; ok && k < SYNTH_NSTYLES; k++)
        ok = cJSON_AddStringToObject(o, synth_style_name(k), synth_completion(ex, k)) != NULL;
    if (ok && ntok) {
        cJSON *t = cJSON_AddObjectToObject(o, "tokens");
        ok = t != NULL;
        for (SynthStyle k = 0; ok && k < SYNTH_NSTYLES; k++)
            ok = cJSON_AddNumberToObject(t, synth_style_name(k), ntok[k]) != NULL;
    }
    if (ok)
        s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

typedef int (*SynthGenerate)(const void *config, uint64_t seed, uint64_t index, SynthExample *ex);

static int chains_generate_any(const void *c, uint64_t seed, uint64_t index, SynthExample *ex) {
    return chains_generate(c, seed, index, ex);
}

static int guess_generate_any(const void *c, uint64_t seed, uint64_t index, SynthExample *ex) {
    return guess_generate(c, seed, index, ex);
}

// Example i as one JSONL line of af; its completions' characters and tokens, and its steps, added to the sums.
static int write_example(SynthGenerate gen, const void *c, int always_reason, uint64_t seed, long i,
                         const Tokenizer *tok, AtomicFile *af, const char *path, double *sum, double *sum_tok,
                         double *sum_steps) {
    SynthExample ex; // zeroed by the generator first thing
    char *line = NULL;
    int rc = ER_OK, ntok[SYNTH_NSTYLES] = {0};
    ER_CHECK(gen(c, seed, (uint64_t)i, &ex));
    for (int s = 0; s < SYNTH_NSTYLES; s++) {
        const char *text = synth_completion(&ex, (SynthStyle)s);
        sum[s] += (double)strlen(text);
        int *ids = NULL;
        if (tok)
            ER_CHECK(tok_encode(tok, text, strlen(text), &ids, &ntok[s]));
        sum_tok[s] += ntok[s];
        er_free(ids);
    }
    *sum_steps += ex.steps;
    if (!(line = example_json(&ex, always_reason || ex.steps > 1, tok ? ntok : NULL))) {
        rc = er_error(ER_ENOMEM, "%s: out of memory formatting example %ld", path, i);
        goto done;
    }
    if (fputs(line, af->fp) == EOF || fputc('\n', af->fp) == EOF)
        rc = er_error(ER_EIO, "%s: write failed", path);
done:
    cJSON_free(line);
    synth_example_free(&ex);
    return rc;
}

static int synth_write_jsonl(SynthGenerate gen, const void *c, int always_reason, long n, uint64_t seed,
                             const char *path, const Tokenizer *tok, SynthStats *stats) {
    if (n < 1)
        return er_error(ER_ERANGE, "synth: number of examples must be >= 1 (got %ld)", n);
    AtomicFile af;
    ER_TRY(atomic_open(&af, path));
    double sum[SYNTH_NSTYLES] = {0}, sum_tok[SYNTH_NSTYLES] = {0}, sum_steps = 0;
    for (long i = 0; i < n; i++) {
        int rc = write_example(gen, c, always_reason, seed, i, tok, &af, path, sum, sum_tok, &sum_steps);
        if (rc < 0) {
            atomic_abort(&af);
            return rc;
        }
    }
    ER_TRY(atomic_commit(&af));
    if (stats) {
        stats->n = n;
        for (int s = 0; s < SYNTH_NSTYLES; s++) {
            stats->mean_chars[s] = sum[s] / (double)n;
            stats->mean_tokens[s] = sum_tok[s] / (double)n;
        }
        stats->mean_steps = sum_steps / (double)n;
    }
    return ER_OK;
}

int chains_write_jsonl(const ChainsConfig *c, long n, uint64_t seed, const char *path, const Tokenizer *tok,
                       SynthStats *stats) {
    ER_TRY(chains_config_check(c));
    return synth_write_jsonl(chains_generate_any, c, 0, n, seed, path, tok, stats);
}

int guess_write_jsonl(const GuessConfig *c, long n, uint64_t seed, const char *path, const Tokenizer *tok,
                      SynthStats *stats) {
    ER_TRY(guess_config_check(c));
    return synth_write_jsonl(guess_generate_any, c, 1, n, seed, path, tok, stats);
}

// ---- the memory task: facts about made-up people and questions that paraphrase them ----

// An attribute: its values (words, or a number in lo..hi when words is NULL), the fact sentences that tell it and the
// questions that ask for it. Placeholders: {n} the person's name, {v} the value, {a} "a" or "an" before the value.
// No word of four letters or more in a fact template is in any question template of the same attribute (the test
// checks it on generated pairs), so the question matches its fact by the name alone, never by the attribute's words.
typedef struct {
    const char *name;
    const char *const *words;
    int lo, hi;
    const char *facts[3];     // NULL-terminated
    const char *questions[5]; // NULL-terminated
} MemAttr;

static const char *const mv_job[] = {"glassblower", "beekeeper", "carpenter", "cartographer", "locksmith", "tailor",
                                     "potter", "baker", "surveyor", "blacksmith", "florist", "astronomer", NULL};
static const char *const mv_city[] = {"Veltrin", "Oskaro", "Brindmere", "Calvask", "Duneth", "Farrowgate",
                                      "Istremo", "Kolvane", "Marrowick", "Pellinor", "Quessary", "Thornvale", NULL};
static const char *const mv_pet[] = {"ferret", "parrot", "tortoise", "hamster", "iguana", "goldfish",
                                     "rabbit", "beagle", "canary", "hedgehog", "gecko", "poodle", NULL};
static const char *const mv_colour[] = {"teal", "crimson", "amber", "violet", "indigo", "ochre",
                                        "scarlet", "turquoise", "maroon", "lavender", "olive", "magenta", NULL};
static const char *const mv_instrument[] = {"cello", "oboe", "harp", "banjo", "flute", "tuba", "violin",
                                            "clarinet", "accordion", "trombone", "harmonica", "bagpipes", NULL};
static const char *const mv_food[] = {"dumplings", "lasagna", "paella", "pancakes", "risotto", "curry",
                                      "sushi", "goulash", "porridge", "tacos", "ramen", "falafel", NULL};
static const char *const mv_sport[] = {"rowing", "fencing", "archery", "curling", "badminton", "judo",
                                       "lacrosse", "cricket", "squash", "polo", "hockey", "karate", NULL};
static const char *const mv_language[] = {"Norvish", "Keldari", "Ossetran", "Vaellic", "Durmish", "Pallanese",
                                          "Tirrish", "Quenyari", "Ambrian", "Solvene", "Gharic", "Yennish", NULL};

static const MemAttr mem_attrs[MEMORY_TASK_NATTRS] = {
    {"job", mv_job, 0, 0, {"{n} works as {a} {v}.", "{n} is employed as {a} {v}."},
     {"What is {n}'s job?", "What does {n} do for a living?", "What is {n}'s occupation?",
      "Which profession does {n} have?"}},
    {"city", mv_city, 0, 0, {"{n} lives in {v}.", "{n} has settled in {v}."},
     {"Which town is {n}'s home?", "Where is {n} based?", "In which city does {n} reside?",
      "What place does {n} call home?"}},
    {"pet", mv_pet, 0, 0, {"{n} has a pet {v}.", "{n} owns {a} {v}."},
     {"What animal does {n} keep?", "Which creature lives with {n}?", "What kind of animal is {n}'s companion?"}},
    {"colour", mv_colour, 0, 0, {"{n}'s favourite colour is {v}.", "The colour {n} loves most is {v}."},
     {"Which hue does {n} prefer?", "What shade does {n} like best?", "What is {n}'s preferred tint?"}},
    {"age", NULL, 19, 88, {"{n} is {v} years old.", "{n} has lived for {v} years."},
     {"What is {n}'s age?", "What age has {n} reached?", "Tell me the age of {n}."}},
    {"lucky_number", NULL, 2, 99, {"{n}'s lucky number is {v}.", "For {n}, {v} is the luckiest number."},
     {"What figure does {n} believe brings good fortune?", "Which integer does {n} think is fortunate?",
      "What is the fortunate figure of {n}?"}},
    {"instrument", mv_instrument, 0, 0, {"{n} plays the {v}.", "{n} practises the {v} every evening."},
     {"Which musical instrument does {n} know?", "What instrument can {n} perform on?",
      "What does {n} make music with?"}},
    {"food", mv_food, 0, 0, {"{n}'s favourite dish is {v}.", "{n} could eat {v} every day."},
     {"What meal does {n} enjoy most?", "Which food makes {n} happiest?", "What does {n} like to have for dinner?"}},
    {"sport", mv_sport, 0, 0, {"{n} competes in {v}.", "{n} trains for {v} tournaments."},
     {"Which sport does {n} play?", "What game is {n} good at?", "In what athletic pursuit does {n} take part?"}},
    {"language", mv_language, 0, 0, {"{n} speaks {v} fluently.", "{n} grew up talking {v}."},
     {"Which language does {n} know?", "What tongue does {n} converse in?", "In which language does {n} chat?"}},
};

// A name word is a syllable of each list: 20 x 20 = 400 words, and a name two of them (MEMORY_TASK_MAX_ENTITIES).
static const char *const name_head[20] = {"zor", "quen", "vel", "mar", "tik", "bro", "sel", "dag", "fen", "lor",
                                          "nim", "pra", "rud", "kas", "hol", "wex", "gim", "tor", "yal", "jun"};
static const char *const name_tail[20] = {"vin", "bim", "dra", "vos", "mel", "tun", "rik", "sha", "gal", "pod",
                                          "wen", "zim", "rax", "lun", "fer", "ost", "kel", "bix", "dor", "ath"};
#define NAME_WORDS 400

static int count_null_terminated(const char *const *p) {
    int n = 0;
    while (p[n])
        n++;
    return n;
}

void memory_task_config_default(MemoryTaskConfig *c) { c->facts_per_entity = 8; }

int memory_task_config_check(const MemoryTaskConfig *c) {
    if (c->facts_per_entity < 1 || c->facts_per_entity > MEMORY_TASK_NATTRS)
        return er_error(ER_ERANGE, "memory: facts per person %d must be in 1..%d (the attributes there are)",
                        c->facts_per_entity, MEMORY_TASK_NATTRS);
    return ER_OK;
}

void memory_fact_free(MemoryFact *f) {
    er_free(f->entity);
    er_free(f->text);
    er_free(f->question);
    er_free(f->answer);
    memset(f, 0, sizeof *f);
}

// Person e's name: e through a keyed permutation of the 400 x 400 name pairs (a four-round Feistel network on
// Z_400 x Z_400, each round (l, r) -> (r, l + F(r) mod 400), a bijection whatever F is), so every person of a seed
// has a name of their own while person e's name depends only on (seed, e).
static void put_name(StrBuf *b, const ErRng *key, uint64_t e) {
    uint32_t l = (uint32_t)(e / NAME_WORDS), r = (uint32_t)(e % NAME_WORDS);
    for (uint64_t round = 0; round < 4; round++) {
        ErRng f;
        rng_fork(&f, key, round * NAME_WORDS + r);
        uint32_t t = (l + rng_below(&f, NAME_WORDS)) % NAME_WORDS;
        l = r, r = t;
    }
    uint32_t words[2] = {l, r};
    for (int w = 0; w < 2; w++) {
        char word[16];
        snprintf(word, sizeof word, "%s%s", name_head[words[w] / 20], name_tail[words[w] % 20]);
        word[0] = (char)(word[0] - 'a' + 'A');
        if (w)
            strbuf_puts(b, " ");
        strbuf_puts(b, word);
    }
}

static void put_template(StrBuf *b, const char *t, const char *name, const char *value) {
    for (; *t; t++) {
        if (t[0] == '{' && t[1] && t[2] == '}') {
            const char *a = strchr("aeiouAEIOU", value[0]) ? "an" : "a";
            strbuf_puts(b, t[1] == 'n' ? name : t[1] == 'v' ? value : a);
            t += 2;
        } else {
            strbuf_put(b, t, 1);
        }
    }
}

int memory_task_generate(const MemoryTaskConfig *c, uint64_t seed, uint64_t index, MemoryFact *f) {
    memset(f, 0, sizeof *f);
    ER_TRY(memory_task_config_check(c));
    uint64_t e = index / (uint64_t)c->facts_per_entity;
    if (e >= MEMORY_TASK_MAX_ENTITIES)
        return er_error(ER_ERANGE, "memory: fact %llu would be about person %llu, past the %d distinct names",
                        (unsigned long long)index, (unsigned long long)e, MEMORY_TASK_MAX_ENTITIES);
    // Three streams: the names' key, the people (their attributes and values), the facts (their phrasings).
    ErRng base, names, people, facts, person, rng;
    rng_seed(&base, seed);
    rng_fork(&names, &base, 0);
    rng_fork(&people, &base, 1);
    rng_fork(&facts, &base, 2);
    rng_fork(&person, &people, e);
    rng_fork(&rng, &facts, index);

    // The person's attributes in a random order (facts e * fpe .. are the first fpe of it), and a value for each.
    int order[MEMORY_TASK_NATTRS], value[MEMORY_TASK_NATTRS];
    for (int a = 0; a < MEMORY_TASK_NATTRS; a++)
        order[a] = a;
    for (int a = MEMORY_TASK_NATTRS - 1; a > 0; a--) {
        int j = (int)rng_below(&person, (uint32_t)a + 1), t = order[a];
        order[a] = order[j], order[j] = t;
    }
    for (int a = 0; a < MEMORY_TASK_NATTRS; a++) {
        const MemAttr *at = &mem_attrs[a];
        int n = at->words ? count_null_terminated(at->words) : at->hi - at->lo + 1;
        value[a] = (at->words ? 0 : at->lo) + (int)rng_below(&person, (uint32_t)n);
    }
    int a = order[index % (uint64_t)c->facts_per_entity];
    const MemAttr *at = &mem_attrs[a];
    char num[16];
    snprintf(num, sizeof num, "%d", value[a]);
    const char *v = at->words ? at->words[value[a]] : num;

    StrBuf name = {0}, text = {0}, question = {0}, answer = {0};
    put_name(&name, &names, e);
    const char *nm = name.p ? name.p : "";
    put_template(&text, at->facts[rng_below(&rng, (uint32_t)count_null_terminated(at->facts))], nm, v);
    put_template(&question, at->questions[rng_below(&rng, (uint32_t)count_null_terminated(at->questions))], nm, v);
    strbuf_puts(&answer, v);
    f->entity = name.p, f->text = text.p, f->question = question.p, f->answer = answer.p;
    f->attribute = at->name;
    if (name.oom || text.oom || question.oom || answer.oom) {
        memory_fact_free(f);
        return er_error(ER_ENOMEM, "memory: out of memory generating fact %llu", (unsigned long long)index);
    }
    return ER_OK;
}

// Fact i's two JSONL lines: its store entry and its question.
static int memory_fact_lines(const MemoryFact *f, long i, char **fact_line, char **question_line) {
    *fact_line = *question_line = NULL;
    cJSON *o = cJSON_CreateObject(), *q = cJSON_CreateObject(), *m = cJSON_CreateObject();
    int ok = o && q && m && cJSON_AddStringToObject(o, "text", f->text) &&
             cJSON_AddStringToObject(m, "entity", f->entity) && cJSON_AddStringToObject(m, "attribute", f->attribute) &&
             cJSON_AddNumberToObject(m, "fact", (double)i) && cJSON_AddItemToObject(o, "metadata", m);
    if (ok)
        m = NULL; // o owns it now
    ok = ok && cJSON_AddStringToObject(q, "problem", f->question) && cJSON_AddStringToObject(q, "answer", f->answer) &&
         cJSON_AddNumberToObject(q, "fact", (double)i) && cJSON_AddStringToObject(q, "attribute", f->attribute);
    if (ok && (*fact_line = cJSON_PrintUnformatted(o)) && !(*question_line = cJSON_PrintUnformatted(q))) {
        cJSON_free(*fact_line);
        *fact_line = NULL;
    }
    cJSON_Delete(o), cJSON_Delete(q), cJSON_Delete(m);
    return *fact_line ? ER_OK : er_error(ER_ENOMEM, "memory: out of memory formatting fact %ld", i);
}

static int put_line(AtomicFile *af, const char *line) {
    if (fputs(line, af->fp) == EOF || fputc('\n', af->fp) == EOF)
        return er_error(ER_EIO, "%s: write failed", af->path);
    return ER_OK;
}

int memory_task_write_dir(const MemoryTaskConfig *c, long n, uint64_t seed, const char *dir) {
    ER_TRY(memory_task_config_check(c));
    if (n < 1)
        return er_error(ER_ERANGE, "memory: number of facts must be >= 1 (got %ld)", n);
    if ((n - 1) / c->facts_per_entity >= MEMORY_TASK_MAX_ENTITIES)
        return er_error(ER_ERANGE, "memory: %ld facts at %d per person need more than the %d distinct names", n,
                        c->facts_per_entity, MEMORY_TASK_MAX_ENTITIES);
    // Both files are written into a staging dir beside dir and moved in together once whole.
    char *stage = NULL, *fact_path = NULL, *question_path = NULL, *fl = NULL, *ql = NULL;
    AtomicFile facts = {0}, questions = {0};
    MemoryFact f = {0};
    int rc = ER_OK;
    ER_CHECK(dir_stage_open(dir, &stage));
    fact_path = path_join(stage, "facts.jsonl");
    question_path = path_join(stage, "questions.jsonl");
    if (!fact_path || !question_path)
        ER_CHECK(er_error(ER_ENOMEM, "out of memory"));
    ER_CHECK(atomic_open(&facts, fact_path));
    ER_CHECK(atomic_open(&questions, question_path));
    for (long i = 0; i < n; i++) {
        ER_CHECK(memory_task_generate(c, seed, (uint64_t)i, &f));
        ER_CHECK(memory_fact_lines(&f, i, &fl, &ql));
        ER_CHECK(put_line(&facts, fl));
        ER_CHECK(put_line(&questions, ql));
        cJSON_free(fl), cJSON_free(ql);
        fl = ql = NULL;
        memory_fact_free(&f);
    }
    ER_CHECK(atomic_commit(&facts)); // a committed (or never opened) AtomicFile is zeroed: its abort is a no-op
    ER_CHECK(atomic_commit(&questions));
    rc = dir_stage_move_into(stage, dir);
    stage = NULL;
done:
    atomic_abort(&facts);
    atomic_abort(&questions);
    cJSON_free(fl), cJSON_free(ql);
    memory_fact_free(&f);
    dir_stage_abort(stage);
    er_free(fact_path), er_free(question_path);
    return rc;
}
