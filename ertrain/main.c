// ertrain: the training stack's command-line front end.
#include <stdio.h>

#include "core/args.h"
#include "core/error.h"
#include "core/threads.h"
#include "ertrain/cli.h"
#include "infer/erinfer.h"
#include "model/backend.h"
#include "train/dist.h"

static int cmd_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("ertrain %s\n", er_version());
#ifdef ER_BLAS
    printf("blas: OpenBLAS\n");
#else
    printf("blas: built-in GEMM\n");
#endif
    printf("threads: %d\n", threads_get());
#ifdef ER_CUDA
    printf("backends: cpu cuda\n");
#else
    printf("backends: cpu (make CUDA=1 adds cuda)\n");
#endif
    Backend *be = NULL;
    if (backend_open(&be, backend_default()) == ER_OK) {
        printf("device: %s, %s", be->name, be->device);
        if (be->mem_total)
            printf(", %.1f GiB (%.1f GiB free)", be->mem_total / 1073741824.0, be->mem_free / 1073741824.0);
        printf("\n");
        backend_close(be);
    }
    printf("ranks: %d%s\n", dist_size(), dist_size() > 1 ? " (MPI)" : "");
    return 0;
}

static const ArgCommand commands[] = {
    {"synth", cmd_synth, "generate synthetic datasets (chains)"},
    {"init", cmd_init, "write a randomly initialised model dir from a config.json"},
    {"pretrain", cmd_pretrain, "train a model from random init on rendered conversations"},
    {"sft", cmd_sft, "train a masked LoRA adapter on a frozen base (PEFT output)"},
    {"grpo", cmd_grpo, "GRPO with the budget reward on a masked LoRA adapter"},
    {"heads", cmd_heads, "train the switcher and verifier heads on a base model + reasoning adapter"},
    {"quantize", cmd_quantize, "quantize a model dir (q8, q4, q4g, q4lut, q2lut, q2rtn, the GGUF q8_0 ... q6_k, bf16; Fisher-weighted)"},
    {"outliers", cmd_outliers, "a float model with seeded outlier channels, same function (a quantization test model)"},
    {"qat", cmd_qat, "quantization-aware training: fine-tune with fake-quantized weights, write the quantized dir"},
    {"merge", cmd_merge, "merge a LoRA adapter into its fp32 base: a model dir (the adapter on at every position)"},
    {"export", cmd_export, "export a model (gguf) or a LoRA adapter (gguf-lora) for llama.cpp"},
    {"eval", cmd_eval_split, "erinfer eval with the records split across the ranks of mpirun (make MPI=1)"},
    {"plot", cmd_plot, "training curves of run dirs (metrics.jsonl) as one PNG, several runs overlaid (gnuplot)"},
    {"version", cmd_version, "print the build configuration"},
};

// Under mpirun the line names the rank, and the whole job ends with it: the other ranks would
// otherwise wait for this one in the next all-reduce. The report printed so far goes out first, so in
// `> log 2>&1` the error line comes after it.
int cli_fail(const char *cmd) {
    fflush(stdout);
    const char *msg = args_error_text(cmd, er_last_error());
    if (dist_size() > 1) {
        fprintf(stderr, "ertrain %s: rank %d of %d: %s\n", cmd, dist_rank(), dist_size(), msg);
        fflush(stderr);
        dist_abort(1);
    } else {
        fprintf(stderr, "ertrain %s: %s\n", cmd, msg);
    }
    return 1;
}

int main(int argc, char **argv) {
    if (dist_init(&argc, &argv) < 0) {
        fflush(stdout);
        fprintf(stderr, "ertrain: %s\n", er_last_error());
        return 1;
    }
    int rc = args_dispatch("ertrain", commands, sizeof commands / sizeof commands[0], argc, argv);
    dist_finalize();
    return rc;
}
