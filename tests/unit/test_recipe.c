/* Recipe layer: defaults, YAML loading, --set overrides, validation and the
 * print -> load round trip. Error messages go to stderr; the cases here check
 * return codes and values, tests/integration/recipe_errors.sh checks messages. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/recipe.h"
#include "tests/unit/check.h"

static char tmpdir[64];

/* Write text to tmpdir/name and return the path (static buffer per call site). */
static const char *write_tmp(const char *name, const char *text) {
    static char path[8][256];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "w");
    if (!f || fputs(text, f) == EOF || fclose(f) != 0) {
        printf("FAIL setup: cannot write %s\n", p);
        exit(1);
    }
    return p;
}

/* Bytes of the config sections: everything before the source/marks bookkeeping. */
#define CONFIG_BYTES offsetof(struct recipe, source)

static void test_defaults(void) {
    static struct recipe r;
    recipe_defaults(&r);
    int ok = !strcmp(r.model.arch, "llama") && r.model.vocab_size == 257 && r.model.hidden_size == 64 &&
             r.model.hidden_size % r.model.num_heads == 0 && r.model.num_heads % r.model.num_kv_heads == 0 &&
             r.train.global_batch % r.train.micro_batch == 0 && r.optimizer.lr == 3e-4 &&
             !strcmp(r.optimizer.schedule, "cosine") && !strcmp(r.train.device, "auto") &&
             !strcmp(r.log.dir, "runs/latest") && r.data.path[0] == 0 && r.train.seed == 1234;
    TEST_RESULT("recipe_defaults_values", ok, "unexpected default");
    TEST_RESULT("recipe_defaults_need_data_path", recipe_validate(&r, 1) == -1, "validated without data.path");
    snprintf(r.data.path, sizeof r.data.path, "%s", tmpdir);
    TEST_RESULT("recipe_defaults_validate", recipe_validate(&r, 1) == 0, "defaults + data dir do not validate");
}

static void test_load_good(void) {
    char text[1024];
    snprintf(text, sizeof text,
             "# a comment\n"
             "model:\n"
             "  hidden_size: 128\n"
             "  num_heads: 8\n"
             "  tie_embeddings: yes\n"
             "train:\n"
             "  seed: 18446744073709551615\n"
             "  device: cpu\n"
             "optimizer:\n"
             "  lr: 1.5e-4\n"
             "  schedule: 'wsd'\n"
             "  wsd_decay_steps: 10\n"
             "data:\n"
             "  path: \"%s\"\n"
             "log:\n",
             tmpdir);
    static struct recipe r;
    recipe_defaults(&r);
    int rc = recipe_load(&r, write_tmp("good.yaml", text));
    TEST_RESULT("recipe_load_good", rc == 0, "recipe_load returned %d", rc);
    int ok = r.model.hidden_size == 128 && r.model.num_heads == 8 && r.model.tie_embeddings == 1 &&
             r.train.seed == 18446744073709551615ull && !strcmp(r.train.device, "cpu") &&
             r.optimizer.lr == 1.5e-4 && !strcmp(r.optimizer.schedule, "wsd") && !strcmp(r.data.path, tmpdir) &&
             r.model.num_layers == 2;
    TEST_RESULT("recipe_load_values", ok, "loaded values differ");
    TEST_RESULT("recipe_load_validates", recipe_validate(&r, 1) == 0, "good recipe does not validate");
}

static void test_load_errors(void) {
    static struct recipe r, before;
    recipe_defaults(&r);
    before = r;
    static const char *const bad[] = {
        "model:\n  hidden_size: big\n",     "model:\n  hiden_size: 64\n", "modle:\n  hidden_size: 64\n",
        "model:\n  num_layers: 0\n",        "model: [1, 2]\n",             "model:\n  arch: [a]\n",
        "model:\n  a: 1\n b: 2\n",          "train:\n  device: tpu\n",     "train:\n  steps: 1\n  steps: 2\n",
        "- model\n",                        "optimizer:\n  beta2: 1.0\n",  "train:\n  seed: -1\n",
    };
    int n = sizeof bad / sizeof bad[0], rejected = 0, unchanged = 1;
    for (int i = 0; i < n; i++) {
        rejected += recipe_load(&r, write_tmp("bad.yaml", bad[i])) == -1;
        unchanged &= !memcmp(&r, &before, sizeof r);
    }
    TEST_RESULT("recipe_load_rejects_bad", rejected == n, "%d of %d bad recipes rejected", rejected, n);
    TEST_RESULT("recipe_load_error_keeps_recipe", unchanged, "a failed load changed the recipe");
    TEST_RESULT("recipe_load_missing_file", recipe_load(&r, "/nonexistent/recipe.yaml") == -1, "loaded nothing");
    TEST_RESULT("recipe_load_empty_file", recipe_load(&r, write_tmp("empty.yaml", "")) == 0, "empty file rejected");
}

static void test_set(void) {
    static struct recipe r;
    recipe_defaults(&r);
    int ok = recipe_set(&r, "optimizer.lr=1e-3") == 0 && r.optimizer.lr == 1e-3 &&
             recipe_set(&r, "train.steps=7") == 0 && r.train.steps == 7 &&
             recipe_set(&r, "checkpoint.async=on") == 0 && r.checkpoint.async == 1 &&
             recipe_set(&r, "data.path=\"my data\"") == 0 && !strcmp(r.data.path, "my data") &&
             recipe_set(&r, "model.init_from=") == 0 && r.model.init_from[0] == 0;
    TEST_RESULT("recipe_set_applies", ok, "override not applied");
    static const char *const bad[] = {"optimizer.lr=abc", "train.lr=1",       "optimizer.lr",  "lr=1",
                                      "train.steps=1.5",  "train.steps=0",    "train.device=gpu",
                                      "model.tie_embeddings=maybe", "optimizer.lr=-1", "nosuch.key=1",
                                      "train.steps=99999999999"};
    int n = sizeof bad / sizeof bad[0], rejected = 0;
    struct recipe before = r;
    for (int i = 0; i < n; i++) rejected += recipe_set(&r, bad[i]) == -1;
    TEST_RESULT("recipe_set_rejects_bad", rejected == n, "%d of %d bad overrides rejected", rejected, n);
    TEST_RESULT("recipe_set_error_keeps_value", !memcmp(&r, &before, sizeof r), "a failed --set changed the recipe");
}

/* A recipe with every section changed, printed and loaded back, is the same struct. */
static void test_round_trip(void) {
    static struct recipe a, b;
    recipe_defaults(&a);
    static const char *const sets[] = {
        "model.hidden_size=96", "model.rope_theta=10000.5", "model.init_std=0.1", "model.norm_eps=3e-7",
        "model.rope_scaling_factor=8", "model.init_from=dir/w \"x\"\\y.safetensors", "parallel.tp=2",
        "parallel.sequence_parallel=true", "train.seed=987654321987", "train.device=cuda",
        "train.peak_tflops=989.5", "optimizer.lr=0.0003", "optimizer.min_lr=0.30000000000000004",
        "optimizer.schedule=linear", "data.path=data/x", "data.valid_fraction=0.05", "checkpoint.dir=ck",
        "checkpoint.interval=5", "log.dir=", "log.interval=3",
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) ok &= recipe_set(&a, sets[i]) == 0;
    const char *path = write_tmp("printed.yaml", "");
    FILE *f = fopen(path, "w");
    if (f) {
        recipe_print(&a, f);
        ok &= fclose(f) == 0;
    }
    recipe_defaults(&b);
    ok &= f && recipe_load(&b, path) == 0;
    TEST_RESULT("recipe_round_trip", ok && !memcmp(&a, &b, CONFIG_BYTES), "print -> load changed the recipe");
}

static void test_schema(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        TEST_FAIL("recipe_print_schema", "open_memstream failed");
        return;
    }
    recipe_print_schema(f);
    fclose(f);
    int ok = strstr(buf, "optimizer.lr") && strstr(buf, "cosine|linear|constant|wsd") && strstr(buf, "[0, 1)") &&
             strstr(buf, "log.interval");
    TEST_RESULT("recipe_print_schema", ok, "schema listing lacks keys or ranges");
    free(buf);
}

/* The shipped recipes load; the big ones validate for an unknown world size. */
static void test_shipped(void) {
    static const char *const names[] = {"recipes/tiny-llama3.yaml", "recipes/llama3-8b.yaml", "recipes/llama3-70b.yaml"};
    for (int i = 0; i < 3; i++) {
        char name[96];
        snprintf(name, sizeof name, "recipe_shipped_%s", strrchr(names[i], '/') + 1);
        if (access(names[i], R_OK) != 0) {
            printf("SKIP %s: not run from the repository root\n", name);
            continue;
        }
        static struct recipe r;
        recipe_defaults(&r);
        int ok = recipe_load(&r, names[i]) == 0;
        snprintf(r.data.path, sizeof r.data.path, "%s", tmpdir);  /* the dataset is built separately */
        ok = ok && recipe_validate(&r, 0) == 0;
        if (i == 1) ok = ok && r.model.hidden_size == 4096 && r.model.intermediate_size == 14336;
        if (i == 2) ok = ok && r.model.num_layers == 80 && r.model.num_heads == 64 && recipe_validate(&r, 64) == 0;
        TEST_RESULT(name, ok, "does not load or validate");
    }
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_recipe.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        printf("FAIL setup: mkdtemp\n");
        return 1;
    }
    test_defaults();
    test_load_good();
    test_load_errors();
    test_set();
    test_round_trip();
    test_schema();
    test_shipped();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) printf("# could not remove %s\n", tmpdir);
    TEST_EXIT();
}
