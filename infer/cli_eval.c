// erinfer eval: accuracy of a model on a JSONL dataset with gold answers, generated through the
// public API (infer/erinfer.h) and graded with data/grade.h. Sample 0 decides accuracy; with
// --samples N > 1 pass@N (any sample right) is printed too.
// With --switcher and/or --verifier the routed pipeline answers (see er_model_load_switcher), and a
// table compares, for each N of --vote-n (default 1,2,4,8): the greedy answer (the direct answer,
// or one greedy reasoning sample), the majority vote and the verifier-weighted vote over the first
// N samples, tokens per query and the share routed to reasoning. The largest N is generated once
// and smaller N take its first samples: sample i draws from stream i of the seed whatever the
// sample count (infer/engine.h), so these are exactly the N-sample runs.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "data/grade.h"
#include "infer/cli.h"
#include "infer/erinfer.h"
#include "infer/pipeline.h"

// The example's conversation with --system in front (replacing the record's own system message).
static int eval_messages(const Example *ex, const char *system, ErMessage **out, int *n) {
    int has_sys = ex->n_messages > 0 && strcmp(ex->messages[0].role, "system") == 0;
    ErMessage *m = er_calloc((size_t)ex->n_messages + 1, sizeof *m);
    if (!m)
        return ER_ENOMEM;
    int k = 0;
    if (system)
        m[k++] = (ErMessage){"system", system};
    for (int i = (system && has_sys) ? 1 : 0; i < ex->n_messages; i++)
        m[k++] = (ErMessage){ex->messages[i].role, ex->messages[i].content};
    *out = m;
    *n = k;
    return ER_OK;
}

typedef struct {
    long items, correct, any_correct, tokens, samples;
    double gen_s;
} EvalTotals;

// Grades every sample of the last generate call; adds them to t and, when rec is not NULL, to a
// JSONL record.
static int eval_grade(const ErSession *s, const Example *ex, EvalTotals *t, cJSON *rec) {
    if (rec && er_result_count(s) > 0) {
        int ok0 = grade_response(er_result_sample(s, 0)->text, er_result_sample(s, 0)->answer_at, ex->answer);
        if (ok0 < 0)
            return ok0;
        cJSON_AddBoolToObject(rec, "correct", ok0);
    }
    cJSON *arr = rec ? cJSON_AddArrayToObject(rec, "samples") : NULL;
    if (rec && !arr)
        return ER_ENOMEM;
    int any = 0;
    for (int i = 0; i < er_result_count(s); i++) {
        const ErSample *x = er_result_sample(s, i);
        int ok = grade_response(x->text, x->answer_at, ex->answer);
        if (ok < 0)
            return ok;
        if (i == 0)
            t->correct += ok;
        any |= ok;
        t->tokens += x->n_tokens;
        t->samples++;
        if (!rec)
            continue;
        char *answer = NULL;
        ER_TRY(grade_answer(x->text, x->answer_at, &answer));
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
        cJSON_AddNumberToObject(o, "n_tokens", x->n_tokens);
        cJSON_AddStringToObject(o, "finish", finish_name(x->finish));
        cJSON_AddBoolToObject(o, "budget_cut", x->budget_cut);
        if (x->answer_at >= 0) // where the forced answer starts: what a grader reads (data/grade.h)
            cJSON_AddNumberToObject(o, "answer_at", (double)x->answer_at);
        else
            cJSON_AddNullToObject(o, "answer_at");
    }
    t->any_correct += any;
    t->items++;
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

#define VOTE_N_MAX 16

static int parse_vote_n(const char *s, int *out, int *n) {
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 256 || *n >= VOTE_N_MAX || (*end && *end != ','))
            return er_error(ER_EINVAL, "--vote-n: expected up to %d sample counts in 1..256 separated by commas, got "
                            "\"%s\"", VOTE_N_MAX, s);
        out[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (*n == 0)
        return er_error(ER_EINVAL, "--vote-n is empty");
    for (int i = 1; i < *n; i++) // ascending: the last row is the largest N, the pipeline's own answer
        for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
            int x = out[j];
            out[j] = out[j - 1];
            out[j - 1] = x;
        }
    return ER_OK;
}

typedef struct {
    long majority, weighted, tokens;
} VoteTotals;

// The votes over the first n samples of a pipeline result: majority and weighted correct, tokens.
static int vote_prefix(const ErSession *s, const ErRoute *r, int n, const char *gold, VoteTotals *t) {
    if (n > er_result_count(s))
        n = er_result_count(s);
    for (int i = 0; i < n; i++)
        t->tokens += er_result_sample(s, i)->n_tokens;
    for (int weighted = 0; weighted <= 1; weighted++) {
        if (weighted && !r->verifier_scores && r->route == ER_ROUTE_DIRECT) {
            int ok = grade_answer_correct(r->answer, gold); // the direct route: its one answer
            if (ok < 0)
                return ok;
            t->weighted += ok;
            continue;
        }
        Vote *v;
        int nv, w;
        // Without a verifier the weighted vote is the plain majority vote.
        ER_TRY(pipeline_vote((char *const *)r->answers, weighted ? r->verifier_scores : NULL, r->verifier_scores, n,
                             &v, &nv, &w));
        int ok = grade_answer_correct(w >= 0 ? v[w].answer : NULL, gold);
        votes_free(v, nv);
        if (ok < 0)
            return ok;
        if (weighted)
            t->weighted += ok;
        else
            t->majority += ok;
    }
    return ER_OK;
}

int cmd_eval(int argc, char **argv) {
    GenFlags f;
    gen_flags_default(&f);
    const char *data = NULL, *output = NULL, *vote_n = "1,2,4,8";
    int limit = 0;
    ArgSpec specs[GEN_FLAGS_MAX + 5];
    int ns = gen_flags_specs(&f, specs);
    specs[ns++] = (ArgSpec){"data", ARG_STR, &data, "JSONL dataset with gold answers (see data/dataset.h)", 1, 0, 0};
    specs[ns++] = (ArgSpec){"output", ARG_STR, &output, "per-item JSONL results (written atomically)", 0, 0, 0};
    specs[ns++] = (ArgSpec){"limit", ARG_INT, &limit, "evaluate only the first N records (0 = all)", 0, 0, 1 << 30};
    specs[ns++] = (ArgSpec){"samples", ARG_INT, &f.samples, "parallel samples per item (sample 0 is graded for accuracy)",
                            0, 1, 256};
    specs[ns++] = (ArgSpec){"vote-n", ARG_STR, &vote_n, "with --switcher/--verifier: sample counts compared in the "
                            "table (the largest is generated, in place of --samples)", 0, 0, 0};
    int rc = args_parse(argc, argv, specs, ns,
                        "erinfer eval --model DIR --data FILE.jsonl [--output FILE.jsonl] [--limit N] [flags]");
    if (rc == ARGS_HELP)
        return 0;
    int pipe = f.switcher || f.verifier, ns_list[VOTE_N_MAX], n_list = 0, max_n = 0;
    if (rc == ER_OK && pipe) {
        rc = parse_vote_n(vote_n, ns_list, &n_list);
        for (int i = 0; i < n_list; i++)
            max_n = ns_list[i] > max_n ? ns_list[i] : max_n;
        f.samples = max_n;
    }
    ErGenParams p;
    int kv_int8 = 0;
    if (rc == ER_OK)
        rc = gen_flags_params(&f, &p, &kv_int8);
    if (rc < 0)
        return cli_fail("eval");
    threads_set(f.threads);

    // The whole file is read and checked before any generation: a bad record fails in seconds.
    Dataset d;
    if (dataset_load(data, NULL, limit, &d) < 0)
        return cli_fail("eval");
    if (d.n == 0)
        rc = er_error(ER_EFORMAT, "%s: no records", data);
    for (int i = 0; rc == ER_OK && i < d.n; i++)
        if (!d.ex[i].answer)
            rc = er_error(ER_EFORMAT, "%s:%ld: record has no gold answer (\"answer\", a \\boxed{} solution or a "
                          "\"#### X\" line)", data, d.ex[i].line);
    ErModel *m = NULL;
    ErSession *s = NULL;
    if (rc == ER_OK)
        rc = gen_flags_open(&f, f.samples, &m, &s);
    AtomicFile af = {0};
    int have_out = 0;
    if (rc == ER_OK && output) {
        rc = atomic_open(&af, output);
        have_out = rc == ER_OK;
    }

    if (rc == ER_OK && pipe && f.temperature == 0 && max_n > 1)
        fprintf(stderr, "eval: warning: with --temperature 0 the %d reasoning samples are identical (the paper samples "
                        "at 0.8)\n", max_n);
    EvalTotals t = {0};
    VoteTotals vt[VOTE_N_MAX] = {{0}};
    long routed = 0, greedy_ok = 0;
    Progress prog;
    progress_begin(&prog, stderr, "eval", "item", 0, d.n);
    for (int i = 0; rc == ER_OK && i < d.n; i++) {
        const Example *ex = &d.ex[i];
        ErMessage *msgs = NULL;
        int n = 0;
        cJSON *rec = NULL;
        rc = eval_messages(ex, f.system, &msgs, &n);
        double t0 = time_now();
        if (rc == ER_OK)
            rc = er_generate(s, msgs, n, &p, NULL, NULL);
        t.gen_s += time_now() - t0;
        if (rc == ER_OK && have_out) {
            rec = cJSON_CreateObject();
            if (!rec)
                rc = ER_ENOMEM;
            else {
                cJSON_AddNumberToObject(rec, "line", (double)ex->line);
                cJSON_AddStringToObject(rec, "prompt", ex->prompt);
                cJSON_AddStringToObject(rec, "gold", ex->answer);
            }
        }
        const ErRoute *route = rc == ER_OK && pipe ? er_result_route(s) : NULL;
        if (route) {
            int ok = grade_answer_correct(route->answer, ex->answer), reasoning = route->route == ER_ROUTE_REASONING;
            routed += reasoning;
            if (ok < 0)
                rc = ok;
            for (int k = 0; rc == ER_OK && k < n_list; k++)
                rc = vote_prefix(s, route, ns_list[k], ex->answer, &vt[k]);
            if (rc == ER_OK && rec) {
                cJSON *rj = route_json(s);
                if (!rj)
                    rc = ER_ENOMEM;
                else
                    cJSON_AddItemToObject(rec, "pipeline", rj);
                cJSON_AddBoolToObject(rec, "answer_correct", ok);
            }
            if (rc == ER_OK)
                rc = eval_grade(s, ex, &t, rec);
            // Greedy: the direct answer, or one greedy reasoning sample (a second call, after the
            // first call's results have been used).
            int gok = ok;
            if (rc == ER_OK && reasoning) {
                ErGenParams pg = p;
                pg.n_samples = 1;
                pg.temperature = 0;
                rc = er_generate(s, msgs, n, &pg, NULL, NULL);
                const ErRoute *r2 = rc == ER_OK ? er_result_route(s) : NULL;
                gok = r2 ? grade_answer_correct(r2->answer, ex->answer) : 0;
                if (gok < 0)
                    rc = gok;
            }
            if (rc == ER_OK) {
                greedy_ok += gok;
                if (rec)
                    cJSON_AddBoolToObject(rec, "greedy_correct", gok);
            }
        } else if (rc == ER_OK) {
            rc = eval_grade(s, ex, &t, rec);
        }
        if (rc == ER_OK && rec)
            rc = eval_write(&af, rec);
        if (rc < 0)
            rc = er_error_prefix(rc, "%s:%ld", data, ex->line);
        cJSON_Delete(rec);
        er_free(msgs);
        char extra[64];
        long right = pipe ? vt[n_list - 1].weighted : t.correct;
        snprintf(extra, sizeof extra, "accuracy %.3f", t.items ? (double)right / (double)t.items : 0.0);
        if (rc == ER_OK)
            progress_update(&prog, i + 1, extra);
    }
    if (rc == ER_OK) {
        char extra[64];
        snprintf(extra, sizeof extra, "accuracy %.3f",
                 (double)(pipe ? vt[n_list - 1].weighted : t.correct) / (double)t.items);
        progress_end(&prog, extra);
    } else if (prog.tty && prog.t_last_print > prog.t_start) {
        fputc('\n', stderr); // leave the bar's line before the error line
    }
    if (have_out) {
        if (rc == ER_OK)
            rc = atomic_commit(&af);
        else
            atomic_abort(&af);
    }
    if (rc == ER_OK && pipe) {
        double items = (double)t.items;
        int has_v = f.verifier != NULL;
        printf("pipeline: %ld/%ld queries routed to reasoning (%.1f%%)%s%s\n", routed, t.items, 100.0 * routed / items,
               f.switcher ? "" : " (no switcher: every query reasons when there is an adapter)",
               has_v ? "" : "; no verifier: the weighted column is the plain majority vote");
        printf("%5s %9s %9s %9s %13s %10s\n", "N", "greedy", "majority", "weighted", "tokens/query", "reasoning");
        for (int k = 0; k < n_list; k++)
            printf("%5d %9.4f %9.4f %9.4f %13.1f %10.3f\n", ns_list[k], greedy_ok / items, vt[k].majority / items,
                   (has_v ? vt[k].weighted : vt[k].majority) / items, vt[k].tokens / items, routed / items);
        long right = has_v ? vt[n_list - 1].weighted : vt[n_list - 1].majority;
        // The table's last row is the pipeline's own answer when N is the largest and last.
        printf("accuracy: %.4f (%ld/%ld) at N = %d\n", right / items, right, t.items, ns_list[n_list - 1]);
        printf("tokens/s: %.1f (%ld tokens in %.2f s)\n", t.gen_s > 0 ? (double)t.tokens / t.gen_s : 0.0, t.tokens,
               t.gen_s);
        if (output)
            printf("wrote %ld records to %s\n", t.items, output);
    } else if (rc == ER_OK) {
        printf("accuracy: %.4f (%ld/%ld)\n", (double)t.correct / (double)t.items, t.correct, t.items);
        if (f.samples > 1)
            printf("pass@%d: %.4f (%ld/%ld)\n", f.samples, (double)t.any_correct / (double)t.items, t.any_correct,
                   t.items);
        printf("mean generated tokens: %.1f per sample\n", (double)t.tokens / (double)t.samples);
        printf("tokens/s: %.1f (%ld tokens in %.2f s)\n", t.gen_s > 0 ? (double)t.tokens / t.gen_s : 0.0, t.tokens,
               t.gen_s);
        if (output)
            printf("wrote %ld records to %s\n", t.items, output);
    }
    er_session_free(s);
    er_model_free(m);
    dataset_free(&d);
    return rc < 0 ? cli_fail("eval") : 0;
}
