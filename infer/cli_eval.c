// erinfer eval: accuracy of a model on a JSONL dataset with gold answers, generated through the
// public API (infer/erinfer.h) and graded with data/grade.h. Sample 0 decides accuracy; with
// --samples N > 1 pass@N (any sample right) is printed too.
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
        int ok0 = grade_response(er_result_sample(s, 0)->text, ex->answer);
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
        int ok = grade_response(x->text, ex->answer);
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
        ER_TRY(grade_extract(x->text, &answer));
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

// Puts "file:line: " in front of the current error message.
static int eval_error_at(int rc, const char *path, long line) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", er_last_error());
    return er_error(rc, "%s:%ld: %s", path, line, msg);
}

int cmd_eval(int argc, char **argv) {
    GenFlags f;
    gen_flags_default(&f);
    const char *data = NULL, *output = NULL;
    int limit = 0;
    ArgSpec specs[GEN_FLAGS_MAX + 4];
    int ns = gen_flags_specs(&f, specs);
    specs[ns++] = (ArgSpec){"data", ARG_STR, &data, "JSONL dataset with gold answers (see data/dataset.h)", 1, 0, 0};
    specs[ns++] = (ArgSpec){"output", ARG_STR, &output, "per-item JSONL results (written atomically)", 0, 0, 0};
    specs[ns++] = (ArgSpec){"limit", ARG_INT, &limit, "evaluate only the first N records (0 = all)", 0, 0, 1 << 30};
    specs[ns++] = (ArgSpec){"samples", ARG_INT, &f.samples, "parallel samples per item (sample 0 is graded for accuracy)",
                            0, 1, 256};
    int rc = args_parse(argc, argv, specs, ns,
                        "erinfer eval --model DIR --data FILE.jsonl [--output FILE.jsonl] [--limit N] [flags]");
    if (rc == ARGS_HELP)
        return 0;
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

    EvalTotals t = {0};
    Progress prog;
    progress_begin(&prog, "eval", "item", d.n);
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
        if (rc == ER_OK)
            rc = eval_grade(s, ex, &t, rec);
        if (rc == ER_OK && rec)
            rc = eval_write(&af, rec);
        if (rc < 0)
            rc = eval_error_at(rc, data, ex->line);
        cJSON_Delete(rec);
        er_free(msgs);
        char extra[64];
        snprintf(extra, sizeof extra, "accuracy %.3f", t.items ? (double)t.correct / (double)t.items : 0.0);
        if (rc == ER_OK)
            progress_update(&prog, i + 1, extra);
    }
    if (rc == ER_OK) {
        char extra[64];
        snprintf(extra, sizeof extra, "accuracy %.3f", (double)t.correct / (double)t.items);
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
    if (rc == ER_OK) {
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
