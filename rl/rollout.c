#include "rl/rollout.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

// Ends every request that is done (the first failure stops the call: *bad names its group).
static int end_done(DecodeBatch *b, EngineRequest **req, int next, int *ended, long *gen, int *bad) {
    for (int k = 0; k < next; k++) {
        if (!req[k] || !engine_request_done(req[k]))
            continue;
        GenStats st;
        int rc = decode_batch_end(b, req[k], &st);
        req[k] = NULL;
        (*ended)++;
        if (rc < 0) {
            *bad = k;
            return rc;
        }
        *gen += st.generated_tokens;
    }
    return ER_OK;
}

int rollout_groups(DecodeBatch *b, RolloutGroup *groups, int n, long *gen_tokens) {
    // Every out is zeroed first (as engine_generate does), so a failure can free them all.
    for (int k = 0; k < n; k++)
        if (groups[k].gc.n_samples > 0)
            memset(groups[k].out, 0, sizeof(GenSample) * (size_t)groups[k].gc.n_samples);
    if (b->n_live > 0)
        return er_error(ER_EINVAL, "rollout: the batch already holds %d requests", b->n_live);
    for (int k = 0; k < n; k++)
        if (groups[k].gc.n_samples < 1 || groups[k].gc.n_samples > b->max_rows)
            return er_error(ER_ERANGE, "rollout group %d: %d samples do not fit a batch of %d rows (need 1 to %d)", k,
                            groups[k].gc.n_samples, b->max_rows, b->max_rows);
    if (n <= 0)
        return n == 0 ? ER_OK : er_error(ER_EINVAL, "rollout: %d groups", n);
    int rc = ER_OK, next = 0, ended = 0, bad = -1;
    long gen = 0;
    EngineRequest **req = er_calloc((size_t)n, sizeof *req);
    if (!req)
        ER_CHECK(ER_ENOMEM);
    while (ended < n) {
        // In order, while the next group's rows fit: a group's rows all join at once (one request).
        while (next < n && decode_batch_rows(b) + groups[next].gc.n_samples <= b->max_rows) {
            RolloutGroup *g = &groups[next];
            bad = next;
            ER_CHECK(decode_batch_add(b, g->prompt, g->n_prompt, &g->gc, NULL, NULL, g->out, &req[next]));
            next++;
        }
        decode_batch_step(b);
        ER_CHECK(end_done(b, req, next, &ended, &gen, &bad));
    }
    if (gen_tokens)
        *gen_tokens += gen;
done:
    if (rc < 0) {
        // Ending the others may record errors of its own: the group's message is the one to keep.
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", er_last_error());
        for (int k = 0; req && k < next; k++)
            if (req[k])
                decode_batch_end(b, req[k], NULL);
        for (int k = 0; k < n; k++)
            gen_samples_free(groups[k].out, groups[k].gc.n_samples);
        if (bad >= 0)
            er_error(rc, "rollout group %d: %s", bad, msg);
        else
            er_error(rc, "rollout: %s", er_status_name(rc)); // the list of requests could not be allocated
    }
    er_free(req);
    return rc;
}
