// ertrain quantize: flags -> QuantizeConfig -> quantize_run (train/quantize.c).
#include <stdio.h>

#include "core/args.h"
#include "core/error.h"
#include "ertrain/cli.h"
#include "quant/quant.h"
#include "train/quantize.h"

int cmd_quantize(int argc, char **argv) {
    QuantizeConfig c = {0};
    c.calib_n = 16;
    c.seq_len = 512;
    c.transforms = "none";
    c.q.scale_search = "lp";
    c.q.p = 2.0;
    c.q.kmeans_iters = 25;
    c.log = stdout;
    c.fpt_local_steps = 100;
    c.fpt_steps = 200;
    c.fpt_lr = 1e-3;
    int seed = 0, fpt_local = 100, fpt_steps = 200;
    // The formats come from quant/'s table; q2rtn and bf16 are quantize's policies (train/quantize.h).
    char list[256], weights_help[512], usage[768];
    quant_spec_list(list, sizeof list, " | ", " | ");
    snprintf(weights_help, sizeof weights_help, "format of the layer projections: %s | q4_k_m | q5_k_m (llama.cpp's "
             "mixes: q6_k for some v and down projections and the lm_head) | q2rtn (2-bit uniform RTN levels, stored "
             "as q2lut) | bf16 (the float model as bf16)", list);
    snprintf(usage, sizeof usage, "ertrain quantize --model DIR --out DIR --weights %s|bf16 [--embeddings int8|q8_0|fp] "
             "[--transforms none|rotate|fpt|fpt-trained [--fpt-steps N --fpt-local-steps N --fpt-lr X --save-every N "
             "--resume]] [--calib FILE.jsonl --calib-n N] [--sensitivity fisher|none] [--sparse S] "
             "[--scale-search lp|minmax] [--seed S]", quantize_weights_list(list, sizeof list, "|", "|"));
    ArgSpec specs[] = {
        {"model", ARG_STR, &c.model_dir, "float model dir (HF layout: config.json, *.safetensors, tokenizer)", 1, 0, 0},
        {"out", ARG_STR, &c.out_dir, "output model dir (absent or empty)", 1, 0, 0},
        {"weights", ARG_STR, &c.q.weights, weights_help, 1, 0, 0},
        {"embeddings", ARG_STR, &c.q.embeddings, "embedding matrix: int8 | q8_0 | fp (a tied lm_head follows it; "
         "default int8, q8_0 with a GGUF block format in --weights)", 0, 0, 0},
        {"lm-head", ARG_STR, &c.q.lm_head,
         "lm_head: fp or a --weights format (default: as --weights, q4 for q2lut; a tied model follows "
         "--embeddings unless this is given, then it is untied)", 0, 0, 0},
        {"transforms", ARG_STR, &c.transforms,
         "function-preserving transforms before quantizing: none | rotate (Hadamard, norms folded) | fpt (rotate + "
         "up/down, value/output, query/key) | fpt-trained (fpt, then trained against the quantizer on --calib: "
         "local, then end to end) | a list of r,u,v,k", 0, 0, 0},
        {"fpt-steps", ARG_INT, &fpt_steps, "fpt-trained: end-to-end steps after the local ones (KL to the float "
         "model, one calibration sequence each)", 0, 0, 1000000},
        {"fpt-local-steps", ARG_INT, &fpt_local, "fpt-trained: local steps (each projection's quantized output "
         "error on the calibration inputs)", 0, 0, 1000000},
        {"fpt-lr", ARG_FLOAT, &c.fpt_lr, "fpt-trained: AdamW learning rate of the transform parameters", 0, 1e-8, 1},
        {"save-every", ARG_INT, &c.fpt_save_every, "fpt-trained: checkpoint every N steps (0 = at the end)", 0, 0,
         1000000},
        {"resume", ARG_FLAG, &c.resume, "fpt-trained: continue the run in --out from its checkpoint", 0, 0, 0},
        {"calib", ARG_STR, &c.calib, "calibration records (JSONL, any dataset record type) for Fisher and NLL", 0, 0, 0},
        {"response-key", ARG_STR, &c.response_key, "calibration record field holding the response (e.g. verbose "
         "for chains)", 0, 0, 0},
        {"calib-n", ARG_INT, &c.calib_n, "calibration sequences for the Fisher pass (the next N measure held-out NLL)",
         0, 1, 1000000},
        {"seq-len", ARG_INT, &c.seq_len, "most positions per calibration sequence", 0, 2, 1 << 20},
        {"sensitivity", ARG_STR, &c.sensitivity,
         "per-weight importance: fisher (squared gradients on --calib) | none (default: fisher with --calib)", 0, 0, 0},
        {"error-feedback", ARG_STR, &c.error_feedback,
         "q2lut / q4lut: gptq (codes assigned with GPTQ error feedback and codebooks refitted against the --calib "
         "inputs' second moments) | none (default: gptq with --calib)", 0, 0, 0},
        {"scale-search", ARG_STR, &c.q.scale_search,
         "RTN scales: lp (grid search over clipping ratios minimising the Lp error) | minmax", 0, 0, 0},
        {"p", ARG_FLOAT, &c.q.p, "exponent of the Lp error the scale search minimises", 0, 1, 8},
        {"kmeans-iters", ARG_INT, &c.q.kmeans_iters, "Lloyd iterations of the q4lut / q2lut k-means", 0, 1, 1000},
        {"sparse", ARG_INT, &c.q.sparse, "q2lut / q4lut: dense-and-sparse, per row of the layer projections this many "
         "weights (those with the largest output energy) kept exact as fp16 corrections, 32 bits each", 0, 0, 65536},
        {"seed", ARG_INT, &seed, "seed of the transforms' random rotations", 0, 0, 2147483647},
        {"threads", ARG_INT, &c.threads, "threads (0 = all cores)", 0, 0, 4096},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0], usage);
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0)
        return cli_fail("quantize");
    c.seed = (uint64_t)seed;
    c.fpt_local_steps = fpt_local;
    c.fpt_steps = fpt_steps;
    if (quantize_run(&c, NULL) < 0)
        return cli_fail("quantize");
    return 0;
}
