// Byte ranges that the file readers (safetensors, GGUF) parse and then use in place: a whole file mapped, a
// range of an open file descriptor (mapped, or read when it cannot be), a copy of a caller's buffer, or a
// caller's buffer borrowed. One reader per format parses them all, whatever they came from; `name` is what
// messages call the source ("models/x.gguf", "<buffer>", "fd 7").
#ifndef CORE_BYTES_H
#define CORE_BYTES_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const unsigned char *data; // size bytes, read-only
    size_t size;
    char *name;
    void *map;                 // pages mapped from a file (map_len bytes) that hold data; NULL when none
    size_t map_len;
    void *owned;               // an er_alloc block that holds data; NULL when none
    int borrowed;              // data is the caller's: used in place, never released, written or freed
} ByteRange;

// To the end of the file, for bytes_from_fd's length.
#define BYTES_TO_END UINT64_MAX

// The whole regular file at path, mapped read-only (MAP_PRIVATE): "<path>: cannot open: <why>", "<path>: not a
// regular file". An empty file gives an empty range (data not NULL).
int bytes_map_file(ByteRange *r, const char *path);
// length bytes at offset of the file open as fd (BYTES_TO_END: all from offset on), named "fd <fd>". A
// regular file is mapped from there (read with pread when it cannot be mapped); the fd's own file position
// is neither used nor moved, and fd is not closed: the mapping outlives it. A pipe or a socket is read from
// where it stands to its end (or length bytes): offset must be 0, and what is read is consumed. Refused with
// one line naming the fd: a closed or invalid fd, a directory or device, a range past the end of the file,
// a stream longer than the machine's memory.
int bytes_from_fd(ByteRange *r, int fd, uint64_t offset, uint64_t length);
// size bytes at data named `name`: copied into a block of ours (borrow 0), or used in place (borrow 1: the
// caller keeps them valid and unchanged until bytes_free).
int bytes_from_buffer(ByteRange *r, const void *data, size_t size, const char *name, int borrow);
// Moves *from into *to (*from is left zeroed).
void bytes_move(ByteRange *to, ByteRange *from);
// 1 when p lies inside a borrowed range (the caller's memory: nothing of it may be released).
int bytes_borrows(const ByteRange *r, const void *p);
void bytes_free(ByteRange *r); // safe on a zeroed range

#endif
