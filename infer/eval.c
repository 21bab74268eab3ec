// The eval runner (infer/eval.h).
#include "infer/eval.h"

#include <string.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/progress.h"
#include "data/chat.h"
#include "data/dataset.h"
#include "data/grade.h"
#include "infer/pipeline.h"

void eval_config_default(EvalConfig *c) {
    memset(c, 0, sizeof *c);
    er_gen_params_init(&c->params);
    static const int vote_n[] = {1, 2, 4, 8};
    memcpy(c->vote_n, vote_n, sizeof vote_n);
    c->n_vote_n = 4;
    c->n_shards = 1;
}

double eval_accuracy(const EvalResult *res) {
    long right = res->pipeline && res->n_rows > 0 ? res->rows[res->n_rows - 1].weighted : res->correct;
    return res->items ? (double)right / (double)res->items : 0.0;
}

// The example's conversation with `system` in front (replacing the record's own system message).
static int eval_messages(const Example *ex, const char *system, ErMessage **out, int *n) {
    int cap = ex->n_messages + 1;
    ChatMessage *cm = er_calloc((size_t)cap, sizeof *cm);
    ErMessage *m = er_calloc((size_t)cap, sizeof *m);
    if (!cm || !m) {
        er_free(cm);
        er_free(m);
        return ER_ENOMEM;
    }
    int k = chat_set_system(cm, cap, ex->messages, ex->n_messages, system);
    for (int i = 0; i < k; i++)
        m[i] = (ErMessage){cm[i].role, cm[i].content};
    er_free(cm);
    *out = m;
    *n = k;
    return ER_OK;
}

// One sample of the last generate call as a JSONL record's object.
static int eval_sample_json(const ErSample *x, int ok, int think_open, cJSON *arr) {
    char *answer = NULL;
    ER_TRY(grade_answer(x->text, x->answer_at, think_open, &answer));
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        er_free(answer);
        return ER_ENOMEM;
    }
    cJSON_AddItemToArray(arr, o);
    cJSON_AddStringToObject(o, "text", x->text);
    if (answer)
        cJSON_AddStringToObject(o, "answer", answer);
    else
        cJSON_AddNullToObject(o, "answer");
    er_free(answer);
    cJSON_AddBoolToObject(o, "correct", ok);
    cJSON_AddBoolToObject(o, "unformatted", !answer);
    cJSON_AddNumberToObject(o, "n_tokens", x->n_tokens);
    cJSON_AddNumberToObject(o, "think_len", x->think_len);
    cJSON_AddStringToObject(o, "finish", runner_finish_name(x->finish));
    cJSON_AddBoolToObject(o, "budget_cut", x->budget_cut);
    if (x->answer_at >= 0) // where the forced answer starts: what a grader reads (data/grade.h)
        cJSON_AddNumberToObject(o, "answer_at", (double)x->answer_at);
    else
        cJSON_AddNullToObject(o, "answer_at");
    return ER_OK;
}

// Grades every sample of the last generate call (think_open: their prefix opened a think block); adds
// them to res and, when rec is not NULL, to a JSONL record.
static int eval_grade(const ErSession *s, const Example *ex, int think_open, EvalResult *res, cJSON *rec) {
    if (rec && er_result_count(s) > 0) {
        const ErSample *x0 = er_result_sample(s, 0);
        int ok0 = grade_response(x0->text, x0->answer_at, think_open, ex->answer, NULL);
        ER_TRY(ok0);
        cJSON_AddBoolToObject(rec, "correct", ok0);
    }
    cJSON *arr = rec ? cJSON_AddArrayToObject(rec, "samples") : NULL;
    if (rec && !arr)
        return ER_ENOMEM;
    int any = 0;
    for (int i = 0; i < er_result_count(s); i++) {
        const ErSample *x = er_result_sample(s, i);
        int unformatted, ok = grade_response(x->text, x->answer_at, think_open, ex->answer, &unformatted);
        ER_TRY(ok);
        if (i == 0)
            res->correct += ok;
        any |= ok;
        res->tokens += x->n_tokens;
        res->think_tokens += x->think_len;
        res->unformatted += unformatted;
        res->samples++;
        if (rec)
            ER_TRY(eval_sample_json(x, ok, think_open, arr));
    }
    res->any_correct += any;
    res->items++;
    return ER_OK;
}

// Writes one record as a JSONL line.
static int eval_write(AtomicFile *af, cJSON *rec) {
    char *txt = cJSON_PrintUnformatted(rec);
    if (!txt)
        return ER_ENOMEM;
    int bad = fputs(txt, af->fp) < 0 || fputc('\n', af->fp) == EOF;
    cJSON_free(txt);
    return bad ? er_error(ER_EIO, "%s: write failed", af->path) : ER_OK;
}

// The votes over the first row->n samples of a pipeline result: majority and weighted correct, tokens.
static int eval_vote_prefix(const ErSession *s, const ErRoute *r, const char *gold, EvalVoteRow *row) {
    int n = row->n < er_result_count(s) ? row->n : er_result_count(s);
    for (int i = 0; i < n; i++)
        row->tokens += er_result_sample(s, i)->n_tokens;
    for (int weighted = 0; weighted <= 1; weighted++) {
        if (weighted && !r->verifier_scores && r->route == ER_ROUTE_DIRECT) {
            int ok = grade_answer_correct(r->answer, gold); // the direct route: its one answer
            ER_TRY(ok);
            row->weighted += ok;
            continue;
        }
        Vote *v;
        int nv, w;
        // Without a verifier the weighted vote is the plain majority vote.
        ER_TRY(pipeline_vote((char *const *)r->answers, weighted ? r->verifier_scores : NULL, r->verifier_scores, n,
                             &v, &nv, &w));
        int ok = grade_answer_correct(w >= 0 ? v[w].answer : NULL, gold);
        votes_free(v, nv);
        ER_TRY(ok);
        if (weighted)
            row->weighted += ok;
        else
            row->majority += ok;
    }
    return ER_OK;
}

// A pipeline item: the route, the votes of every row, the samples, and the greedy answer (the
// direct answer, or one greedy reasoning sample: a second call, after the first call's results
// have been used).
static int eval_route(ErSession *s, const ErGenParams *p, const ErMessage *msgs, int n, const Example *ex,
                      cJSON *rec, EvalResult *res) {
    const ErRoute *route = er_result_route(s);
    int ok = grade_answer_correct(route->answer, ex->answer), reasoning = route->route == ER_ROUTE_REASONING;
    res->routed += reasoning;
    ER_TRY(ok);
    for (int k = 0; k < res->n_rows; k++)
        ER_TRY(eval_vote_prefix(s, route, ex->answer, &res->rows[k]));
    if (rec) {
        cJSON *rj = runner_session_route_json(s);
        if (!rj)
            return ER_ENOMEM;
        cJSON_AddItemToObject(rec, "pipeline", rj);
        cJSON_AddBoolToObject(rec, "answer_correct", ok);
    }
    // The route's own prefix: none on the direct route, or a hybrid model's closed (empty) think block.
    ER_TRY(eval_grade(s, ex, grade_think_opens(route->response_prefix), res, rec));
    int gok = ok;
    if (reasoning) {
        ErGenParams pg = *p;
        pg.n_samples = 1;
        pg.temperature = 0;
        ER_TRY(er_generate(s, msgs, n, &pg, NULL, NULL));
        const ErRoute *r2 = er_result_route(s);
        gok = r2 ? grade_answer_correct(r2->answer, ex->answer) : 0;
        ER_TRY(gok);
    }
    res->greedy_correct += gok;
    if (rec)
        cJSON_AddBoolToObject(rec, "greedy_correct", gok);
    return ER_OK;
}

// Generates and grades one item; af (NULL = no output) gets its record. think_open: the response
// prefix the reasoning samples start with opens a think block.
static int eval_item(const EvalConfig *c, ErSession *s, const ErGenParams *p, const Example *ex, int think_open,
                     AtomicFile *af, EvalResult *res) {
    int rc = ER_OK;
    ErMessage *msgs = NULL;
    int n = 0;
    cJSON *rec = NULL;
    ER_CHECK(eval_messages(ex, c->system, &msgs, &n));
    double t0 = time_now();
    rc = er_generate(s, msgs, n, p, NULL, NULL);
    res->gen_s += time_now() - t0;
    ER_CHECK(rc);
    if (af) {
        rec = cJSON_CreateObject();
        if (!rec) {
            rc = ER_ENOMEM;
            goto done;
        }
        cJSON_AddNumberToObject(rec, "line", (double)ex->line);
        cJSON_AddStringToObject(rec, "prompt", ex->prompt);
        cJSON_AddStringToObject(rec, "gold", ex->answer);
    }
    if (er_result_route(s)) // a route ran (heads, or a forced one): its own prefix, e.g. a hybrid model's think block
        think_open = grade_think_opens(er_result_route(s)->response_prefix);
    if (res->pipeline && er_result_route(s))
        ER_CHECK(eval_route(s, p, msgs, n, ex, rec, res));
    else
        ER_CHECK(eval_grade(s, ex, think_open, res, rec));
    if (rec)
        ER_CHECK(eval_write(af, rec));
done:
    cJSON_Delete(rec);
    er_free(msgs);
    return rc;
}

// The rows of a pipeline run: vote_n in ascending order (the last row is the largest N, the
// pipeline's own answer).
static int eval_rows(const EvalConfig *c, EvalResult *res) {
    if (c->n_vote_n < 1 || c->n_vote_n > EVAL_VOTE_N_MAX)
        return er_error(ER_EINVAL, "eval: expected 1 to %d vote sample counts, got %d", EVAL_VOTE_N_MAX, c->n_vote_n);
    for (int i = 0; i < c->n_vote_n; i++) {
        if (c->vote_n[i] < 1)
            return er_error(ER_EINVAL, "eval: vote sample count %d is below 1", c->vote_n[i]);
        int j = i;
        for (; j > 0 && res->rows[j - 1].n > c->vote_n[i]; j--)
            res->rows[j] = res->rows[j - 1];
        res->rows[j] = (EvalVoteRow){.n = c->vote_n[i]};
    }
    res->n_rows = c->n_vote_n;
    return ER_OK;
}

// Every record must have a gold answer, and there must be one.
static int eval_check_data(const Dataset *d, const char *path) {
    if (d->n == 0)
        return er_error(ER_EFORMAT, "%s: no records", path);
    for (int i = 0; i < d->n; i++)
        if (!d->ex[i].answer)
            return er_error(ER_EFORMAT, "%s:%ld: record has no gold answer (\"answer\", a \\boxed{} solution or a "
                            "\"#### X\" line)", path, d->ex[i].line);
    return ER_OK;
}

int eval_run(const EvalConfig *c, EvalResult *res) {
    if (!c || !res || !c->data || !c->session.model)
        return er_error(ER_EINVAL, "eval_run: NULL config, result, data or model");
    memset(res, 0, sizeof *res);
    int rc = ER_OK;
    Dataset d = {0};
    ErModel *m = NULL;
    ErSession *s = NULL;
    AtomicFile af = {0};
    ErGenParams p = c->params;
    res->pipeline = c->session.switcher || c->session.verifier;
    if (res->pipeline) {
        ER_CHECK(eval_rows(c, res));
        p.n_samples = res->rows[res->n_rows - 1].n;
    }
    if (c->n_shards < 1 || c->shard < 0 || c->shard >= c->n_shards)
        ER_CHECK(er_error(ER_EINVAL, "eval_run: shard %d of %d", c->shard, c->n_shards));
    if (c->output) { // before any work: an output in the way, or the dataset itself, fails now
        ER_CHECK(file_output_check(c->output));
        ER_CHECK(file_output_not_input(c->output, c->data, "--data"));
    }
    ER_CHECK(dataset_load(c->data, NULL, c->limit, &d));
    ER_CHECK(eval_check_data(&d, c->data));
    // This shard's records [lo, hi): the whole set is read and checked above on every shard.
    int lo = (int)((long)d.n * c->shard / c->n_shards), hi = (int)((long)d.n * (c->shard + 1) / c->n_shards);
    ER_CHECK(runner_open_session(&c->session, p.n_samples, p.max_new_tokens, &m, &s));
    if (c->output)
        ER_CHECK(atomic_open(&af, c->output));
    if (c->log && res->pipeline && p.temperature == 0 && p.n_samples > 1)
        fprintf(c->log, "eval: warning: with --temperature 0 the %d reasoning samples are identical (the paper "
                        "samples at 0.8)\n", p.n_samples);
    char note[1400];
    if (c->log && runner_heads_kv_note(&c->session, note, sizeof note))
        fprintf(c->log, "eval: warning: %s\n", note);
    if (c->on_progress)
        c->on_progress(c->user, 0, hi - lo, 0.0);
    // The prefix the responses start with (as er_generate picks it): the answer follows its think block.
    int think_open = grade_think_opens(p.response_prefix ? p.response_prefix : er_model_reasoning_prefix(m));
    for (int i = lo; i < hi; i++) {
        rc = eval_item(c, s, &p, &d.ex[i], think_open, c->output ? &af : NULL, res);
        if (rc < 0) {
            rc = er_error_prefix(rc, "%s:%ld", c->data, d.ex[i].line);
            goto done;
        }
        if (c->on_progress)
            c->on_progress(c->user, i + 1 - lo, hi - lo, eval_accuracy(res));
    }
    if (c->output)
        ER_CHECK(atomic_commit(&af));
done:
    atomic_abort(&af); // nothing left to remove after a commit
    er_session_free(s);
    er_model_free(m);
    dataset_free(&d);
    return rc;
}
