// The bench runner: time to first token, decode speed and memory (weights, KV, scratch) of a model dir for N = 1, 2, 4, 8
// parallel samples sharing one prompt, with the KV cache in fp32 and in int8. The engine runs with
// EOS stopping off (no tokenizer, no eos id), so every sample decodes exactly new_tokens tokens; the
// rows still report the tokens actually generated. With an adapter, one more row times the
// pipeline's case: the base model has prefilled the prompt (for the switcher), then the adapter
// decodes. A masked adapter reuses that prompt KV cache; an unmasked one must recompute the prompt.
// The runner never prints: rows come back in BenchResult, each also through on_row as it is measured.
#ifndef INFER_BENCH_H
#define INFER_BENCH_H

#include <stddef.h>

#include "infer/engine.h"

#define BENCH_ROWS 8 // f32 then int8 KV, N = 1, 2, 4, 8 each

typedef struct {
    const char *kv;      // "f32" | "int8"
    int n;               // parallel samples
    double ttft_s, step_s, stream_tps, total_tps;
    long tokens;         // generated, all samples
    size_t kv_bytes;
    int prompt_reused;   // prompt positions found in the cache
    // The row's memory beside the weights, as sized up front for N samples of prompt + new tokens: the
    // KV cache allocated, and the scratch (activations of a prefill chunk and of N decode rows, the
    // sampler's and the last prompt's (V) buffers).
    size_t kv_alloc_bytes, scratch_bytes;
} BenchRow;

typedef struct BenchResult {
    int L, C, V;             // the model's layers, hidden size and vocabulary
    size_t weight_bytes;     // weights as held in memory (packed formats at their size; vectors fp32)
    size_t mapped_bytes;     // the safetensors files mmapped (read-only, paged in as the weights are read), less
                             // the matrices tiled for the decode kernels (model_tile_for_decode: copies)
    size_t copied_bytes;     // weights held outside the mapping (fp32 vectors, matrices not usable in place)
    // The process's resident set grown over loading the model and a warm-up step (er_resident_bytes; 0 where the
    // OS does not say), less that step's KV cache and scratch: what the loaded weights hold in memory.
    size_t resident_weight_bytes;
    const char *kernels;     // the decode kernels' instruction set (quant_simd_name)
    BenchRow rows[BENCH_ROWS];
    int n_rows;
    int has_adapter;         // adapter_row is set
    int adapter_masked;      // the adapter's rule: off on the prompt
    BenchRow adapter_row;    // the adapter's generation after a base prefill of the prompt
} BenchResult;

typedef struct {
    const char *model;   // model dir (tokenizer.json optional: the prompt is text when there is one)
    const char *adapter; // LoRA adapter dir (PEFT layout), on while decoding; NULL = none
    int prompt_tokens;   // synthetic prompt length (>= 1)
    int new_tokens;      // tokens per sample (>= 2)
    // Called after row i of res->rows is measured (res->L, C, V and weight_bytes are set); NULL = none.
    void (*on_row)(void *user, const BenchResult *res, int i);
    void *user;
} BenchConfig;

int bench_run(const BenchConfig *c, BenchResult *res);

// Forward passes an engine_generate call made after the first token (which comes from the prefill):
// the longest of the n samples' tokens, minus one.
int bench_decode_steps(const GenSample *s, int n);

#endif
