// ertrain merge: a base model dir + a LoRA adapter (PEFT dir) -> a model dir whose weights hold the
// adapter, W += scale · B·A on every adapted projection, for runtimes that take no adapter.
//
// The merged model is the adapter applied at EVERY position. For a masked adapter (er_mask "response",
// as ertrain sft trains by default) that is not what the masked runtime computes: it keeps the adapter
// off on the prompt, so the prompt's K/V are the base's. Only an fp32 base is merged: a quantized one has
// packed weights to add to, and a bf16 one would round the merged weights.
#ifndef TRAIN_MERGE_H
#define TRAIN_MERGE_H

#include <stddef.h>

typedef struct {
    const char *model_dir;   // fp32 base model dir (with its tokenizer, copied when present)
    const char *adapter_dir; // PEFT adapter for that base
    const char *out_dir;     // absent or empty
    int threads;             // 0 = all cores
} MergeConfig;

typedef struct {
    int merged;         // projections the adapter changed
    int masked;         // the adapter was trained masked (the merge applies it everywhere all the same)
    size_t parameters;  // of the merged model
} MergeResult;

// Loads the base and the adapter, merges, and writes out_dir: config.json and model.safetensors
// (fp32, atomically), the base's tokenizer files, run.json.
int merge_run(const MergeConfig *c, MergeResult *res);

#endif
