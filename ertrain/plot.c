// ertrain plot: the training curves of run dirs (their metrics.jsonl) as one PNG, drawn by gnuplot run as a
// child with the script (data inline, as datablocks) on its stdin and the PNG on its stdout, which is the
// output's AtomicFile: the image appears at --out only once gnuplot has finished it.
#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/strbuf.h"
#include "ertrain/cli.h"

extern char **environ;

// The finite points of one key of one run, in file order.
typedef struct {
    double *x, *y;
    int n, cap;
} PlotSeries;

// The keys plotted. "length" is drawn only for a run without length_by_budget (an older GRPO run).
enum { PK_REWARD, PK_ACCURACY, PK_LENGTH, PK_KL, PK_EVAL_ACCURACY, PK_LOSS, PK_EVAL_LOSS, PK_N };
static const char *const plot_keys[PK_N] = {"reward", "accuracy", "length", "kl", "eval_accuracy", "loss",
                                            "eval_loss"};

typedef struct {
    char *label;           // the run dir's name
    char *path;            // RUN/metrics.jsonl
    PlotSeries key[PK_N];
    int has[PK_N];         // the key appeared (a null counts)
    char **budget;         // length_by_budget's keys, sorted by value once read
    PlotSeries *by_budget; // (n_budget)
    int n_budget;
    long steps, skipped;   // step lines; null values left out
} PlotRun;

typedef struct {
    int key;             // PK_*
    const char *title;
    const char *ylabel;
    int smooth;          // the moving average over the raw curve drawn faintly
    int points;          // points at the steps that have the key (evaluations)
    const char *none;    // what a panel without a point says
} PlotPanel;

static const PlotPanel plot_panels[] = {
    {PK_REWARD, "reward", "reward", 1, 0, "no finite reward"},
    {PK_ACCURACY, "accuracy (training rollouts)", "accuracy", 0, 0, "no finite accuracy"},
    {PK_LENGTH, "mean length per budget", "tokens", 0, 0, "no finite length"},
    {PK_KL, "KL to the base", "kl", 0, 0, "no finite kl"},
    {PK_EVAL_ACCURACY, "eval accuracy", "accuracy", 0, 1, "no eval"},
    {PK_LOSS, "loss", "loss", 1, 0, "no finite loss"},
    {PK_EVAL_LOSS, "eval loss", "loss", 0, 1, "no finite eval loss"},
};
#define PLOT_N_PANELS ((int)(sizeof plot_panels / sizeof plot_panels[0]))
#define PLOT_WIDTH 1400     // two panels a row
#define PLOT_ROW_HEIGHT 420

static const char *const plot_colors[] = {"1f77b4", "d62728", "2ca02c", "ff7f0e", "9467bd",
                                          "8c564b", "e377c2", "7f7f7f", "bcbd22", "17becf"};
#define PLOT_N_COLORS ((int)(sizeof plot_colors / sizeof plot_colors[0]))

static int series_add(PlotSeries *s, double x, double y) {
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 64;
        double *nx = er_realloc_array(s->x, (size_t)cap, sizeof *nx);
        if (!nx)
            return er_error(ER_ENOMEM, "out of memory");
        s->x = nx;
        double *ny = er_realloc_array(s->y, (size_t)cap, sizeof *ny);
        if (!ny)
            return er_error(ER_ENOMEM, "out of memory");
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return ER_OK;
}

static void series_free(PlotSeries *s) {
    er_free(s->x);
    er_free(s->y);
    memset(s, 0, sizeof *s);
}

static void plot_run_free(PlotRun *r) {
    for (int k = 0; k < PK_N; k++)
        series_free(&r->key[k]);
    for (int b = 0; b < r->n_budget; b++) {
        er_free(r->budget[b]);
        series_free(&r->by_budget[b]);
    }
    er_free(r->budget);
    er_free(r->by_budget);
    er_free(r->label);
    er_free(r->path);
    memset(r, 0, sizeof *r);
}

// v (the value of `key` on a line) into s at x: a number is a point, null (what metrics.jsonl holds for a NaN
// or an infinity) is counted as skipped, anything else is an error naming the line and the key.
static int plot_value(PlotRun *r, const cJSON *v, const char *key, long line, double x, PlotSeries *s) {
    if (cJSON_IsNull(v)) {
        r->skipped++;
        return ER_OK;
    }
    if (!cJSON_IsNumber(v))
        return er_error(ER_EFORMAT, "%s:%ld: \"%s\" must be a number or null (got %s)", r->path, line, key,
                        json_type_name(v));
    if (!isfinite(v->valuedouble)) { // cJSON reads 1e999 as inf
        r->skipped++;
        return ER_OK;
    }
    return series_add(s, x, v->valuedouble);
}

// The curve of budget key `name`, made on first sight.
static int plot_budget(PlotRun *r, const char *name, PlotSeries **s) {
    for (int b = 0; b < r->n_budget; b++)
        if (strcmp(r->budget[b], name) == 0) {
            *s = &r->by_budget[b];
            return ER_OK;
        }
    char **nb = er_realloc_array(r->budget, (size_t)r->n_budget + 1, sizeof *nb);
    if (!nb)
        return er_error(ER_ENOMEM, "out of memory");
    r->budget = nb;
    PlotSeries *ns = er_realloc_array(r->by_budget, (size_t)r->n_budget + 1, sizeof *ns);
    if (!ns)
        return er_error(ER_ENOMEM, "out of memory");
    r->by_budget = ns;
    memset(&ns[r->n_budget], 0, sizeof *ns);
    if (!(nb[r->n_budget] = er_strdup(name)))
        return er_error(ER_ENOMEM, "out of memory");
    *s = &ns[r->n_budget++];
    return ER_OK;
}

// One line of metrics.jsonl. A line with "stage": "eval" (the end-of-run evaluation) holds eval results:
// its "loss" and "accuracy" are the eval loss and eval accuracy.
static int plot_line(PlotRun *r, const cJSON *j, long line) {
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(j, "step");
    if (!step)
        return er_error(ER_EFORMAT, "%s:%ld: no \"step\" (each line is one step's object)", r->path, line);
    if (!cJSON_IsNumber(step) || !isfinite(step->valuedouble))
        return er_error(ER_EFORMAT, "%s:%ld: \"step\" must be a number (got %s)", r->path, line, json_type_name(step));
    double x = step->valuedouble;
    const cJSON *stage = cJSON_GetObjectItemCaseSensitive(j, "stage");
    int eval = cJSON_IsString(stage) && strcmp(stage->valuestring, "eval") == 0;
    r->steps += !eval;
    for (int k = 0; k < PK_N; k++) {
        int dst = k;
        if (eval)
            dst = k == PK_LOSS ? PK_EVAL_LOSS : k == PK_ACCURACY ? PK_EVAL_ACCURACY
                  : k == PK_EVAL_LOSS || k == PK_EVAL_ACCURACY ? k : -1;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, plot_keys[k]);
        if (!v || dst < 0)
            continue;
        r->has[dst] = 1;
        ER_TRY(plot_value(r, v, plot_keys[k], line, x, &r->key[dst]));
    }
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(j, "length_by_budget");
    if (!lb || eval)
        return ER_OK;
    if (!cJSON_IsObject(lb))
        return er_error(ER_EFORMAT, "%s:%ld: \"length_by_budget\" must be an object (got %s)", r->path, line,
                        json_type_name(lb));
    for (const cJSON *b = lb->child; b; b = b->next) {
        PlotSeries *s = NULL;
        ER_TRY(plot_budget(r, b->string, &s));
        ER_TRY(plot_value(r, b, "length_by_budget", line, x, s));
    }
    return ER_OK;
}

// Budgets in increasing order (numbers by value, then other names as text).
static int budget_before(const char *a, const char *b) {
    char *ea, *eb;
    double va = strtod(a, &ea), vb = strtod(b, &eb);
    int na = ea != a && !*ea, nb = eb != b && !*eb;
    if (na != nb)
        return na;
    return na ? va < vb : strcmp(a, b) < 0;
}

static void plot_sort_budgets(PlotRun *r) {
    for (int i = 1; i < r->n_budget; i++)
        for (int j = i; j > 0 && budget_before(r->budget[j], r->budget[j - 1]); j--) {
            char *t = r->budget[j];
            r->budget[j] = r->budget[j - 1];
            r->budget[j - 1] = t;
            PlotSeries s = r->by_budget[j];
            r->by_budget[j] = r->by_budget[j - 1];
            r->by_budget[j - 1] = s;
        }
}

// The run dir's name: the last component of its path (of the resolved path for "." or "..").
static char *plot_label(const char *dir) {
    char *full = path_resolve(dir);
    if (!full)
        return NULL;
    size_t n = strlen(full);
    while (n > 1 && full[n - 1] == '/')
        full[--n] = 0;
    const char *base = strrchr(full, '/');
    char *label = er_strdup(base && base[1] ? base + 1 : full);
    er_free(full);
    return label;
}

// A run dir holds metrics.jsonl (checked first: a missing run is named before its default output).
static int plot_check_run(const char *dir) {
    if (!path_is_dir(dir))
        return er_error(ER_EINVAL, "%s: not a run dir (expected a dir holding metrics.jsonl)", dir);
    char *m = path_join(dir, "metrics.jsonl");
    if (!m)
        return er_error(ER_ENOMEM, "out of memory");
    int ok = path_exists(m);
    er_free(m);
    return ok ? ER_OK : er_error(ER_EINVAL, "%s: no metrics.jsonl: not a training run dir (or one that has taken "
                                 "no step)", dir);
}

static int plot_read_run(PlotRun *r, const char *dir) {
    memset(r, 0, sizeof *r);
    if (!(r->path = path_join(dir, "metrics.jsonl")) || !(r->label = plot_label(dir)))
        return er_error(ER_ENOMEM, "out of memory");
    JsonlReader jr;
    ER_TRY(jsonl_open(&jr, r->path));
    int rc = ER_OK;
    cJSON *j = NULL;
    while ((rc = jsonl_next(&jr, &j)) == 1) {
        rc = plot_line(r, j, jr.lineno);
        cJSON_Delete(j);
        if (rc < 0)
            break;
    }
    jsonl_close(&jr);
    ER_TRY(rc);
    if (r->steps == 0)
        return er_error(ER_EFORMAT, "%s: no steps (the file holds no step line)", r->path);
    plot_sort_budgets(r);
    return ER_OK;
}

static void sb_printf(StrBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(StrBuf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return;
    }
    if ((size_t)n < sizeof small) {
        strbuf_put(b, small, (size_t)n);
        return;
    }
    char *big = er_alloc((size_t)n + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    strbuf_put(b, big, (size_t)n);
    er_free(big);
}

// s as a gnuplot single-quoted string: a quote doubled, control bytes as '?'.
static void sb_quoted(StrBuf *b, const char *s) {
    strbuf_put(b, "'", 1);
    for (; *s; s++) {
        if (*s == '\'')
            strbuf_put(b, "''", 2);
        else
            strbuf_put(b, (unsigned char)*s < 0x20 ? "?" : s, 1);
    }
    strbuf_put(b, "'", 1);
}

// The script being written: datablocks ($D0, $D1, ...) first, then the panels' commands that plot them.
typedef struct {
    StrBuf data, body;
    int n_blocks;
    int elems; // plot elements of the current panel
} PlotScript;

// The trailing moving average over the last w points of s (fewer at its start) into a new datablock.
static int script_block(PlotScript *ps, const PlotSeries *s, int w) {
    int id = ps->n_blocks++;
    sb_printf(&ps->data, "$D%d << EOD\n", id);
    double sum = 0;
    for (int i = 0; i < s->n; i++) {
        sum += s->y[i];
        if (i >= w)
            sum -= s->y[i - w];
        int k = i + 1 < w ? i + 1 : w;
        sb_printf(&ps->data, "%.10g %.10g\n", s->x[i], w > 1 ? sum / k : s->y[i]);
    }
    strbuf_puts(&ps->data, "EOD\n");
    return id;
}

// "#rrggbb" of palette color i, mixed with white by `fade` (0 = the color).
static void plot_color(char *out, int i, double fade) {
    unsigned v = (unsigned)strtoul(plot_colors[i % PLOT_N_COLORS], NULL, 16);
    int c[3] = {(int)(v >> 16) & 255, (int)(v >> 8) & 255, (int)v & 255};
    for (int k = 0; k < 3; k++)
        c[k] = (int)lround(c[k] + (255 - c[k]) * fade);
    snprintf(out, 8, "#%02x%02x%02x", c[0], c[1], c[2]);
}

// One curve of a panel: its raw points (faintly under a moving average when smoothing), or its points alone.
static void script_curve(PlotScript *ps, const PlotPanel *p, const PlotSeries *s, int color, int dash,
                         const char *title, int smooth) {
    if (s->n == 0)
        return;
    char rgb[8];
    plot_color(rgb, color, 0);
    int w = p->smooth && smooth > 1 ? smooth : 1;
    if (w > 1) {
        char faint[8];
        plot_color(faint, color, 0.7);
        int raw = script_block(ps, s, 1);
        sb_printf(&ps->body, "%s$D%d using 1:2 with lines lw 1 lc rgb '%s' notitle", ps->elems++ ? ", \\\n  " : "",
                  raw, faint);
    }
    int id = script_block(ps, s, w);
    sb_printf(&ps->body, "%s$D%d using 1:2 ", ps->elems++ ? ", \\\n  " : "", id);
    if (p->points || s->n == 1) // a single point is no line
        sb_printf(&ps->body, "with linespoints pt 7 ps 0.9 lw 1 dt %d lc rgb '%s' title ", dash, rgb);
    else
        sb_printf(&ps->body, "with lines lw 2 dt %d lc rgb '%s' title ", dash, rgb);
    sb_quoted(&ps->body, title);
}

// Whether any run has a point to draw in panel p.
static int panel_has_points(const PlotPanel *p, const PlotRun *runs, int n_runs) {
    for (int i = 0; i < n_runs; i++) {
        const PlotRun *r = &runs[i];
        if (p->key != PK_LENGTH || r->n_budget == 0) {
            if (r->key[p->key].n)
                return 1;
            continue;
        }
        for (int b = 0; b < r->n_budget; b++)
            if (r->by_budget[b].n)
                return 1;
    }
    return 0;
}

// One panel: every run's curve of the panel's key (for length, one per budget: colored by run and dashed
// by budget, or colored by budget for a single run); an empty frame saying `none` when no run has a point.
static void script_panel(PlotScript *ps, const PlotPanel *p, const PlotRun *runs, int n_runs, int smooth) {
    sb_printf(&ps->body, "set title '%s", p->title);
    if (p->smooth && smooth > 1)
        sb_printf(&ps->body, " (moving average over %d steps)", smooth);
    sb_printf(&ps->body, "'\nset ylabel '%s'\n", p->ylabel);
    if (!panel_has_points(p, runs, n_runs)) {
        strbuf_puts(&ps->body, "set label 1 ");
        sb_quoted(&ps->body, p->none);
        strbuf_puts(&ps->body, " at graph 0.5,0.5 center\nset xrange [0:1]\nset yrange [0:1]\nunset key\n"
                               "plot NaN notitle\nunset label 1\nset autoscale x\nset autoscale y\nset key\n");
        return;
    }
    strbuf_puts(&ps->body, "plot ");
    ps->elems = 0;
    for (int i = 0; i < n_runs; i++) {
        const PlotRun *r = &runs[i];
        if (p->key != PK_LENGTH || r->n_budget == 0) {
            script_curve(ps, p, &r->key[p->key], i, 1, r->label, smooth);
            continue;
        }
        for (int b = 0; b < r->n_budget; b++) {
            char title[600];
            snprintf(title, sizeof title, n_runs > 1 ? "%s B=%s" : "%.0sB=%s", r->label, r->budget[b]);
            script_curve(ps, p, &r->by_budget[b], n_runs > 1 ? i : b, n_runs > 1 ? b % 5 + 1 : 1, title, smooth);
        }
    }
    strbuf_puts(&ps->body, "\n");
}

// Whether the panel is drawn: some run has its key (length: or length_by_budget); eval accuracy also for any
// GRPO run (one with a reward), where it says "no eval" when no step was evaluated.
static int panel_shown(const PlotPanel *p, const PlotRun *runs, int n_runs) {
    for (int i = 0; i < n_runs; i++)
        if (runs[i].has[p->key] || (p->key == PK_LENGTH && runs[i].n_budget) ||
            (p->key == PK_EVAL_ACCURACY && runs[i].has[PK_REWARD]))
            return 1;
    return 0;
}

// The whole gnuplot script into b; *height receives the image's height (the width is PLOT_WIDTH).
static int plot_script(StrBuf *b, const PlotRun *runs, int n_runs, int smooth, int *n_panels, int *height) {
    int shown[PLOT_N_PANELS], n = 0;
    for (int p = 0; p < PLOT_N_PANELS; p++)
        if ((shown[p] = panel_shown(&plot_panels[p], runs, n_runs)))
            n++;
    if (n == 0)
        return er_error(ER_EFORMAT, "%s: none of the plotted keys (reward, accuracy, length_by_budget, length, kl, "
                        "eval_accuracy, loss, eval_loss) in any step", n_runs == 1 ? runs[0].path : "metrics.jsonl "
                        "of every RUN");
    int rows = (n + 1) / 2;
    *n_panels = n;
    *height = rows * PLOT_ROW_HEIGHT;
    PlotScript ps = {0};
    for (int p = 0; p < PLOT_N_PANELS; p++)
        if (shown[p])
            script_panel(&ps, &plot_panels[p], runs, n_runs, smooth);
    sb_printf(b, "if (strstrt(GPVAL_TERMINALS, ' pngcairo ') > 0) {\n"
                 "  set terminal pngcairo size %d,%d noenhanced font ',10'\n"
                 "} else {\n  set terminal png size %d,%d noenhanced\n}\n",
              PLOT_WIDTH, *height, PLOT_WIDTH, *height);
    if (ps.data.p)
        strbuf_put(b, ps.data.p, ps.data.n);
    sb_printf(b, "set multiplot layout %d,2 title 'ertrain plot: %d run%s'\n", rows, n_runs, n_runs > 1 ? "s" : "");
    strbuf_puts(b, "set grid\nset xlabel 'step'\nset key top right box opaque width 1\n"
                   "set offsets graph 0.02, graph 0.02, graph 0.05, graph 0.05\n");
    if (ps.body.p)
        strbuf_put(b, ps.body.p, ps.body.n);
    strbuf_puts(b, "unset multiplot\n");
    int oom = ps.data.oom || ps.body.oom || b->oom;
    er_free(ps.data.p);
    er_free(ps.body.p);
    return oom ? er_error(ER_ENOMEM, "out of memory writing the gnuplot script") : ER_OK;
}

// The last non-blank line gnuplot wrote to its stderr (err, read from its start), trimmed, into msg.
static void gnuplot_message(FILE *err, char *msg, size_t cap) {
    char line[512];
    msg[0] = 0;
    rewind(err);
    while (fgets(line, sizeof line, err)) {
        char *s = line, *e = line + strlen(line);
        while (*s == ' ' || *s == '\t')
            s++;
        while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' '))
            *--e = 0;
        if (*s)
            snprintf(msg, cap, "%s", s);
    }
}

// gnuplot with stdin = script (a file read from its start), stdout = out_fd, stderr kept for the message.
static int run_gnuplot(FILE *script, int out_fd) {
    FILE *err = tmpfile();
    if (!err)
        return er_error(ER_EIO, "cannot create a temporary file for gnuplot's messages: %s", strerror(errno));
    rewind(script);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fileno(script), 0);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, fileno(err), 2);
    char *argv[] = {"gnuplot", NULL};
    pid_t pid;
    fflush(stdout);
    fflush(stderr);
    int e = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ), st = 0, rc = ER_OK;
    posix_spawn_file_actions_destroy(&fa);
    if (e == ENOENT)
        rc = er_error(ER_EUNSUPPORTED, "gnuplot not found: install it (scripts/deps.sh)");
    else if (e != 0)
        rc = er_error(ER_EIO, "cannot run gnuplot: %s", strerror(e));
    else {
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
        char msg[400];
        gnuplot_message(err, msg, sizeof msg);
        if (WIFSIGNALED(st))
            rc = er_error(ER_EIO, "gnuplot was killed by signal %d%s%s", WTERMSIG(st), msg[0] ? ": " : "", msg);
        else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            rc = er_error(ER_EIO, "gnuplot failed (exit status %d): %s", WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                          msg[0] ? msg : "no message");
    }
    fclose(err);
    return rc;
}

// The script run by gnuplot into `out` (atomically).
static int plot_render(const char *out, const StrBuf *script) {
    FILE *sf = tmpfile();
    if (!sf)
        return er_error(ER_EIO, "cannot create a temporary file for the gnuplot script: %s", strerror(errno));
    if (fwrite(script->p, 1, script->n, sf) != script->n || fflush(sf) != 0) {
        fclose(sf);
        return er_error(ER_EIO, "cannot write the gnuplot script to a temporary file: %s", strerror(errno));
    }
    AtomicFile af;
    int rc = atomic_open(&af, out);
    if (rc < 0) {
        fclose(sf);
        return rc;
    }
    fflush(af.fp);
    rc = run_gnuplot(sf, fileno(af.fp));
    fclose(sf);
    if (rc == ER_OK && af.tmp_path && lseek(fileno(af.fp), 0, SEEK_CUR) <= 0)
        rc = er_error(ER_EIO, "%s: gnuplot exited without writing an image", out);
    if (rc < 0) {
        atomic_abort(&af);
        return rc;
    }
    return atomic_commit(&af);
}

// The RUN arguments out of argv (in place: argv keeps the flags, with their values, for args_parse).
static int split_runs(int *argc, char **argv, const ArgSpec *specs, int n_specs, const char **runs) {
    int nf = 1, nr = 0;
    for (int i = 1; i < *argc; i++) {
        char *a = argv[i];
        if (a[0] != '-' || a[1] == 0) {
            runs[nr++] = a;
            continue;
        }
        argv[nf++] = a;
        const char *eq = strchr(a, '=');
        for (int s = 0; s < n_specs && !eq && i + 1 < *argc; s++)
            if (strncmp(a, "--", 2) == 0 && strcmp(a + 2, specs[s].name) == 0 && specs[s].type != ARG_FLAG) {
                argv[nf++] = argv[++i];
                break;
            }
    }
    *argc = nf;
    return nr;
}

static int plot_main(const char **dirs, int n_runs, const char *out, int smooth, FILE *report) {
    int rc = ER_OK;
    StrBuf script = {0};
    PlotRun *runs = er_calloc((size_t)n_runs, sizeof *runs);
    if (!runs)
        return er_error(ER_ENOMEM, "out of memory");
    for (int i = 0; i < n_runs; i++)
        ER_CHECK(plot_check_run(dirs[i]));
    ER_CHECK(file_output_check(out));
    for (int i = 0; i < n_runs; i++) {
        char *m = path_join(dirs[i], "metrics.jsonl");
        rc = m ? file_output_not_input(out, m, "run file") : er_error(ER_ENOMEM, "out of memory");
        er_free(m);
        ER_CHECK(rc);
    }
    long steps = 0, skipped = 0;
    for (int i = 0; i < n_runs; i++) {
        ER_CHECK(plot_read_run(&runs[i], dirs[i]));
        steps += runs[i].steps;
        skipped += runs[i].skipped;
    }
    for (int i = 0; i < n_runs; i++) // two runs of one name (a/x, b/x) are told apart by their paths
        for (int k = 0; k < n_runs; k++)
            if (k != i && strcmp(runs[i].label, runs[k].label) == 0 && strcmp(runs[i].label, dirs[i]) != 0) {
                er_free(runs[i].label);
                if (!(runs[i].label = er_strdup(dirs[i])))
                    ER_CHECK(er_error(ER_ENOMEM, "out of memory"));
                break;
            }
    int n_panels = 0, height = 0;
    ER_CHECK(plot_script(&script, runs, n_runs, smooth, &n_panels, &height));
    ER_CHECK(plot_render(out, &script));
    fprintf(report, "wrote %s: %d run%s, %ld step%s, %d panels (%dx%d)", strcmp(out, "-") ? out : "stdout", n_runs,
            n_runs > 1 ? "s" : "", steps, steps > 1 ? "s" : "", n_panels, PLOT_WIDTH, height);
    if (skipped)
        fprintf(report, "; %ld null value%s left out", skipped, skipped > 1 ? "s" : "");
    fprintf(report, "\n");
done:
    for (int i = 0; i < n_runs; i++)
        plot_run_free(&runs[i]);
    er_free(runs);
    er_free(script.p);
    return rc;
}

int cmd_plot(int argc, char **argv) {
    const char *out = NULL;
    int smooth = 10;
    ArgSpec specs[] = {
        {"out", ARG_STR, &out, "the PNG (default: RUN/curves.png for one run, curves.png in the current dir for "
         "several), written atomically; - for stdout (the report then goes to stderr), or a fifo or character "
         "device (written in place)", 0, 0, 0},
        {"smooth", ARG_INT, &smooth, "the moving average of reward and loss over this many steps, drawn over the "
         "raw curve (1: the raw curve alone)", 0, 1, 1000000},
    };
    int n_specs = (int)(sizeof specs / sizeof specs[0]);
    const char **runs = er_calloc((size_t)argc, sizeof *runs);
    if (!runs) {
        er_error(ER_ENOMEM, "out of memory");
        return cli_fail("plot");
    }
    int n_runs = split_runs(&argc, argv, specs, n_specs, runs);
    int rc = args_parse(argc, argv, specs, n_specs, "ertrain plot RUN [RUN...] [--out FILE.png] [--smooth 10]   "
                        "(RUN: a training run dir holding metrics.jsonl; several are overlaid in every panel)");
    char *def = NULL;
    if (rc == ER_OK && n_runs == 0)
        rc = er_error(ER_EINVAL, "no RUN given: ertrain plot RUN [RUN...] (see --help)");
    if (rc == ER_OK && !out) {
        def = n_runs == 1 ? path_join(runs[0], "curves.png") : er_strdup("curves.png");
        out = def;
        if (!def)
            rc = er_error(ER_ENOMEM, "out of memory");
    }
    if (rc == ER_OK)
        rc = plot_main(runs, n_runs, out, smooth, strcmp(out, "-") == 0 ? stderr : stdout);
    er_free(def);
    er_free(runs);
    if (rc == ARGS_HELP)
        return 0;
    return rc < 0 ? cli_fail("plot") : 0;
}
