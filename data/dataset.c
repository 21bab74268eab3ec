#include "data/dataset.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "data/grade.h"

void example_free(Example *ex) {
    for (int i = 0; i < ex->n_messages; i++) {
        er_free((char *)ex->messages[i].role);
        er_free((char *)ex->messages[i].content);
    }
    er_free(ex->messages);
    er_free(ex->prompt);
    er_free(ex->response);
    er_free(ex->text);
    er_free(ex->answer);
    memset(ex, 0, sizeof *ex);
    ex->budget = -1;
    ex->needs_reasoning = -1;
}

static int set_str(char **dst, const char *s, const char *ctx) {
    er_free(*dst);
    *dst = er_strdup(s);
    return *dst ? ER_OK : er_error(ER_ENOMEM, "%s: out of memory", ctx);
}

static int add_message(Example *ex, const char *role, const char *content, const char *ctx) {
    ChatMessage *m = er_realloc_array(ex->messages, (size_t)ex->n_messages + 1, sizeof *m);
    if (!m)
        return er_error(ER_ENOMEM, "%s: out of memory", ctx);
    ex->messages = m;
    m += ex->n_messages;
    m->role = er_strdup(role);
    m->content = er_strdup(content);
    ex->n_messages++; // counted even when a copy failed, so example_free releases the other one
    if (!m->role || !m->content)
        return er_error(ER_ENOMEM, "%s: out of memory", ctx);
    return ER_OK;
}

// "answer" may be a string or a number (some exports store integers as numbers).
static int get_answer(const cJSON *obj, const char *ctx, char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "answer");
    if (!v || cJSON_IsNull(v))
        return ER_OK;
    if (cJSON_IsString(v))
        return set_str(out, v->valuestring, ctx);
    if (cJSON_IsNumber(v) && isfinite(v->valuedouble)) {
        char t[64];
        double d = v->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0)
            snprintf(t, sizeof t, "%lld", (long long)d);
        else
            snprintf(t, sizeof t, "%.17g", d);
        return set_str(out, t, ctx);
    }
    return er_error(ER_EFORMAT, "%s: field \"answer\" must be a string or a number", ctx);
}

static const char *const roles[] = {"system", "user", "assistant", "tool"};

static int parse_messages(const cJSON *obj, const cJSON *msgs, const char *ctx, Example *ex) {
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return er_error(ER_EFORMAT, "%s: field \"messages\" must be a non-empty list of {\"role\", \"content\"}", ctx);
    int n = cJSON_GetArraySize(msgs), i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m))
            return er_error(ER_EFORMAT, "%s: messages[%d] must be an object with \"role\" and \"content\"", ctx, i);
        if (!cJSON_IsString(role))
            return er_error(ER_EFORMAT, "%s: messages[%d].role %s", ctx, i, role ? "must be a string" : "is missing");
        if (!cJSON_IsString(content))
            return er_error(ER_EFORMAT, "%s: messages[%d].content %s", ctx, i,
                            content ? "must be a string" : "is missing");
        int known = 0;
        for (int r = 0; r < 4; r++)
            known |= strcmp(role->valuestring, roles[r]) == 0;
        if (!known)
            return er_error(ER_EFORMAT, "%s: messages[%d].role is \"%s\" (expected system, user, assistant or tool)",
                            ctx, i, role->valuestring);
        if (i == n - 1 && n > 1 && strcmp(role->valuestring, "assistant") == 0)
            ER_TRY(set_str(&ex->response, content->valuestring, ctx));
        else
            ER_TRY(add_message(ex, role->valuestring, content->valuestring, ctx));
        i++;
    }
    for (int j = ex->n_messages - 1; j >= 0 && !ex->prompt; j--)
        if (strcmp(ex->messages[j].role, "user") == 0)
            ER_TRY(set_str(&ex->prompt, ex->messages[j].content, ctx));
    if (!ex->prompt)
        return er_error(ER_EFORMAT, "%s: field \"messages\" has no user message before the response", ctx);
    return get_answer(obj, ctx, &ex->answer);
}

// The prompt is a single user turn holding `text`.
static int set_prompt(Example *ex, const char *text, const char *ctx) {
    ER_TRY(set_str(&ex->prompt, text, ctx));
    return add_message(ex, "user", text, ctx);
}

static int parse_record(const cJSON *obj, const DatasetOptions *opt, const char *ctx, Example *ex) {
    const char *s = NULL, *resp = NULL;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(obj, "messages");
    if (msgs && !cJSON_IsNull(msgs)) {
        ER_TRY(parse_messages(obj, msgs, ctx, ex));
    } else if (cJSON_GetObjectItemCaseSensitive(obj, "prompt")) {
        ER_TRY(json_get_string(obj, "prompt", &s, ctx));
        ER_TRY(set_prompt(ex, s, ctx));
        ER_TRY(json_opt_string(obj, "completion", &resp, ctx));
        ER_TRY(get_answer(obj, ctx, &ex->answer));
    } else if (cJSON_GetObjectItemCaseSensitive(obj, "problem")) {
        ER_TRY(json_get_string(obj, "problem", &s, ctx));
        ER_TRY(set_prompt(ex, s, ctx));
        ER_TRY(json_opt_string(obj, "solution", &resp, ctx));
        ER_TRY(get_answer(obj, ctx, &ex->answer));
        if (!ex->answer && resp && grade_extract(resp, &ex->answer) < 0)
            return er_error(ER_ENOMEM, "%s: out of memory", ctx);
    } else if (cJSON_GetObjectItemCaseSensitive(obj, "question")) {
        ER_TRY(json_get_string(obj, "question", &s, ctx));
        ER_TRY(set_prompt(ex, s, ctx));
        ER_TRY(json_get_string(obj, "answer", &resp, ctx));
        const char *mark = strstr(resp, "####");
        for (const char *p = mark; p; p = strstr(p + 1, "####"))
            mark = p;
        if (!mark)
            return er_error(ER_EFORMAT, "%s: field \"answer\" has no \"#### <final answer>\" line", ctx);
        const char *a = mark + 4, *e;
        while (*a == ' ' || *a == '\t')
            a++;
        for (e = a + strcspn(a, "\n"); e > a && (e[-1] == ' ' || e[-1] == '\r' || e[-1] == '\t'); e--)
            ;
        if (e == a)
            return er_error(ER_EFORMAT, "%s: field \"answer\" has an empty \"####\" final answer", ctx);
        ex->answer = er_alloc((size_t)(e - a) + 1);
        if (!ex->answer)
            return er_error(ER_ENOMEM, "%s: out of memory", ctx);
        memcpy(ex->answer, a, (size_t)(e - a));
        ex->answer[e - a] = 0;
    } else if (cJSON_GetObjectItemCaseSensitive(obj, "text")) {
        // Raw text has nothing to pick a response from or grade against: the other fields are ignored.
        ER_TRY(json_get_string(obj, "text", &s, ctx));
        if (!s[0])
            return er_error(ER_EFORMAT, "%s: field \"text\" is empty", ctx);
        return set_str(&ex->text, s, ctx);
    } else {
        return er_error(ER_EFORMAT, "%s: expected a \"messages\", \"prompt\", \"problem\", \"question\" or \"text\" field",
                        ctx);
    }
    // A gold answer with nothing in it ("", "$ $", "\\boxed{}") equals no response: refused, not graded wrong.
    if (ex->answer) {
        char *norm;
        ER_TRY(grade_normalize(ex->answer, &norm));
        int empty = !norm[0];
        er_free(norm);
        if (empty)
            return er_error(ER_EFORMAT, "%s: the gold answer \"%.60s\" is empty", ctx, ex->answer);
    }
    if (opt && opt->response_key)
        ER_TRY(json_get_string(obj, opt->response_key, &resp, ctx));
    if (resp)
        ER_TRY(set_str(&ex->response, resp, ctx));

    const cJSON *bj = cJSON_GetObjectItemCaseSensitive(obj, "budget");
    if (bj && !cJSON_IsNull(bj)) {
        int64_t budget;
        ER_TRY(json_get_int(obj, "budget", &budget, ctx));
        if (budget < 1 || budget > INT_MAX)
            return er_error(ER_EFORMAT, "%s: field \"budget\" must be a positive number of tokens (got %lld)", ctx,
                            (long long)budget);
        ex->budget = (int)budget;
    }
    ER_TRY(json_opt_bool(obj, "needs_reasoning", &ex->needs_reasoning, ctx));
    return ER_OK;
}

int example_from_json(const cJSON *obj, const DatasetOptions *opt, const char *ctx, Example *ex) {
    memset(ex, 0, sizeof *ex);
    ex->budget = -1;
    ex->needs_reasoning = -1;
    if (!cJSON_IsObject(obj))
        return er_error(ER_EFORMAT, "%s: record must be a JSON object", ctx);
    int rc = parse_record(obj, opt, ctx, ex);
    if (rc < 0)
        example_free(ex);
    return rc;
}

int dataset_open(DatasetReader *r, const char *path, const DatasetOptions *opt) {
    memset(r, 0, sizeof *r);
    if (opt)
        r->opt = *opt;
    return jsonl_open(&r->jr, path);
}

int dataset_next(DatasetReader *r, Example *ex) {
    memset(ex, 0, sizeof *ex);
    cJSON *obj;
    int rc = jsonl_next(&r->jr, &obj);
    if (rc <= 0)
        return rc;
    char ctx[512];
    snprintf(ctx, sizeof ctx, "%s:%ld", r->jr.path, r->jr.lineno);
    rc = example_from_json(obj, &r->opt, ctx, ex);
    cJSON_Delete(obj);
    if (rc < 0)
        return rc;
    ex->line = r->jr.lineno;
    return 1;
}

void dataset_close(DatasetReader *r) { jsonl_close(&r->jr); }

void dataset_free(Dataset *d) {
    for (int i = 0; i < d->n; i++)
        example_free(&d->ex[i]);
    er_free(d->ex);
    memset(d, 0, sizeof *d);
}

static int dataset_push(Dataset *d, Example *ex) {
    if (d->n == d->cap) {
        if (d->cap >= INT_MAX / 2)
            return er_error(ER_ERANGE, "dataset: more than %d examples", d->cap);
        int cap = d->cap ? 2 * d->cap : 64;
        Example *e = er_realloc_array(d->ex, (size_t)cap, sizeof *e);
        if (!e)
            return ER_ENOMEM;
        d->ex = e;
        d->cap = cap;
    }
    d->ex[d->n++] = *ex;
    return ER_OK;
}

int dataset_load(const char *path, const DatasetOptions *opt, int max_examples, Dataset *d) {
    memset(d, 0, sizeof *d);
    DatasetReader r;
    ER_TRY(dataset_open(&r, path, opt));
    Example ex;
    int rc = ER_OK;
    while (max_examples <= 0 || d->n < max_examples) {
        int got = dataset_next(&r, &ex);
        ER_CHECK(got);
        if (got == 0)
            break;
        if ((rc = dataset_push(d, &ex)) < 0) {
            example_free(&ex);
            goto done;
        }
    }
done:
    dataset_close(&r);
    if (rc < 0)
        dataset_free(d);
    return rc;
}

void shuffle_indices(int *idx, int n, ErRng *rng) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)rng_below(rng, (uint32_t)i + 1);
        int t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

void dataset_shuffle(Dataset *d, ErRng *rng) {
    for (int i = d->n - 1; i > 0; i--) {
        int j = (int)rng_below(rng, (uint32_t)i + 1);
        Example t = d->ex[i];
        d->ex[i] = d->ex[j];
        d->ex[j] = t;
    }
}

int dataset_split(Dataset *d, int n_eval, ErRng *rng, Dataset *eval) {
    memset(eval, 0, sizeof *eval);
    if (n_eval < 0 || n_eval > d->n)
        return er_error(ER_ERANGE, "dataset: cannot hold out %d of %d examples for evaluation", n_eval, d->n);
    dataset_shuffle(d, rng);
    if (n_eval == 0)
        return ER_OK;
    eval->ex = er_realloc_array(NULL, (size_t)n_eval, sizeof *eval->ex);
    if (!eval->ex)
        return ER_ENOMEM;
    memcpy(eval->ex, d->ex + d->n - n_eval, (size_t)n_eval * sizeof *eval->ex);
    eval->n = eval->cap = n_eval;
    d->n -= n_eval;
    return ER_OK;
}

typedef struct {
    int len, pos, idx;
} LenKey;

// Ties keep the shuffled order, so the result depends only on the RNG.
static int cmp_len(const void *a, const void *b) {
    const LenKey *x = a, *y = b;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

void batches_free(Batches *b) {
    er_free(b->index);
    er_free(b->start);
    memset(b, 0, sizeof *b);
}

int batches_by_length(const int *lengths, int n, int batch_size, int bucket_batches, ErRng *rng, Batches *out) {
    memset(out, 0, sizeof *out);
    if (n < 0 || (n > 0 && !lengths) || batch_size < 1 || bucket_batches < 1)
        return er_error(ER_EINVAL, "batches: need n >= 0, batch size >= 1 and bucket size >= 1 (got %d, %d, %d)", n,
                        batch_size, bucket_batches);
    long bucket = (long)batch_size * bucket_batches;
    if (bucket > INT_MAX)
        bucket = INT_MAX;
    int nb = n / batch_size + (n % batch_size != 0);
    LenKey *keys = er_calloc((size_t)n + 1, sizeof *keys);
    int *order = er_calloc((size_t)nb + 1, sizeof *order);
    int *start = er_calloc((size_t)nb + 1, sizeof *start);
    int *index = er_calloc((size_t)n + 1, sizeof *index);
    if (!keys || !order || !start || !index) {
        er_free(keys);
        er_free(order);
        er_free(start);
        er_free(index);
        return ER_ENOMEM;
    }
    for (int i = 0; i < n; i++)
        index[i] = i;
    shuffle_indices(index, n, rng);
    for (int i = 0; i < n; i++)
        keys[i] = (LenKey){lengths[index[i]], i, index[i]};
    for (long b0 = 0; b0 < n; b0 += bucket) {
        long b1 = b0 + bucket < n ? b0 + bucket : n;
        qsort(keys + b0, (size_t)(b1 - b0), sizeof *keys, cmp_len);
    }
    // Batches in sorted order are keys[b * batch_size ...]; shuffle which one comes first.
    for (int b = 0; b < nb; b++)
        order[b] = b;
    shuffle_indices(order, nb, rng);
    int k = 0;
    for (int b = 0; b < nb; b++) {
        start[b] = k;
        int s = order[b] * batch_size, e = s + batch_size < n ? s + batch_size : n;
        for (int i = s; i < e; i++)
            index[k++] = keys[i].idx;
    }
    start[nb] = k;
    er_free(keys);
    er_free(order);
    out->index = index;
    out->start = start;
    out->n = n;
    out->n_batches = nb;
    return ER_OK;
}
