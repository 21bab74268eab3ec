// llama.cpp's own quantizer on a GGUF file: llama_model_quantize from the libllama that node-llama-cpp ships
// prebuilt (scripts/llama_cpp.sh --install puts it in build/node_modules), loaded with dlopen, since no llama.cpp
// header ships with it. Makes the Q8_0 / Q4_0 / Q4_K_M / Q5_K_M files of bench/run_llama.sh and of the GGUF tests
// (tests/model/test_gguf_quantize.c), the files people download.
//
//   llama_quantize IN.gguf OUT.gguf q8_0|q4_0|q4_k_m|q5_k_m [--threads N] [--lib PATH]
//
// llama.h's struct llama_model_quantize_params begins `int32_t nthread; enum llama_ftype ftype;` in every release
// of 2025 (node-llama-cpp 3.22.1's llama_model_quantize_default_params writes 64 bytes, nthread and ftype at
// offsets 0 and 4); the fields after them change from release to release, so only these two are set and the rest
// keep the library's defaults. The struct here is far larger than any release's: on x86-64 (SysV) and aarch64 a
// struct returned by value that large goes through memory the caller provides, of which the callee writes its own
// size only.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define DEFAULT_LIB "build/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.5.0.so"

typedef struct {
    int32_t nthread;
    int32_t ftype; // enum llama_ftype
    unsigned char rest[504];
} QuantizeParams;

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        int ftype; // llama.h's LLAMA_FTYPE_MOSTLY_*
    } types[] = {{"q8_0", 7}, {"q4_0", 2}, {"q4_k_m", 15}, {"q5_k_m", 17}};
    const char *lib = DEFAULT_LIB;
    int threads = 0, ftype = -1;
    if (argc < 4 || !strcmp(argv[1], "--help")) {
        fprintf(stderr, "usage: llama_quantize IN.gguf OUT.gguf q8_0|q4_0|q4_k_m|q5_k_m [--threads N] [--lib PATH]\n");
        return argc >= 2 && !strcmp(argv[1], "--help") ? 0 : 1;
    }
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(argv[3], types[i].name))
            ftype = types[i].ftype;
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads") && sscanf(argv[i + 1], "%d", &threads) == 1 && threads >= 0)
            continue;
        if (!strcmp(argv[i], "--lib")) {
            lib = argv[i + 1];
            continue;
        }
        fprintf(stderr, "llama_quantize: unknown or bad flag %s\n", argv[i]);
        return 1;
    }
    if (ftype < 0 || (argc - 4) % 2) {
        fprintf(stderr, "llama_quantize: type \"%s\" is not q8_0, q4_0, q4_k_m or q5_k_m, or a flag lacks its value\n",
                argv[3]);
        return 1;
    }
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "llama_quantize: %s (run scripts/llama_cpp.sh --install)\n", dlerror());
        return 1;
    }
    QuantizeParams (*defaults)(void);
    uint32_t (*quantize)(const char *, const char *, const QuantizeParams *);
    *(void **)&defaults = dlsym(h, "llama_model_quantize_default_params");
    *(void **)&quantize = dlsym(h, "llama_model_quantize");
    if (!defaults || !quantize) {
        fprintf(stderr, "llama_quantize: %s lacks llama_model_quantize\n", lib);
        return 1;
    }
    QuantizeParams p = defaults();
    p.nthread = threads;
    p.ftype = ftype;
    uint32_t rc = quantize(argv[1], argv[2], &p);
    if (rc) {
        fprintf(stderr, "llama_quantize: llama_model_quantize %s -> %s failed (status %u)\n", argv[1], argv[2], rc);
        return 1;
    }
    return 0;
}
