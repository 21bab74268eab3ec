// Training checkpoints: everything a run needs to continue bit for bit where it stopped.
//   DIR/state-<step>.safetensors  trained parameters, AdamW m and v, the epoch's batch order
//   DIR/state.json                step, AdamW step, RNG state, data cursor, resolved configuration,
//                                 and the name of the tensor file it goes with
// Both are written atomically; state.json last, so it is the commit point: a run killed while
// saving leaves the previous checkpoint intact (plus, at worst, an unreferenced tensor file).
#ifndef TRAIN_CHECKPOINT_H
#define TRAIN_CHECKPOINT_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "core/rng.h"
#include "train/optim.h"

typedef struct {
    long step;        // optimizer steps done
    long epoch;       // epoch the next batch comes from
    long cursor;      // index of that batch in the epoch's order
    long tokens;      // input positions trained on so far
    ErRng rng;        // the run's root RNG (every random choice forks from it by purpose and step)
    int *order;       // (n_order) example indices in the epoch's batch order
    int n_order;
    int *batch_start; // (n_batches + 1) batch b is order[batch_start[b] .. batch_start[b+1])
    int n_batches;
    cJSON *config;    // resolved configuration of the run (owned)
} TrainState;

void train_state_free(TrainState *st);

// Saves st, params (n) and opt (same n) into dir (created when missing).
int checkpoint_save(const char *dir, const TrainState *st, const float *params, size_t n, const AdamW *opt);
// Restores into st (fresh; free with train_state_free), params (n) and opt (already initialised for n).
// A checkpoint for a different number of parameters is refused.
int checkpoint_load(const char *dir, TrainState *st, float *params, size_t n, AdamW *opt);
int checkpoint_exists(const char *dir);

#endif
