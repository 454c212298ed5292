/* Fuzz the checkpoint manifest reader (checkpoint/checkpoint.c): a damaged
 * manifest.json beside its step's own rank files, resharded to one rank the
 * way `mtrain convert` does (every tensor read through the manifest's
 * entries: names, shapes, shards, parts, files, checksums; the state; the
 * recipe), and what it wrote read back. The manifest's own checksum is dropped from most inputs that still
 * parse, so that the mutations reach the checks behind it (a manifest without
 * one loads, as an older mtrain's). Seeds: manifest.json of a tiny run's
 * checkpoint (its rank files are linked next to the mutated manifest). */
#define _XOPEN_SOURCE 700
#include "tests/fuzz/fuzz.h"

#include <ftw.h>
#include <jansson.h>
#include <dirent.h>

#include "checkpoint/checkpoint.h"

const char fuzz_name[] = "fuzz_checkpoint";
static char (*dirs)[4200];
static const char *work;

/* WORKDIR/ck-K/ holds links to seed K's files but its manifest, which is written per input */
void fuzz_prepare(const char *workdir, int nseeds, char **seed_paths) {
    work = workdir;
    dirs = calloc((size_t)nseeds, sizeof *dirs);
    for (int k = 0; k < nseeds; k++) {
        char *abs = fuzz_seed_dir(seed_paths[k]);
        snprintf(dirs[k], sizeof dirs[k], "%s/ck-%d", workdir, k);
        mkdir(dirs[k], 0755);
        DIR *d = abs ? opendir(abs) : NULL;
        for (struct dirent *e; d && (e = readdir(d));)
            if (e->d_name[0] != '.' && strcmp(e->d_name, "manifest.json")) fuzz_link(abs, e->d_name, dirs[k]);
        if (d) closedir(d);
        free(abs);
    }
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *f) { return remove(path); }

int fuzz_one(const char *path, int seed_index) {
    struct fuzz_buf b;
    if (fuzz_read_file(path, &b) != 0) return 3;
    char man[4400], out[4300], err[8192];
    snprintf(man, sizeof man, "%s/manifest.json", dirs[seed_index]);
    snprintf(out, sizeof out, "%s/out", work);
    nftw(out, remove_one, 16, FTW_DEPTH | FTW_PHYS); /* the last input's, when it ended in die() */
    json_error_t jerr;
    json_t *j = json_loadb((const char *)b.p, b.n, 0, &jerr);
    if (j && json_is_object(j) && (b.n & 7)) {
        json_object_del(j, "manifest_xxh3");
        if (json_dump_file(j, man, 0) != 0) return 3;
    } else if (fuzz_write_file(man, b.p, b.n) != 0) {
        return 3;
    }
    json_decref(j);
    free(b.p);
    checkpoint_set_warnings(0);
    int rc = checkpoint_convert(dirs[seed_index], out, 1, 1, 1, 1, 1, 1, 1, err, sizeof err);
    if (rc == -1) return 1;
    if (rc == -2) return 2;
    if (rc != 0) return 3;
    /* what convert wrote must load: its newest step found, its manifest read */
    int step = checkpoint_latest(out);
    char dir[4400];
    if (step < 0) abort();
    checkpoint_step_dir(dir, sizeof dir, out, step);
    struct ckpt_reader *rd = ckpt_reader_open(dir, err, sizeof err, &rc);
    if (!rd) {
        fprintf(stderr, "written, not read: %s\n", err);
        abort();
    }
    ckpt_reader_close(rd);
    return 0;
}
