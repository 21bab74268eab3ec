// The routed pipeline from the top: erinfer generate --json with --switcher and --verifier reports the
// route, the switcher score, each sample's length, answer and verifier score, the votes and the timings;
// the eval runner counts the N = 1, 2, 4, 8 rows and erinfer eval prints them (--vote-n chooses them);
// heads for another model and bad --vote-n fail with one line.
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/threads.h"
#include "infer/eval.h"

#include "tests/common/heads_helpers.h"

static HelperFixture fx; // per test: the temp dir, tmp/model with tmp/adapter, $ER_BUILD/erinfer

// tmp/sw and tmp/vf for the model in tmp/model; the switcher's threshold as given.
static void write_heads(float threshold) {
    heads_write_random_heads(fx.tmp, "sw", "vf", threshold, "\nIs this solution correct?");
}

static void setup(void) {
    helper_fixture_open(&fx, "er_pipe_cli_", "erinfer");
    heads_add_adapter(fx.tmp);
    write_heads(0.0f);
}
static void teardown(void) { helper_fixture_close(&fx); }
TestSuite(pipeline_cli, .init = setup, .fini = teardown);

static void need_erinfer(void) { helper_need_program(fx.prog, "erinfer", "pipeline CLI tests"); }

Test(pipeline_cli, generate_json_reports_route_scores_votes) {
    need_erinfer();
    CmdResult r = helper_run(fx.tmp,
                             "'%s' generate --model '%s/model' --adapter '%s/adapter' --switcher '%s/sw' --verifier "
                             "'%s/vf.safetensors' --prompt 'What is 2 + 3?' --samples 3 --max-new 30 --temperature 0.8 "
                             "--budget 6 --answer-tokens 12 --kv int8 --json --threads 1",
                             fx.prog, fx.tmp, fx.tmp, fx.tmp, fx.tmp);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cJSON *j = cJSON_Parse(r.out);
    cr_assert(j, "%s", r.out);
    cJSON *p = cJSON_GetObjectItem(j, "pipeline");
    cr_assert(p, "no pipeline object: %s", r.out);
    cr_assert_str_eq(cJSON_GetObjectItem(p, "route")->valuestring, "reasoning");
    cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(p, "switcher_score")));
    cJSON *samples = cJSON_GetObjectItem(p, "samples");
    cr_assert_eq(cJSON_GetArraySize(samples), 3);
    for (cJSON *s = samples->child; s; s = s->next) {
        cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(s, "n_tokens")));
        cr_assert_leq(cJSON_GetObjectItem(s, "n_tokens")->valueint, 6 + 12, "the hard budget holds");
        cr_assert(cJSON_GetObjectItem(s, "answer"));
        double v = cJSON_GetObjectItem(s, "verifier_score")->valuedouble;
        cr_assert(v > 0 && v < 1);
    }
    cr_assert(cJSON_IsArray(cJSON_GetObjectItem(p, "votes")));
    cr_assert(cJSON_GetObjectItem(p, "answer"));
    cJSON *t = cJSON_GetObjectItem(p, "timings");
    cr_assert(t && cJSON_GetObjectItem(t, "prefill_s") && cJSON_GetObjectItem(t, "verify_s"));
    cJSON_Delete(j);
    helper_result_free(&r);
    // A switcher threshold above every score sends the query to the base's direct answer (1 itself is
    // refused: such a switcher would never route).
    write_heads(0.9999f);
    r = helper_run(fx.tmp,
                   "'%s' generate --model '%s/model' --adapter '%s/adapter' --switcher '%s/sw' --verifier '%s/vf' "
                   "--prompt 'What is 2 + 3?' --samples 3 --max-new 10 --json --threads 1",
                   fx.prog, fx.tmp, fx.tmp, fx.tmp, fx.tmp);
    cr_assert_eq(r.status, 0, "%s", r.err);
    j = cJSON_Parse(r.out);
    p = cJSON_GetObjectItem(j, "pipeline");
    cr_assert_str_eq(cJSON_GetObjectItem(p, "route")->valuestring, "direct");
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "samples")), 1);
    cJSON_Delete(j);
    helper_result_free(&r);
}

// A head is NAME.safetensors + NAME.json: --switcher/--verifier take NAME, either file, or NAME.json
// (which looked for NAME.json.json).
Test(pipeline_cli, head_flags_take_either_file_or_the_stem) {
    need_erinfer();
    static const char *forms[][2] = {{"sw.json", "vf.json"}, {"sw.safetensors", "vf"}, {"sw", "vf.json"}};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        CmdResult r = helper_run(fx.tmp,
                                 "'%s' generate --model '%s/model' --adapter '%s/adapter' --switcher '%s/%s' "
                                 "--verifier '%s/%s' --prompt 'What is 2 + 3?' --samples 2 --max-new 6 --json "
                                 "--threads 1",
                                 fx.prog, fx.tmp, fx.tmp, fx.tmp, forms[i][0], fx.tmp, forms[i][1]);
        cr_assert_eq(r.status, 0, "--switcher %s --verifier %s: %s", forms[i][0], forms[i][1], r.err);
        cr_assert(strstr(r.out, "\"pipeline\""), "%s", r.out);
        helper_result_free(&r);
    }
    // A missing head is named by the file looked for, without a doubled suffix.
    CmdResult r = helper_run(fx.tmp,
                             "'%s' generate --model '%s/model' --adapter '%s/adapter' --verifier '%s/none.json' "
                             "--prompt 'What is 2 + 3?' --max-new 6 --threads 1",
                             fx.prog, fx.tmp, fx.tmp, fx.tmp);
    cr_assert_null(strstr(r.err, "none.json.json"), "%s", r.err);
    helper_expect_error(&r, "--verifier none.json", "none.json");
}

Test(pipeline_cli, eval_prints_the_table) {
    char *data = heads_make_data(fx.tmp, "eval.jsonl", 3, 4);
    char model[512], adapter[512], sw[512], vf[512], out[512];
    snprintf(model, sizeof model, "%s/model", fx.tmp);
    snprintf(adapter, sizeof adapter, "%s/adapter", fx.tmp);
    snprintf(sw, sizeof sw, "%s/sw", fx.tmp);
    snprintf(vf, sizeof vf, "%s/vf", fx.tmp);
    snprintf(out, sizeof out, "%s/out.jsonl", fx.tmp);
    threads_set(1);
    EvalConfig c;
    eval_config_default(&c);
    c.session = (SessionSpec){.model = model, .adapter = adapter, .switcher = sw, .verifier = vf};
    c.data = data;
    c.output = out;
    c.params.max_new_tokens = 8;
    c.params.temperature = 0.8f;
    EvalResult res;
    cr_assert_eq(eval_run(&c, &res), 0, "%s", er_last_error());
    cr_assert(res.routed == 3 && res.items == 3, "%ld/%ld queries routed to reasoning", res.routed, res.items);
    cr_assert_eq(res.n_rows, 4, "rows for N = 1, 2, 4, 8: %d", res.n_rows);
    for (int k = 0; k < res.n_rows; k++) {
        int n = res.rows[k].n;
        cr_assert_eq(n, k == 0 ? 1 : k == 1 ? 2 : k == 2 ? 4 : 8);
        cr_assert_float_eq((double)res.routed / (double)res.items, 1.0, 1e-9);
        cr_assert_leq((double)res.rows[k].tokens / (double)res.items, 8.0 * n + 1e-9);
    }
    char *text;
    size_t len;
    cr_assert_eq(file_read_all(out, 1 << 22, &text, &len), 0);
    cr_assert_eq(helper_count_lines(text), 3);
    cr_assert(strstr(text, "\"pipeline\"") && strstr(text, "\"greedy_correct\""));
    er_free(text);
    // The command prints the table; --vote-n chooses the rows.
    need_erinfer();
    CmdResult r = helper_run(fx.tmp,
                             "'%s' eval --model '%s/model' --adapter '%s/adapter' --verifier '%s/vf' --data '%s' "
                             "--max-new 6 --vote-n 3,1 --threads 1",
                             fx.prog, fx.tmp, fx.tmp, fx.tmp, data);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "greedy") && strstr(r.out, "majority") && strstr(r.out, "weighted") &&
                  strstr(r.out, "tokens/query") && strstr(r.out, "reasoning"),
              "%s", r.out);
    cr_assert(strstr(r.out, "at N = 3"), "%s", r.out);
    helper_result_free(&r);
    er_free(data);
}

Test(pipeline_cli, bad_heads_and_flags_fail_cleanly) {
    need_erinfer();
    char *data = heads_make_data(fx.tmp, "eval.jsonl", 2, 4);
    struct {
        const char *flags, *expect;
    } cases[] = {
        {"--switcher '%s/vf'", "verifier head, expected a switcher"},
        {"--verifier '%s/missing'", "missing.json"},
        {"--verifier '%s/vf' --vote-n 0", "--vote-n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char flags[600];
        snprintf(flags, sizeof flags, cases[i].flags, fx.tmp);
        CmdResult r = helper_run(fx.tmp, "'%s' eval --model '%s/model' --adapter '%s/adapter' --data '%s' %s", fx.prog,
                                 fx.tmp, fx.tmp, data, flags);
        helper_expect_error(&r, flags, cases[i].expect);
    }
    er_free(data);
}

// A head records the KV cache its features were computed on (ertrain heads --kv); erinfer running it on
// the other type says so on stderr (generate and chat, and eval), and says nothing when they match or
// the head does not record it.
Test(pipeline_cli, warns_when_a_head_runs_on_another_kv_type) {
    need_erinfer();
    char sw[512];
    snprintf(sw, sizeof sw, "%s/sw", fx.tmp);
    TrainedHead t;
    cr_assert_eq(trained_head_load(&t, sw, HEAD_SWITCHER, NULL), 0, "%s", er_last_error());
    const char *cmd = "'%s' generate --model '%s/model' --adapter '%s/adapter' --switcher '%s/sw' --prompt 'What is "
                      "2 + 3?' --max-new 4 --threads 1 --kv %s";
    for (int fitted = HEAD_KV_UNKNOWN; fitted <= HEAD_KV_INT8; fitted++) {
        t.kv = (HeadKv)fitted;
        cr_assert_eq(trained_head_save(&t, sw), 0, "%s", er_last_error());
        for (int run_int8 = 0; run_int8 <= 1; run_int8++) {
            CmdResult r = helper_run(fx.tmp, cmd, fx.prog, fx.tmp, fx.tmp, fx.tmp, run_int8 ? "int8" : "f32");
            cr_assert_eq(r.status, 0, "%s", r.err);
            int differ = fitted != HEAD_KV_UNKNOWN && (fitted == HEAD_KV_INT8) != run_int8;
            const char *w = strstr(r.err, "erinfer: warning: the switcher ");
            cr_assert_eq(w != NULL, differ, "fitted %d, --kv %s:\n%s", fitted, run_int8 ? "int8" : "f32", r.err);
            if (differ)
                cr_assert(strstr(w, run_int8 ? "fitted on f32 KV cache features and runs here on int8"
                                             : "fitted on int8 KV cache features and runs here on f32"), "%s", w);
            helper_result_free(&r);
        }
    }
    // eval says it too.
    char *data = heads_make_data(fx.tmp, "eval.jsonl", 1, 4);
    CmdResult r = helper_run(fx.tmp, "'%s' eval --model '%s/model' --adapter '%s/adapter' --switcher '%s/sw' "
                             "--data '%s' --max-new 4 --vote-n 1 --threads 1", fx.prog, fx.tmp, fx.tmp, fx.tmp, data);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.err, "eval: warning: the switcher "), "%s", r.err);
    helper_result_free(&r);
    er_free(data);
    trained_head_free(&t);
}
