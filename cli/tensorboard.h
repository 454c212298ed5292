/* TensorBoard event files written by mtrain itself (log.tensorboard): the
 * scalars of metrics.jsonl as Event protobufs in TFRecord framing, readable by
 * TensorBoard and its EventAccumulator without TensorFlow. Format details in
 * docs/formats.md. */
#pragma once
#include <stdint.h>
#include <stdio.h>

struct tb_writer {
    FILE *f;
    char path[1200];
};

/* Create DIR/events.out.tfevents.<unix time>.<host> (a ".N" suffix when that
 * name is taken) and write the file_version event. When resume_step >= 0 the
 * run continues an earlier one from that step: a SessionLog START at
 * resume_step + 1 tells readers to drop the earlier files' values from that
 * step on, as metrics.jsonl is trimmed. Returns 0, or -1 with errno set. */
int tb_open(struct tb_writer *w, const char *dir, int resume_step);
/* One line of metrics.jsonl: a step line gives one scalar per top-level
 * number (tag = its key; step and consumed_samples are the x axis, not
 * scalars); an eval event gives val_loss. Other events are not scalars.
 * Returns 0, or -1 if the write failed. */
int tb_log_json_line(struct tb_writer *w, const char *line);
/* Close the file; returns 0, or -1 if a buffered write failed. */
int tb_close(struct tb_writer *w);

/* The pieces, for tests: CRC-32C (Castagnoli) and the TFRecord mask of it. */
uint32_t tb_crc32c(const void *data, size_t n);
uint32_t tb_masked_crc(const void *data, size_t n);
