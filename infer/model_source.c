// One model file in memory with its JSON texts: the format told by its first bytes, then the loaders the
// path versions use (model/, data/) on the already open file.
#include "infer/model_source.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/gguf.h"
#include "model/gguf_model.h"

// A GGUF: the model, and the tokenizer and chat style from the file unless texts give a tokenizer.
static int load_gguf(Model *m, Tokenizer **tok, ChatStyle *style, ByteRange *bytes, const ModelTexts *tx) {
    GgufFile *f = er_calloc(1, sizeof *f);
    if (!f) {
        bytes_free(bytes);
        return ER_ENOMEM;
    }
    int rc = gguf_open_bytes(f, bytes);
    if (rc < 0) {
        er_free(f);
        return rc;
    }
    ER_TRY(model_load_gguf_file(m, f, 0));
    if (tx->tokenizer.text) {
        ER_TRY(tok_load_texts(tok, &tx->tokenizer, &tx->tokenizer_config, &tx->generation_config));
        return chat_style_from_text(&tx->tokenizer_config, style);
    }
    ER_TRY(tok_load_gguf(tok, m->gguf));
    return chat_style_from_gguf(m->gguf, style);
}

// A safetensors file with its config.json and tokenizer.json texts (and the optional configs).
static int load_safetensors(Model *m, Tokenizer **tok, ChatStyle *style, ByteRange *bytes, const ModelTexts *tx) {
    StFile st;
    ER_TRY(safetensors_open_bytes(&st, bytes));
    ER_TRY(model_load_safetensors(m, &tx->config, &st, 0));
    ER_TRY(tok_load_texts(tok, &tx->tokenizer, &tx->tokenizer_config, &tx->generation_config));
    return chat_style_from_text(&tx->tokenizer_config, style);
}

// What texts a format takes, before the bytes are parsed: one line naming the bytes and the text.
static int check_texts(const char *name, int gguf, const ModelTexts *tx) {
    if (gguf && tx->config.text)
        return er_error(ER_EINVAL, "%s: a GGUF file holds its own config: %s is not taken with it", name,
                        tx->config.name);
    if (gguf && !tx->tokenizer.text && (tx->tokenizer_config.text || tx->generation_config.text))
        return er_error(ER_EINVAL, "%s: %s is read with %s only (a GGUF's own tokenizer has its special tokens and "
                        "chat template)", name, tx->tokenizer_config.text ? tx->tokenizer_config.name :
                        tx->generation_config.name, tx->tokenizer.name);
    if (!gguf && !tx->config.text)
        return er_error(ER_EINVAL, "%s: not a GGUF file (no \"GGUF\" magic), so a safetensors file, which needs "
                        "%s", name, tx->config.name);
    if (!gguf && !tx->tokenizer.text)
        return er_error(ER_EINVAL, "%s: a safetensors file needs %s", name, tx->tokenizer.name);
    return ER_OK;
}

int model_source_load(Model *m, Tokenizer **tok, ChatStyle *style, ByteRange *bytes, const ModelTexts *texts) {
    memset(m, 0, sizeof *m);
    *tok = NULL;
    char name[128];
    snprintf(name, sizeof name, "%s", bytes->name ? bytes->name : "<bytes>");
    int rc = ER_OK;
    if (bytes->size == 0) {
        bytes_free(bytes);
        return er_error(ER_EFORMAT, "%s: empty (0 bytes), not a GGUF or safetensors model file", name);
    }
    int gguf = bytes->size >= 4 && memcmp(bytes->data, "GGUF", 4) == 0;
    ER_CHECK(check_texts(name, gguf, texts));
    ER_CHECK(gguf ? load_gguf(m, tok, style, bytes, texts) : load_safetensors(m, tok, style, bytes, texts));
done:
    if (rc < 0) {
        bytes_free(bytes); // not taken over when refused before parsing
        tok_free(*tok);
        *tok = NULL;
        model_free(m);
    }
    return rc;
}
