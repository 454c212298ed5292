/* The training loop of `mtrain pretrain`: data -> step -> checks -> update ->
 * logs -> checkpoint, with resume, in-process rewind and signal handling. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "checkpoint/async_save.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/rewind.h"
#include "checkpoint/weights.h"
#include "cli/cli.h"
#include "cli/pretrain.h"
#include "cli/tensorboard.h"
#include "config/common.h"
#include "data/blend.h"
#include "data/dataset.h"
#include "kernels/cpu/blas_check.h"
#include "kernels/profile.h"
#include "model/flops.h"
#include "model/trainer.h"
#include "parallel/comm_nccl.h"
#include "parallel/grid.h"
#include "parallel/timeline.h"
#include "parallel/watchdog.h"

void openblas_set_num_threads(int);

/* ---- signals: the first SIGTERM/SIGINT/SIGUSR1 asks for checkpoint-and-exit
 * at the next step boundary; a second SIGTERM or SIGINT (Ctrl-C) exits at once ---- */

static volatile sig_atomic_t stop_signal;
static volatile sig_atomic_t signal_says; /* this rank prints what a Ctrl-C does (rank 0) */

static void on_signal(int sig) {
    if ((sig == SIGTERM || sig == SIGINT) && stop_signal) _exit(128 + sig);
    if (sig == SIGINT && signal_says) {
        static const char msg[] = "\nmtrain: Ctrl-C: stopping at the next step boundary (with a checkpoint and the "
                                  "final weights); press Ctrl-C again to stop at once\n";
        ssize_t unused = write(2, msg, sizeof msg - 1);
        (void)unused;
    }
    stop_signal = sig;
}

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGUSR1, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0)
        die("cannot install signal handlers");
}

/* ---- output ---- */

static double peak_rss_mib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return ru.ru_maxrss / 1024.0;
}

/* what was written to metrics.jsonl reached the file (ferror too: a write
 * that failed in an automatic flush leaves fflush nothing to fail on) */
static void metrics_flush(struct run *run) {
    if (fflush(run->metrics) != 0 || ferror(run->metrics))
        die("cannot write %s: %s", run->metrics_path, strerror(errno ? errno : EIO));
}

void event(struct run *run, const char *fmt, ...) {
    if (!run->rank0) return;
    char small[1024], *line = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) die("cannot format a line of %s", run->metrics_path);
    if ((size_t)n >= sizeof small) { /* MoE lines carry every expert's load */
        line = xmalloc((size_t)n + 1);
        va_start(ap, fmt);
        vsnprintf(line, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    fputs(line, run->metrics);
    fputc('\n', run->metrics);
    metrics_flush(run);
    if (run->tb.f && tb_log_json_line(&run->tb, line) != 0) die("cannot write %s: %s", run->tb.path, strerror(errno));
    if (line != small) free(line);
}

/* "42s", "3m05s", "2h07m": short enough for the step line */
static void duration_text(char *out, size_t n, double s) {
    long t = (long)(s + 0.5);
    if (t < 60) snprintf(out, n, "%lds", t);
    else if (t < 3600) snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(out, n, "%ldh%02ldm", t / 3600, t % 3600 / 60);
}

static void log_step(struct run *run, int step, const struct step_stats *st, double seconds) {
    const struct recipe *r = run->r;
    double tps = st->tokens / seconds, tflops = tps * run->flops_per_token / 1e12;
    double mfu = run->peak_tflops > 0 ? tflops / run->peak_tflops : 0;
    double mem = run->be->device_mem_mib ? run->be->device_mem_mib() : peak_rss_mib();
    if (!run->rank0) return;
    char moe[8192] = "", moe_text[96] = "";
    if (st->load) { /* MoE: losses, drops, and each MoE layer's tokens per expert */
        const struct model_config *mc = &r->model;
        int n = snprintf(moe, sizeof moe, ",\"aux_loss\":%.6f,\"z_loss\":%.6f,\"dropped\":%.0f,\"load_max\":%.4f,"
                         "\"expert_load\":[", st->aux_loss, st->z_loss, st->dropped, st->load_max);
        for (int j = 0, nm = model_moe_layer_count(mc); j < nm && n < (int)sizeof moe - 64; j++)
            for (int e = 0; e < mc->num_experts && n < (int)sizeof moe - 64; e++)
                n += snprintf(moe + n, sizeof moe - n, "%s%.0f%s", e ? "," : j ? ",[" : "[",
                              st->load[(size_t)j * mc->num_experts + e], e == mc->num_experts - 1 ? "]" : "");
        snprintf(moe + n, sizeof moe - n, "]");
        snprintf(moe_text, sizeof moe_text, " | aux %.3f | load max %.2f%s", st->aux_loss, st->load_max,
                 st->dropped > 0 ? " | dropped" : "");
        if (st->dropped > 0) snprintf(moe_text + strlen(moe_text), sizeof moe_text - strlen(moe_text), " %.0f", st->dropped);
    }
    if (model_mtp_depth(&r->model)) { /* multi-token prediction: its mean loss (before mtp_loss_weight) */
        size_t len = strlen(moe);
        snprintf(moe + len, sizeof moe - len, ",\"mtp_loss\":%.6f", st->mtp_loss);
        len = strlen(moe_text);
        snprintf(moe_text + len, sizeof moe_text - len, " | mtp %.4f", st->mtp_loss);
    }
    event(run,
          "{\"step\":%d,\"loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.6f,\"tokens_per_s\":%.1f,\"tflops\":%.6f,"
          "\"mfu\":%.6f,\"mem_mib\":%.1f,\"step_ms\":%.2f,\"consumed_samples\":%lld%s}",
          step, st->loss, st->lr, st->grad_norm, tps, tflops, mfu, mem, seconds * 1e3,
          (long long)run->st.consumed_samples, moe);
    if (step % r->log.interval && step != 1 && step != r->train.steps) return;
    char mfu_text[32] = "-", elapsed[32], eta[32];
    if (run->peak_tflops > 0) snprintf(mfu_text, sizeof mfu_text, "%.1f%%", 100 * mfu);
    /* ETA from this process's mean step time so far */
    double spent = now_seconds() - run->t_start;
    int done = step - run->first_step + 1;
    duration_text(elapsed, sizeof elapsed, spent);
    duration_text(eta, sizeof eta, done > 0 ? spent / done * (r->train.steps - step) : 0);
    printf("step %6d/%d | loss %.4f | lr %.3e | gnorm %.3f | %8.0f tok/s | %.3f TFLOP/s | mfu %s | mem %.0f MiB%s"
           " | %s, ETA %s\n",
           step, r->train.steps, st->loss, st->lr, st->grad_norm, tps, tflops, mfu_text, mem, moe_text, elapsed, eta);
    fflush(stdout);
}

/* This data-parallel rank's share of the global batch starting at sample
 * `first`: samples first + dp_rank, first + dp_rank + dp, ... so the data
 * does not depend on the layout. Returns the count. */
static int fill_batch(struct run *run, struct blend *b, int64_t first) {
    const struct recipe *r = run->r;
    int n = r->train.global_batch / run->grid.dp;
    blend_get_strided(b, first, n, run->grid.dp, run->grid.dp_rank, run->batch);
    return n;
}

static void run_eval(struct run *run, int step) {
    const struct recipe *r = run->r;
    double sum = 0;
    /* the same fixed validation samples every time, so the curve is comparable */
    for (int e = 0; e < r->train.eval_batches; e++) {
        watchdog_phase(WATCHDOG_EVAL, step); /* each batch is progress: a long eval is not a hang */
        int n = fill_batch(run, run->valid, (int64_t)e * r->train.global_batch);
        sum += trainer_eval(&run->tr, run->batch, n);
    }
    double val = sum / r->train.eval_batches;
    if (run->rank0) printf("eval  step %6d | val_loss %.4f | ppl %.2f\n", step, val, exp(val));
    event(run, "{\"event\":\"eval\",\"step\":%d,\"val_loss\":%.6f}", step, val);
}

/* ---- rewind ---- */

static void write_diagnostics(struct run *run, int step, enum rewind_reason why) {
    if (!run->rank0) return;
    char path[RECIPE_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/rewind-diagnostics.json", run->r->log.dir);
    FILE *f = xfopen(path, "w");
    fprintf(f, "{\"step\":%d,\"reason\":\"%s\",\"rewinds\":%d,\"consecutive\":%d,\"recent\":[", step,
            rewind_reason_name(why), run->st.rewinds, run->consecutive_rewinds);
    int n = run->nhistory < HISTORY ? run->nhistory : HISTORY;
    for (int i = 0; i < n; i++) {
        int k = (run->nhistory - n + i) % HISTORY;
        fprintf(f, "%s{\"step\":%d,\"loss\":%.6g,\"grad_norm\":%.6g}", i ? "," : "", run->history[k].step,
                run->history[k].loss, run->history[k].grad_norm);
    }
    fprintf(f, "]}\n");
    xfclose(f, path);
    fprintf(stderr, "mtrain: diagnostics written to %s\n", path);
}

/* A failure every rank reaches together: one message (rank 0), exit 1 everywhere. */
static void fail_run(struct run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void fail_run(struct run *run, const char *fmt, ...) {
    if (run->rank0) {
        va_list ap;
        va_start(ap, fmt);
        verror_message(fmt, ap);
        va_end(ap);
    }
    if (run->metrics) fflush(run->metrics);
    parallel_finalize();
    exit(EXIT_RUNTIME);
}

/* Roll back to a committed checkpoint (the newest, then older ones on
 * repeated rewinds) and move the data position past the bad batch plus
 * skip_margin batches. */
static void rewind_to_checkpoint(struct run *run, int bad_step, enum rewind_reason why) {
    const struct recipe *r = run->r;
    const struct rewind_config *c = &r->rewind;
    int G = r->train.global_batch;
    watchdog_phase(WATCHDOG_LOAD, bad_step);
    finish_save(run, 1);
    run->consecutive_rewinds++;
    if (run->consecutive_rewinds > c->max_rewinds) {
        write_diagnostics(run, bad_step, why);
        fail_run(run, "step %d: %s again after %d rewinds in a row; giving up", bad_step, rewind_reason_name(why),
                 c->max_rewinds);
    }
    int64_t resume_at = run->st.consumed_samples + (int64_t)G * (1 + c->skip_margin);
    int rewinds = run->st.rewinds + 1;
    int steps[4096], n = checkpoint_list(r->checkpoint.dir, steps, 4096);
    char path[RECIPE_PATH_MAX + 32], err[2048];
    int from = run->consecutive_rewinds - 1 < n ? run->consecutive_rewinds - 1 : n - 1;
    for (int i = from < 0 ? n : from; i < n; i++) {
        checkpoint_step_dir(path, sizeof path, r->checkpoint.dir, steps[i]);
        if (load_checkpoint(run, path, err, sizeof err) == 0) {
            int64_t skipped = resume_at - run->st.consumed_samples;
            run->st.consumed_samples = resume_at;
            run->st.rewinds = rewinds;
            if (c->lr_scale_steps > 0) {
                run->st.lr_scale = c->lr_scale;
                /* lr_scale_steps may be up to INT_MAX: no overflow into a negative (refused on resume) */
                run->st.lr_scale_until = c->lr_scale_steps > INT_MAX - run->st.step ? INT_MAX
                                                                                    : run->st.step + c->lr_scale_steps;
            }
            if (run->rank0) printf("rewind: step %d %s -> back to step %d, skipping %lld samples (rewind %d)\n", bad_step,
                   rewind_reason_name(why), run->st.step, (long long)skipped, rewinds);
            event(run,
                  "{\"event\":\"rewind\",\"step\":%d,\"reason\":\"%s\",\"to_step\":%d,\"skipped_samples\":%lld,"
                  "\"consumed_samples\":%lld,\"rewinds\":%d}",
                  bad_step, rewind_reason_name(why), run->st.step, (long long)skipped,
                  (long long)run->st.consumed_samples, rewinds);
            return;
        }
        if (!strstr(err, "another rank")) warn("%s; trying an older checkpoint", err);
    }
    write_diagnostics(run, bad_step, why);
    fail_run(run, "step %d: %s and no checkpoint to rewind to in %s", bad_step, rewind_reason_name(why),
             r->checkpoint.dir);
}

/* Communication payload per step of every rank and group (tp, dp, pp, ep,
 * edp, embed, cp, etp: grid_comms' order) and the data-parallel gradient
 * bytes reduced in buckets during backward (dp_overlapped), as one event:
 * rank r's numbers are at [NV r .. NV r + NG]. Eval and checkpoint traffic is included, so benchmarks run
 * without them. */
static void log_comm(struct run *run, int steps) {
    struct grid *g = &run->grid;
    int n = g->world_size;
    enum { NG = GRID_COMMS - 1, NV = NG + 1 }; /* the groups but world, then dp_overlapped */
    double *v = xcalloc(NV * n, sizeof *v), per = steps > 0 ? steps : 1;
    struct comm *cs[GRID_COMMS];
    grid_comms(g, cs);
    for (int k = 0; k < NG; k++) v[NV * g->world_rank + k] = (double)cs[k + 1]->bytes / per;
    v[NV * g->world_rank + NG] = (double)g->dp_comm.overlapped / per;
    comm_all_reduce_sum_f64(&g->world, v, NV * n);
    if (run->rank0 && run->metrics) {
        /* "step": the run's last, so a resume from an earlier step drops this run's event with its steps */
        fprintf(run->metrics, "{\"event\":\"comm\",\"step\":%d,\"steps\":%d,\"bytes_per_step\":[", run->st.step,
                steps);
        for (int r = 0; r < n; r++) {
            fprintf(run->metrics, "%s{\"rank\":%d", r ? "," : "", r);
            for (int k = 0; k < NG; k++) fprintf(run->metrics, ",\"%s\":%.0f", cs[k + 1]->name, v[NV * r + k]);
            fprintf(run->metrics, ",\"dp_overlapped\":%.0f}", v[NV * r + NG]);
        }
        fprintf(run->metrics, "]}\n");
        metrics_flush(run);
    }
    free(v);
}

/* MTRAIN_TIMELINE's step traced (parallel/timeline.h): every rank writes
 * LOG_DIR/timeline-rank-NNNNN.json; rank 0 says what its data-parallel
 * gradient reduction overlapped, on stdout and as a metrics event. Called
 * when the timeline is due and at the end of the run (a step never reached
 * is said once). */
static void write_timeline(struct run *run, int at_end) {
    int step = timeline_step_requested();
    if (!timeline_pending()) {
        if (at_end && step > 0 && !timeline_done() && run->rank0)
            warn("MTRAIN_TIMELINE=%d: this run did not run step %d (it ran steps %d to %d); no timeline written", step,
                 step, run->first_step, run->st.step);
        return;
    }
    struct timeline_summary t;
    char *json = timeline_finish(run->grid.world_rank, &t), file[RECIPE_PATH_MAX + 48];
    snprintf(file, sizeof file, "%s/timeline-rank-%05d.json", run->r->log.dir, run->grid.world_rank);
    /* a diagnostic: a rank that cannot write it (LOG_DIR not shared with rank 0's node) says so and trains on */
    mkdir_p(run->r->log.dir);
    FILE *f = fopen(file, "w");
    size_t len = strlen(json);
    if (!f || fwrite(json, 1, len, f) != len || fclose(f) != 0) {
        warn("rank %d: cannot write the timeline to %s: %s", run->grid.world_rank, file, strerror(errno));
        if (f) fclose(f);
    }
    free(json);
    if (!run->rank0) return;
    event(run,
          "{\"event\":\"timeline\",\"step\":%d,\"file\":\"%s\",\"spans\":%d,\"dropped\":%d,\"rewound\":%s,"
          "\"step_ms\":%.3f,"
          "\"compute_ms\":%.3f,\"grad_ms\":%.3f,\"grad_hidden_ms\":%.3f,\"grad_exposed_ms\":%.3f,\"grad_bytes\":%llu,"
          "\"grad_calls\":%d}",
          t.step, file, t.spans, t.dropped, t.rewound ? "true" : "false", t.step_ms, t.compute_ms, t.grad_ms, t.grad_hidden_ms, t.grad_exposed_ms,
          (unsigned long long)t.grad_bytes, t.grad_calls);
    printf("timeline of step %d%s in %s/timeline-rank-*.json: step %.2f ms, forward and backward %.2f ms", t.step,
           t.rewound ? " (rolled back by a rewind)" : "", run->r->log.dir, t.step_ms, t.compute_ms);
    if (t.grad_calls)
        printf("; data-parallel gradients %d call%s, %.1f MB, %.2f ms of communication: %.2f ms during forward or "
               "backward, %.2f ms exposed\n",
               t.grad_calls, t.grad_calls == 1 ? "" : "s", t.grad_bytes / 1e6, t.grad_ms, t.grad_hidden_ms,
               t.grad_exposed_ms);
    else
        printf("; no data-parallel gradient communication\n");
    if (t.dropped) warn("the timeline kept its first %d spans, not the %d after them", TIMELINE_SPANS, t.dropped);
}

/* Drop the lines of metrics.jsonl about steps after `step` (the interrupted
 * run's steps and events past the checkpoint a resume starts from), so each
 * step appears once. Rewritten atomically; a missing file is fine. */
static void trim_metrics(const char *path, int step) {
    size_t size = 0;
    errno = 0;
    char *text = read_file(path, &size);
    if (!text && errno != ENOENT) die("cannot read %s to trim it for the resume: %s", path, strerror(errno));
    if (!text) return;
    char *out = xmalloc(size + 1);
    size_t n = 0;
    for (char *line = text; line < text + size;) {
        char *end = memchr(line, '\n', (size_t)(text + size - line));
        size_t len = end ? (size_t)(end - line) + 1 : (size_t)(text + size - line);
        const char *at = memmem(line, len, "\"step\":", 7);
        if (!at || atoi(at + 7) <= step) memcpy(out + n, line, len), n += len;
        line += len;
    }
    if (n != size) write_file_atomic(path, out, n);
    free(out);
    free(text);
}

/* ---- the loop ---- */

/* --resume never, or auto without checkpoint.dir: a fresh start for sure. */
static int starts_fresh(const struct run *run) {
    const char *how = run->o->resume;
    return !strcmp(how, "never") || (!strcmp(how, "auto") && !run->r->checkpoint.dir[0]);
}

/* parallel.comm: NCCL between GPU ranks when it can (auto) or must (nccl),
 * else MPI (GPU tensors staged through host memory). The choice is the
 * world's: a rank that cannot use NCCL makes every rank exit 2 (nccl) or
 * fall back (auto), so no rank waits in a communicator the others skip. */
static void choose_comm(struct run *run) {
    const struct recipe *r = run->r;
    struct grid *g = &run->grid;
    int gpu = !strcmp(run->be->name, "cuda") || run->gpu_comm_on_cpu, want = strcmp(r->parallel.comm, "mpi") != 0;
    char why[320] = "";
    run->comm_name = g->world_size == 1 ? "none" : "mpi";
    if (!want) return;
    int shared = grid_ranks_sharing_gpu(g); /* collective: every rank asks, GPU or not */
    if (!gpu) snprintf(why, sizeof why, "train.device resolved to the CPU: NCCL needs GPU ranks");
    else if (shared)
        snprintf(why, sizeof why, "%d other rank%s on this node drive%s the same GPU (%d GPU%s visible to this rank, %d "
                 "ranks on the node): NCCL needs a GPU per rank (start at most one rank per GPU, or use parallel.comm "
                 "mpi)", shared, shared == 1 ? "" : "s", shared == 1 ? "s" : "", cuda_device_count(),
                 cuda_device_count() == 1 ? "" : "s", g->local_size);
    else nccl_available(why, sizeof why);
    float bad = why[0] != 0;
    comm_all_reduce_max(&g->world, &bad, 1);
    if (bad && !why[0]) snprintf(why, sizeof why, "another rank cannot use NCCL");
    if (bad && !strcmp(r->parallel.comm, "nccl")) {
        if (run->rank0) fprintf(stderr, "mtrain: error: %s: parallel.comm nccl: %s\n", r->source, why);
        parallel_finalize();
        exit(EXIT_USAGE);
    }
    if (bad) {
        if (gpu && g->world_size > 1 && run->rank0)
            warn("%d GPU ranks communicate over MPI through host memory (correct, not fast): %s", g->world_size, why);
        return;
    }
    grid_use_nccl(g, r->model.num_experts > 0, model_head_uses_embed(&r->model));
    watchdog_set_failure_hooks(nccl_poll_async_errors, nccl_abort_all);
    if (g->world_size > 1) run->comm_name = "nccl";
}

static void setup(struct run *run) {
    const struct recipe *r = run->r;
    grid_create(&run->grid, &r->parallel);
    run->rank0 = run->grid.world_rank == 0;
    /* a run that cannot be resuming learns at once whether log.dir is its own */
    if (starts_fresh(run)) logdir_claim(run, NULL);
    watchdog_start(&run->grid, r->train.hang_timeout_s, r->train.abort_timeout_s);
    parallel_abort_on_error(1); /* an error on one rank ends every rank at once, naming it */
    /* GPU ranks: one device per rank on a node */
    int cuda = !strcmp(run->be->name, "cuda");
    if (cuda || run->gpu_comm_on_cpu) {
        cuda_use_device(run->grid.local_rank);
        grid_stage_device(&run->grid, run->be); /* the pipeline's sends, and every group under MPI */
    }
    if (cuda) cuda_set_tf32(r->train.tf32), cuda_set_deterministic(r->train.deterministic);
    choose_comm(run);
    /* ranks sharing a node share its cores: without a setting, split them */
    int threads = r->train.threads;
    if (threads == 0 && run->grid.local_size > 1 && !getenv("OMP_NUM_THREADS")) {
        threads = (int)sysconf(_SC_NPROCESSORS_ONLN) / run->grid.local_size;
        if (threads < 1) threads = 1;
    }
    if (threads > 0) {
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);
    }
    signal_says = run->rank0;
    run->train = prefetcher_create(r, SPLIT_TRAIN, run->grid.dp, run->grid.dp_rank);
    if (r->train.eval_interval > 0 && r->data.valid_fraction > 0) run->valid = blend_from_recipe(r, SPLIT_VALID);
    trainer_create(&run->tr, run->be, r, &run->grid);
    if (r->model.init_from[0]) {
        weights_load_each(&run->tr.model.table, r->model.init_from, master_put, &run->tr.model.master);
        transformer_params_changed(&run->tr.model);
    } else {
        transformer_init_params(&run->tr.model, r->train.seed);
    }
    run->st.lr_scale = 1.0;
    run->saved_step = -1;
    ckpt_setup(run);
    run->flops_per_token = model_flops_per_token(&r->model, r->train.seq_len);
    run->peak_tflops = r->train.peak_tflops;
    if (run->peak_tflops == 0 && run->be->peak_tflops) run->peak_tflops = run->be->peak_tflops(r->train.tf32);
    run->batch = xmalloc(sizeof(int32_t) * r->train.global_batch * (r->train.seq_len + 1));
    if (run->rank0 && mkdir_p(r->log.dir) != 0) die("cannot create log.dir %s", r->log.dir);
    snprintf(run->metrics_path, sizeof run->metrics_path, "%s/metrics.jsonl", r->log.dir);
}

static void teardown(struct run *run) {
    watchdog_phase(WATCHDOG_END, run->st.step);
    finish_save(run, 1);
    if (run->metrics) xfclose(run->metrics, run->metrics_path);
    if (tb_close(&run->tb) != 0) die("cannot write %s", run->tb.path);
    if (run->r->checkpoint.dir[0]) ckpt_snapshot_free(&run->snap);
    free(run->batch);
    trainer_free(&run->tr);
    prefetcher_free(run->train);
    if (run->valid) blend_free(run->valid);
    watchdog_set_failure_hooks(NULL, NULL); /* the communicators go now */
    parallel_abort_on_error(0);
    grid_free(&run->grid);
    watchdog_stop();
}

/* One step; returns 0 if it was applied, 1 if it was rolled back. */
static int one_step(struct run *run, int step) {
    const struct recipe *r = run->r;
    int G = r->train.global_batch;
    double t0 = now_seconds();
    const int32_t *batch = prefetcher_next(run->train, run->st.consumed_samples);
    timeline_step_begin(step);
    struct step_stats st = trainer_compute(&run->tr, batch, G / run->grid.dp);
    if (run->o->inject_nan == step && !run->injected_nan) {
        run->injected_nan = 1;
        st.loss = st.grad_norm = NAN;
    }
    if (run->o->inject_spike == step && !run->injected_spike) {
        run->injected_spike = 1;
        st.loss *= 100;
    }
    run->history[run->nhistory % HISTORY].step = step;
    run->history[run->nhistory % HISTORY].loss = st.loss;
    run->history[run->nhistory % HISTORY].grad_norm = st.grad_norm;
    run->nhistory++;
    if (r->rewind.enabled) {
        enum rewind_reason why = rewind_check(&r->rewind, &run->st, st.loss, st.grad_norm);
        if (why != REWIND_NONE) {
            timeline_rewound();
            timeline_step_end(step);
            rewind_to_checkpoint(run, step, why);
            return 1;
        }
    } else if (!isfinite(st.loss) || !isfinite(st.grad_norm)) {
        fail_run(run, "step %d: loss %g, grad norm %g (set rewind.enabled to recover automatically)", step, st.loss,
                 st.grad_norm);
    }
    trainer_update(&run->tr, &st, step <= run->st.lr_scale_until ? run->st.lr_scale : 1.0);
    timeline_step_end(step);
    run->st.step = step;
    run->st.opt_step = run->tr.opt.step;
    run->st.consumed_samples += G;
    log_step(run, step, &st, now_seconds() - t0);
    return 0;
}

int pretrain_run(const struct recipe *r, const struct pretrain_opts *o) {
    static struct run run;
    memset(&run, 0, sizeof run);
    run.r = r, run.o = o;
    /* a configuration this GPU cannot run: exit 2, one message from rank 0
     * (asked of the node's first GPU: the ranks' own are chosen later) */
    const char *why = backend_precision_error(r->train.device, r->train.precision);
    if (why) {
        if (parallel_world_rank() == 0) fprintf(stderr, "mtrain: error: %s: %s\n", r->source, why);
        return EXIT_USAGE;
    }
    run.be = backend_get(r->train.device, r->train.precision);
    if (!run.be) return EXIT_RUNTIME;
    /* a test of the GPU ranks' communication without GPUs (tests/integration/nccl_mock.sh, with stand-in NCCL
     * and CUDA runtime libraries): CPU ranks whose buffers come from cudaMalloc and move through cudaMemcpy,
     * so NCCL and the MPI staging get only what a GPU run gives them */
    if (getenv("MTRAIN_TEST_GPU_COMM_ON_CPU") && !strcmp(run.be->name, "cpu"))
        run.be = backend_in_device_memory(run.be), run.gpu_comm_on_cpu = 1;
    /* MTRAIN_PROFILE: where each step's time goes, over the steps run after the first (a rewound one included) */
    int profiling = profile_requested(), profiled = -1;
    if (profiling) run.be = backend_profiled(run.be);
    /* MTRAIN_TIMELINE (checked with the recipe): one step's timeline, on the device's clock on GPUs */
    timeline_setup(timeline_step_requested(), strcmp(run.be->name, "cpu") != 0);
    install_signals(); /* before the (possibly long) load, so a signal then is not fatal */
    setup(&run);
    watchdog_phase(WATCHDOG_LOAD, 0);
    const char *from = resume(&run);
    if (!starts_fresh(&run)) logdir_claim(&run, from);
    /* a resumed run continues the metrics stream of the run it resumes, from
     * the step it resumes at: what the interrupted run logged after it goes */
    if (run.rank0 && from) trim_metrics(run.metrics_path, run.st.step);
    if (run.rank0) run.metrics = xfopen(run.metrics_path, from ? "a" : "w");
    check_final_space(&run);
    if (run.rank0 && r->log.tensorboard && tb_open(&run.tb, r->log.dir, from ? run.st.step : -1) != 0)
        die("cannot create a TensorBoard event file in %s: %s", r->log.dir, strerror(errno));
    if (from)
        event(&run, "{\"event\":\"resume\",\"step\":%d,\"from\":\"%s\",\"consumed_samples\":%lld}", run.st.step,
              from, (long long)run.st.consumed_samples);
    struct rlimit no_core = {0, 0};
    if (o->inject_crash || o->inject_crash_in_save) setrlimit(RLIMIT_CORE, &no_core); /* injected aborts: no core files */
    struct blas_info blas;
    memset(&blas, 0, sizeof blas);
    char blas_json[1024] = "";
    int on_cpu = !strcmp(run.be->name, "cpu"); /* either precision */
    const char *precision = precision_name(run.be->precision);
    if (on_cpu) {
        blas_info_get(&blas);
        snprintf(blas_json, sizeof blas_json, ",\"blas_core\":\"%s\",\"blas_config\":\"%s\"%s%s%s", blas.core,
                 blas.config, blas.note[0] ? ",\"blas_note\":\"" : "", blas.note, blas.note[0] ? "\"" : "");
        if (run.rank0 && blas.better[0]) warn("%s", blas.note);
    }
    if (run.rank0) {
        const struct grid *g = &run.grid;
        struct dataset *ds = prefetcher_dataset(run.train);
        printf("mtrain %s | %s | %s %lld params | device %s %s | threads %d | ranks %d (tp %d pp %d dp %d ep %d cp %d; %s) | "
               "data %s: %lld tokens, %lld docs\n",
               MTRAIN_VERSION, r->source, r->model.arch, (long long)model_param_count(&r->model), run.be->name, precision,
               omp_get_max_threads(), g->world_size, g->tp, g->pp, g->dp, g->ep, g->cp, run.comm_name, dataset_dir(ds),
               (long long)dataset_num_tokens(ds),
               (long long)dataset_num_docs(ds));
        if (on_cpu)
            printf("blas: OpenBLAS %s kernels (%s)%s%s\n", blas.core, blas.config, blas.note[0] ? "; " : "", blas.note);
    }
    char ranks_path[RECIPE_PATH_MAX + 32];
    snprintf(ranks_path, sizeof ranks_path, "%s/ranks.json", r->log.dir);
    grid_write_ranks(&run.grid, ranks_path);
    event(&run,
          "{\"event\":\"start\",\"step\":%d,\"params\":%lld,\"flops_per_token\":%.6g,\"steps\":%d,"
          "\"device\":\"%s\",\"precision\":\"%s\",\"comm\":\"%s\",\"peak_tflops\":%g,\"hang_timeout_s\":%g%s}",
          run.st.step, (long long)model_param_count(&r->model), run.flops_per_token, r->train.steps, run.be->name, precision,
          run.comm_name,
          run.peak_tflops, r->train.hang_timeout_s, blas_json);
    double t_start = now_seconds();
    int first = run.st.step + 1;
    run.t_start = t_start, run.first_step = first;
    for (int step = first; step <= r->train.steps; step = run.st.step + 1) {
        /* every rank must agree to stop at the same step boundary */
        watchdog_phase(WATCHDOG_STEP, step);
        float stop = stop_signal;
        comm_all_reduce_max(&run.grid.world, &stop, 1);
        if (stop != 0 || (o->stop_after > 0 && run.st.step >= o->stop_after)) {
            const char *name = stop == 0           ? "stop-after"
                               : stop == SIGUSR1  ? "SIGUSR1"
                               : stop == SIGINT   ? "SIGINT"
                                                  : "SIGTERM";
            if (run.rank0) { /* what is really saved: without checkpoint.dir only the final weights */
                if (r->checkpoint.dir[0])
                    printf("%s: saving a checkpoint at step %d and exiting\n", name, run.st.step);
                else
                    printf("%s: no checkpoint.dir, so no checkpoint to resume from: saving the weights of step %d to "
                           "%s/model.safetensors and exiting\n", name, run.st.step, r->log.dir);
            }
            watchdog_phase(WATCHDOG_SAVE, run.st.step);
            if (r->checkpoint.dir[0] && run.saved_step != run.st.step) save_checkpoint(&run);
            char path[RECIPE_PATH_MAX + 32];
            save_final_weights(&run, path, sizeof path);
            event(&run, "{\"event\":\"signal\",\"signal\":\"%s\",\"step\":%d}", name, run.st.step);
            write_timeline(&run, 1);
            teardown(&run);
            return 0;
        }
        if (o->inject_crash == step && (o->inject_crash_rank < 0 || o->inject_crash_rank == run.grid.world_rank)) {
            fprintf(stderr, "mtrain: injected crash at step %d\n", step);
            abort();
        }
        int rewound = one_step(&run, step);
        if (timeline_due()) write_timeline(&run, 0);
        if (profiled >= 0) profiled++;
        if (rewound) continue;
        if (profiling && profiled < 0 && step < r->train.steps) profile_reset(), profiled = 0;
        int counting = profile_counting(0); /* steps only: not evaluation, not saving */
        /* automatic hang timeout: settled by this rank's first steps */
        double hang_timeout = watchdog_step_done();
        if (hang_timeout > 0)
            event(&run, "{\"event\":\"watchdog\",\"step\":%d,\"hang_timeout_s\":%.1f}", step, hang_timeout);
        if (run.valid && (step % r->train.eval_interval == 0 || step == r->train.steps)) run_eval(&run, step);
        int save = r->checkpoint.dir[0] && r->checkpoint.interval > 0 &&
                   (step % r->checkpoint.interval == 0 || step == r->train.steps);
        if (save || run.commit_pending) watchdog_phase(WATCHDOG_SAVE, step);
        if (save) save_checkpoint(&run);
        finish_save(&run, 0);
        profile_counting(counting);
    }
    watchdog_phase(WATCHDOG_END, run.st.step);
    write_timeline(&run, 1);
    if (profiling) { /* every rank's table in LOG_DIR (pipeline stages differ); rank 0's also in metrics and on stdout */
        int steps = profiled >= 0 ? profiled : run.st.step - first + 1; /* a one-step run: that step */
        char *json = profile_json(steps), file[RECIPE_PATH_MAX + 48];
        snprintf(file, sizeof file, "%s/profile-rank-%05d.json", r->log.dir, run.grid.world_rank);
        write_file_atomic(file, json, strlen(json));
        if (run.rank0) event(&run, "%s", json), profile_report(stdout, steps);
        free(json);
    }
    char path[RECIPE_PATH_MAX + 32];
    save_final_weights(&run, path, sizeof path);
    log_comm(&run, run.st.step - first + 1);
    /* peak memory of the whole run: host RSS, or the device's memory in use; rank 0's (pipeline stage 0), the
     * largest rank's with its rank and the smallest (pipeline stages and checkpoint writers differ) */
    float peak = (float)(run.be->device_mem_mib ? run.be->device_mem_mib() : peak_rss_mib()), peak_max = peak;
    float peak_min = peak;
    int peak_rank = 0, world = run.grid.world.size;
    float *peaks = xmalloc(sizeof(float) * world);
    comm_all_gather(&run.grid.world, &peak, peaks, 1);
    for (int i = 1; i < world; i++) {
        if (peaks[i] > peak_max) peak_max = peaks[i], peak_rank = i;
        if (peaks[i] < peak_min) peak_min = peaks[i];
    }
    free(peaks);
    event(&run,
          "{\"event\":\"end\",\"step\":%d,\"seconds\":%.3f,\"rewinds\":%d,\"peak_mem_mib\":%.1f,"
          "\"peak_mem_mib_max\":%.1f,\"peak_mem_rank\":%d,\"peak_mem_mib_min\":%.1f}",
          run.st.step, now_seconds() - t_start, run.st.rewinds, peak, peak_max, peak_rank, peak_min);
    if (run.rank0)
        printf("done: step %d, %.1f s; metrics in %s, weights in %s\n", run.st.step, now_seconds() - t_start,
               run.metrics_path, path);
    teardown(&run);
    return 0;
}
