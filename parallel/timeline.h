/* The timeline of one training step (MTRAIN_TIMELINE=N traces step N): when
 * each forward and backward ran and when each communication call began and
 * ended, per rank, so a user sees whether the data-parallel gradient
 * reduction ran while backward went on (parallel.overlap_grad_reduce) or
 * after it. Times come from the device's clock on GPU ranks (a CUDA event
 * recorded on the stream each piece runs on: the compute stream, or an NCCL
 * group's stream) and from the host's on CPU ranks, where a non-blocking
 * call's end is when the wait for it returned. Calls that run on the host
 * alone (MPI on host memory: the loss, flags, statistics) read the host's
 * clock on GPU ranks too, from the step's start, when the device is
 * synchronized once to line the two clocks up. Recording adds an event (or
 * a clock read) around each piece and changes no numbers.
 *
 * A span begun in step N is followed to its end, which may come in step N+1
 * (ZeRO-1's parameter gathers complete in the next forward); the timeline is
 * due after step N+1 or at the end of the run, whichever comes first.
 * Memory: a fixed table of TIMELINE_SPANS spans (more are counted, not kept). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define TIMELINE_SPANS 16384
/* a span's "stream" when it runs on the host alone: the host's clock */
#define TIMELINE_HOST_CLOCK ((void *)-1)

enum timeline_phase { TIMELINE_COMPUTE, TIMELINE_UPDATE };

/* MTRAIN_TIMELINE's value: 0 when unset or empty, else the step (> 0);
 * -1 with err set when it is not a positive integer */
int timeline_parse_step(const char *value, char *err, size_t n);
/* MTRAIN_TIMELINE's step from the environment (0: none, or not valid) */
int timeline_step_requested(void);

/* Trace step `step` (0: nothing); device_clock: time with CUDA events */
void timeline_setup(int step, int device_clock);
/* The training loop's step boundaries: step_begin before the step's
 * forwards, step_end after its update (or after its rollback). */
void timeline_step_begin(int step);
void timeline_step_end(int step);
/* The traced step is being rolled back (a rewind): said in the summary */
void timeline_rewound(void);
/* Spans begun from here on belong to the step's update (its gradient
 * reductions are those begun before) */
void timeline_phase(enum timeline_phase phase);

/* A span begins: what ("forward", "all_reduce_start", ...), on group (NULL:
 * the compute lane), bytes (communication payload), started (a non-blocking
 * call: completed later); stream: the CUDA stream it runs on (NULL: the
 * compute stream; TIMELINE_HOST_CLOCK: the host). micro_batch and chunk
 * name a forward or backward (-1:
 * none). Returns its id, 0 when nothing is being recorded. */
int timeline_begin(const char *what, const char *group, uint64_t bytes, int started, void *stream);
int timeline_compute_begin(const char *what, int micro_batch, int chunk);
/* A compute span's work in floating-point operations, written with it
 * ("flops"): what a span did, independent of the machine's speed (the
 * context-parallel ring's balance is read from it) */
void timeline_work(int id, uint64_t flops);
/* The span ends (id 0: nothing; ending it again moves its end) */
void timeline_end(int id, void *stream);

/* The traced step and the one after it ran (or the run ended after it):
 * time to write the timeline */
int timeline_due(void);
/* The traced step began and its timeline is not yet written (the end of
 * the run writes it); timeline_done: it is written */
int timeline_pending(void);
int timeline_done(void);

/* One span in milliseconds since the traced step began */
struct timeline_span_ms {
    const char *what, *group; /* group NULL: compute */
    double t0, t1;
    uint64_t bytes;
    int started, phase, unfinished;
};
/* What the timeline says of the step's data-parallel gradient reduction:
 * the spans on the data-parallel groups ("dp", "edp") begun before the
 * update; hidden is the part of their time (their union) during which a
 * forward or backward ran, exposed the rest. */
struct timeline_summary {
    int step, spans, dropped, unfinished, rewound;
    double step_ms;     /* the traced step's begin to its update's end */
    double compute_ms;  /* union of its forwards and backwards */
    double grad_ms, grad_hidden_ms, grad_exposed_ms;
    uint64_t grad_bytes;
    int grad_calls;
};
void timeline_summarize(const struct timeline_span_ms *s, int n, struct timeline_summary *out);

/* Resolve the recorded spans (waits for the device), fill *sum, and return
 * the timeline as Chrome trace JSON (Perfetto, chrome://tracing: one process
 * per rank, a lane for compute and one per communication group, a started
 * call as an async slice, since those overlap on one group); the caller
 * frees it. The recording is then over: later steps record nothing. */
char *timeline_finish(int rank, struct timeline_summary *sum);
