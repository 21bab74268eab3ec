// Sessions and batches of the public API (infer/erinfer.h) sized as the tests need them: ErSessionParams
// with max_samples x max_tokens positions and the KV type, everything else at its default.
#ifndef TESTS_COMMON_API_HELPERS_H
#define TESTS_COMMON_API_HELPERS_H

#include "infer/erinfer.h"

static inline ErSessionParams helper_session_params(int max_samples, int max_tokens, int kv_int8) {
    ErSessionParams p;
    er_session_params_init(&p);
    p.max_samples = max_samples;
    p.max_tokens = max_tokens;
    p.kv_type = kv_int8 ? ER_KV_INT8 : ER_KV_F32;
    return p;
}

static inline int helper_session_open(ErSession **s, ErModel *m, int max_samples, int max_tokens, int kv_int8) {
    ErSessionParams p = helper_session_params(max_samples, max_tokens, kv_int8);
    return er_session_open(s, m, &p);
}

static inline int helper_batch_open(ErBatch **b, ErModel *m, int max_rows, int max_tokens, int kv_int8) {
    ErSessionParams p = helper_session_params(max_rows, max_tokens, kv_int8);
    return er_batch_open(b, m, &p);
}

#endif
