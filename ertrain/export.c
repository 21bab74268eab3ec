// ertrain export gguf / gguf-lora: flags -> train/gguf_export.h.
#include <stdio.h>
#include <string.h>

#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "ertrain/cli.h"
#include "train/gguf_export.h"

// The output, checked before any work: a wrong kind of path, or an input file itself, fails now.
static int export_check(const char *out, const char *model, const char *adapter) {
    ER_TRY(file_output_check(out));
    ER_TRY(file_output_not_input(out, model, "--model"));
    return file_output_not_input(out, adapter, "--adapter");
}

static int cmd_export_gguf(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *type = NULL;
    ArgSpec specs[] = {
        {"model", ARG_STR, &model, "model dir (HF layout, float or quantized) or .gguf file", 1, 0, 0},
        {"out", ARG_STR, &out, "output .gguf file (written atomically), - for stdout (the report then goes to "
                               "stderr), or a fifo or character device (written in place)", 1, 0, 0},
        {"type", ARG_STR, &type, "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K or q6_K (default: the "
         "model's own: its float type, each GGUF block-format matrix in its own type, q4_0 for q4g32 matrices that "
         "are q4_0 blocks; q8, q4 and the other formats of ours need --type)", 0, 0, 0},
    };
    int rc = args_parse(argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "ertrain export gguf --model DIR|FILE.gguf --out FILE.gguf [--type TYPE]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0 || export_check(out, model, NULL) < 0 ||
        gguf_export_model(model, out, type, strcmp(out, "-") == 0 ? stderr : stdout) < 0)
        return cli_fail("export gguf");
    return 0;
}

static int cmd_export_gguf_lora(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *out = NULL;
    ArgSpec specs[] = {
        {"model", ARG_STR, &model, "the adapter's base model (dir or .gguf)", 1, 0, 0},
        {"adapter", ARG_STR, &adapter, "LoRA adapter dir (PEFT)", 1, 0, 0},
        {"out", ARG_STR, &out, "output .gguf file (llama.cpp --lora; written atomically), - for stdout, or a fifo "
                               "or character device (written in place)", 1, 0, 0},
    };
    int rc = args_parse(argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "ertrain export gguf-lora --model DIR --adapter DIR --out FILE.gguf");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0 || export_check(out, model, adapter) < 0 ||
        gguf_export_lora(model, adapter, out, strcmp(out, "-") == 0 ? stderr : stdout) < 0)
        return cli_fail("export gguf-lora");
    return 0;
}

int cmd_export(int argc, char **argv) {
    static const ArgCommand cmds[] = {
        {"gguf", cmd_export_gguf, "a model as a GGUF file for llama.cpp (qwen2 / qwen3 / llama)"},
        {"gguf-lora", cmd_export_gguf_lora, "a LoRA adapter as a llama.cpp LoRA GGUF (applied at every position)"},
    };
    return args_dispatch("ertrain export", cmds, 2, argc, argv);
}
