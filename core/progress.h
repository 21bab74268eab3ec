// Progress for long work, written to a stream the caller gives (NULL: silent): a redrawn bar with
// rate and ETA on a terminal, plain periodic lines when the stream is not a terminal (logs, CI).
#ifndef CORE_PROGRESS_H
#define CORE_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
    FILE *out;             // NULL: nothing is written
    const char *label;
    const char *unit;      // what `done` counts ("step", "item")
    int64_t total;         // 0 when unknown
    int64_t start;         // where this run began (a resumed run starts past 0): rate and ETA count from here
    double t_start, t_last_print;
    int tty;
    int64_t done;
} Progress;

// Counts from `start` (0, or the step a resumed run continues from) to `total`, reporting to out.
void progress_begin(Progress *p, FILE *out, const char *label, const char *unit, int64_t start, int64_t total);
// `done` items finished so far (counted from 0, not from start); `extra` (may be NULL) is appended,
// e.g. "loss 2.31".
void progress_update(Progress *p, int64_t done, const char *extra);
void progress_end(Progress *p, const char *extra);
double time_now(void); // monotonic seconds

#endif
