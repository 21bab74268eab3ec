// Opening a session from a model spec, and a pipeline result as JSON (infer/runner.h).
#include "infer/runner.h"

#include <stdio.h>

#include "core/alloc.h"
#include "core/error.h"
#include "model/head.h"

int runner_load_model(const SessionSpec *spec, ErModel **m) {
    *m = NULL;
    int rc = ER_OK;
    ER_CHECK(er_model_load(m, spec->model));
    if (spec->adapter)
        ER_CHECK(er_model_load_adapter(*m, spec->adapter));
    if (spec->switcher)
        ER_CHECK(er_model_load_switcher(*m, spec->switcher));
    if (spec->verifier)
        ER_CHECK(er_model_load_verifier(*m, spec->verifier));
    if (spec->device)
        ER_CHECK(er_model_set_device(*m, spec->device));
done:
    if (rc < 0) {
        er_model_free(*m);
        *m = NULL;
    }
    return rc;
}

int runner_open_session(const SessionSpec *spec, int max_samples, int max_new, ErModel **m, ErSession **s) {
    *s = NULL;
    int rc = ER_OK;
    ER_CHECK(runner_load_model(spec, m));
    ErSessionParams sp;
    er_session_params_init(&sp);
    sp.max_samples = max_samples;
    sp.max_tokens = runner_context(spec->context, max_new, er_model_max_positions(*m));
    sp.kv_type = spec->kv_int8 ? ER_KV_INT8 : ER_KV_F32;
    ER_CHECK(er_session_open(s, *m, &sp));
done:
    if (rc < 0) {
        er_model_free(*m);
        *m = NULL;
    }
    return rc;
}

int runner_context(int context, int max_new, int max_pos) {
    if (context)
        return context;
    return 4096 + max_new < max_pos ? 4096 + max_new : max_pos;
}

int runner_heads_kv_note(const SessionSpec *spec, char *note, size_t cap) {
    const char *paths[2] = {spec->switcher, spec->verifier}, *names[2] = {"switcher", "verifier"};
    HeadKv run = spec->kv_int8 ? HEAD_KV_INT8 : HEAD_KV_F32;
    for (int i = 0; i < 2; i++) {
        TrainedHead t;
        if (!paths[i] || trained_head_load(&t, paths[i], i ? HEAD_VERIFIER : HEAD_SWITCHER, NULL) < 0)
            continue;
        HeadKv fitted = t.kv;
        trained_head_free(&t);
        if (fitted != HEAD_KV_UNKNOWN && fitted != run) {
            snprintf(note, cap, "the %s %s was fitted on %s KV cache features and runs here on %s (--kv %s): its "
                     "threshold may sit a little off; retrain it with ertrain heads --kv %s to match", names[i],
                     paths[i], fitted == HEAD_KV_INT8 ? "int8" : "f32", run == HEAD_KV_INT8 ? "int8" : "f32",
                     run == HEAD_KV_INT8 ? "int8" : "f32", run == HEAD_KV_INT8 ? "int8" : "f32");
            return 1;
        }
    }
    return 0;
}

const char *runner_finish_name(int f) {
    return f == ER_FINISH_EOS ? "eos" : f == ER_FINISH_STOP ? "stop" : "length";
}

cJSON *runner_route_json(const ErRoute *r, const ErSample *const *samples, int n) {
    if (!r)
        return NULL;
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, "route", r->route == ER_ROUTE_REASONING ? "reasoning" : "direct");
    if (r->switcher_score >= 0) {
        cJSON_AddNumberToObject(j, "switcher_score", r->switcher_score);
        cJSON_AddNumberToObject(j, "switcher_threshold", r->switcher_threshold);
    } else {
        cJSON_AddNullToObject(j, "switcher_score");
    }
    if (r->response_prefix) // what each response starts with before its text (a think block, opened or closed)
        cJSON_AddStringToObject(j, "response_prefix", r->response_prefix);
    cJSON *arr = cJSON_AddArrayToObject(j, "samples");
    for (int i = 0; arr && i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o)
            break;
        cJSON_AddNumberToObject(o, "n_tokens", samples[i]->n_tokens);
        if (r->answers[i])
            cJSON_AddStringToObject(o, "answer", r->answers[i]);
        else
            cJSON_AddNullToObject(o, "answer");
        if (r->verifier_scores)
            cJSON_AddNumberToObject(o, "verifier_score", r->verifier_scores[i]);
        cJSON_AddItemToArray(arr, o);
    }
    cJSON *votes = cJSON_AddArrayToObject(j, "votes");
    for (int k = 0; votes && k < r->n_votes; k++) {
        cJSON *o = cJSON_CreateObject();
        if (!o)
            break;
        cJSON_AddStringToObject(o, "answer", r->vote_answers[k]);
        cJSON_AddNumberToObject(o, "weight", r->vote_weights[k]);
        cJSON_AddNumberToObject(o, "count", r->vote_counts[k]);
        cJSON_AddItemToArray(votes, o);
    }
    if (r->answer)
        cJSON_AddStringToObject(j, "answer", r->answer);
    else
        cJSON_AddNullToObject(j, "answer");
    cJSON *t = cJSON_AddObjectToObject(j, "timings");
    if (t) {
        cJSON_AddNumberToObject(t, "prefill_s", r->prefill_s);
        cJSON_AddNumberToObject(t, "switcher_s", r->switcher_s);
        cJSON_AddNumberToObject(t, "generate_s", r->generate_s);
        cJSON_AddNumberToObject(t, "verify_s", r->verify_s);
    }
    return j;
}

cJSON *runner_session_route_json(const ErSession *s) {
    int n = er_result_count(s);
    const ErSample **samples = er_alloc(sizeof *samples * (size_t)(n > 0 ? n : 1));
    if (!samples)
        return NULL;
    for (int i = 0; i < n; i++)
        samples[i] = er_result_sample(s, i);
    cJSON *j = runner_route_json(er_result_route(s), samples, n);
    er_free(samples);
    return j;
}
