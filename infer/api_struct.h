// The size rule of the structs a caller of infer/erinfer.h fills (its "Structs" paragraph): each starts with
// its size in bytes; the library reads what it knows of it and refuses what it cannot. Defined in infer/api.c.
#ifndef INFER_API_STRUCT_H
#define INFER_API_STRUCT_H

#include <stddef.h>

// A size more than this past what the library knows is an uninitialised struct (its bytes are not read).
enum { API_STRUCT_SLACK_MAX = 1024 };

// The defaults (the library's version, `known` bytes) into the caller's struct p of `size` bytes, the bytes
// past them zeroed, and size into its first field. ER_EINVAL for NULL or a size below `first` (the end of the
// struct's first version) or too far past `known`; `fn` names the call in the error.
int api_struct_init(void *p, size_t size, const void *defaults, size_t known, size_t first, const char *fn);
// The caller's struct src over the library's version *dst (`known` bytes, holding the defaults): the first
// min(size, known) bytes copied (fields a smaller, older struct lacks keep their defaults), dst's size field
// set to known. Bytes of src past `known` must be zero (fields of a newer header, at their defaults), and its
// size within [first, known + API_STRUCT_SLACK_MAX]: else ER_EINVAL naming `fn` and `what` ("ErGenParams").
int api_struct_read(void *dst, size_t known, const void *src, size_t first, const char *fn, const char *what);

#endif
