/* log.dir protection: a run does not write over another run's metrics.
 * LOG_DIR/metrics.jsonl belongs to this run when it holds no training step
 * yet, or when this run resumes from a checkpoint that file records saving
 * (a "checkpoint" event at the resumed step). Otherwise the run stops (exit
 * 2) unless --force, which moves the old metrics to metrics.jsonl.N and the
 * old TensorBoard files to tensorboard.N/. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/pretrain.h"
#include "config/common.h"

struct metrics_summary {
    int steps;            /* training-step lines */
    int first, last;      /* their step range */
    int saved_resumed;    /* a checkpoint event at the step this run resumes from */
};

static int step_of(const char *line) {
    const char *at = strstr(line, "\"step\":");
    return at ? atoi(at + 7) : -1;
}

/* Read path line by line (its size does not matter). Returns -1 if absent. */
static int summarize(const char *path, int resumed_step, struct metrics_summary *s) {
    memset(s, 0, sizeof *s);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        int step = step_of(line);
        if (!strstr(line, "\"event\":") && strstr(line, "\"loss\":") && step >= 0) {
            if (!s->steps || step < s->first) s->first = step;
            if (!s->steps || step > s->last) s->last = step;
            s->steps++;
        } else if (resumed_step >= 0 && step == resumed_step &&
                   (strstr(line, "\"event\":\"checkpoint\"") || strstr(line, "\"event\":\"checkpoint_committed\""))) {
            s->saved_resumed = 1;
        }
    }
    if (ferror(f)) die("cannot read %s: %s", path, strerror(errno)); /* never judge a run by half its metrics */
    free(line);
    fclose(f);
    return 0;
}

static int is_event_file(const char *name) { return strstr(name, "tfevents") != NULL; }

/* Move LOG_DIR/metrics.jsonl to metrics.jsonl.N and the TensorBoard files
 * into tensorboard.N/ (N: the first free number). Returns N, or -1 with why. */
static int move_aside(const char *dir, char *why, size_t n) {
    char old[RECIPE_PATH_MAX + 320], to[RECIPE_PATH_MAX + 320], tb[RECIPE_PATH_MAX + 32];
    snprintf(old, sizeof old, "%s/metrics.jsonl", dir);
    int k = 1;
    for (;; k++) {
        snprintf(to, sizeof to, "%s/metrics.jsonl.%d", dir, k);
        snprintf(tb, sizeof tb, "%s/tensorboard.%d", dir, k);
        if (!path_exists(to) && !path_exists(tb)) break;
    }
    if (rename(old, to) != 0) {
        snprintf(why, n, "cannot rename %s to %s: %s", old, to, strerror(errno));
        return -1;
    }
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(why, n, "cannot list %s: %s", dir, strerror(errno));
        return -1;
    }
    int made = 0, rc = k;
    struct dirent *e;
    while (rc > 0 && (e = readdir(d))) {
        if (!is_event_file(e->d_name)) continue;
        if (!made && mkdir(tb, 0755) != 0) {
            snprintf(why, n, "cannot create %s: %s", tb, strerror(errno));
            rc = -1;
            break;
        }
        made = 1;
        snprintf(old, sizeof old, "%s/%s", dir, e->d_name);
        snprintf(to, sizeof to, "%s/%s", tb, e->d_name);
        if (rename(old, to) != 0) {
            snprintf(why, n, "cannot move %s into %s: %s", old, tb, strerror(errno));
            rc = -1;
        }
    }
    closedir(d);
    return rc;
}

/* Rank 0's verdict: 0 go on, EXIT_USAGE refuse, EXIT_RUNTIME a failed move. */
static int decide(struct run *run, const char *from, char *msg, size_t n) {
    const char *dir = run->r->log.dir;
    char path[RECIPE_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    struct metrics_summary s;
    if (summarize(path, from ? run->st.step : -1, &s) != 0 || s.steps == 0) return 0;
    if (from && s.saved_resumed) return 0;
    if (run->o->force) {
        char why[3 * RECIPE_PATH_MAX + 256];
        int k = move_aside(dir, why, sizeof why);
        if (k < 0) {
            snprintf(msg, n, "--force: %s", why);
            return EXIT_RUNTIME;
        }
        printf("--force: the previous run's metrics (steps %d..%d) moved to %s/metrics.jsonl.%d (its TensorBoard "
               "files, if any, to %s/tensorboard.%d/)\n", s.first, s.last, dir, k, dir, k);
        return 0;
    }
    char resumed[RECIPE_PATH_MAX + 128] = "";
    if (from)
        snprintf(resumed, sizeof resumed, " (the checkpoint resumed from, %s, is not one that run saved)", from);
    snprintf(msg, n, "log.dir %s already holds another run's metrics (%s, steps %d..%d)%s. Resume that run (from "
             "its checkpoint.dir, or --resume DIR), or pass --force to move its metrics aside to "
             "%s/metrics.jsonl.N, or choose another log.dir", dir, path, s.first, s.last, resumed, dir);
    return EXIT_USAGE;
}

void logdir_claim(struct run *run, const char *from) {
    char msg[4 * RECIPE_PATH_MAX + 512] = "";
    float code = run->rank0 ? (float)decide(run, from, msg, sizeof msg) : 0.0f;
    /* said before the others learn of it: once a rank exits non-zero the launcher may end the rest at once */
    if (msg[0]) fprintf(stderr, "mtrain: error: %s\n", msg);
    fflush(NULL);
    comm_all_reduce_max(&run->grid.world, &code, 1);
    if (code == 0) return;
    parallel_finalize();
    exit((int)code);
}
