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
