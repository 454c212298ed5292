/* A synthetic English-like corpus for demos and tests: sentences from a
 * small word list with number agreement and a recurring main character per
 * document, so a tiny model has real structure to learn and its loss falls. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* Longest document synthetic_document can write (excluding the terminator). */
#define SYNTHETIC_DOC_MAX 2048

/* Write document doc of the corpus for seed into buf (SYNTHETIC_DOC_MAX + 1
 * bytes), NUL-terminated; returns its length. Depends only on (seed, doc). */
size_t synthetic_document(uint64_t seed, int64_t doc, char *buf);
