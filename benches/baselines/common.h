/* Shared pieces of the C/OpenMP baselines of scripts/side-by-side.sh:
 * a monotonic clock, the examples' splitmix64 matrices, and the FNV-1a
 * fingerprint examples/jacobi.rs prints as grid_bits.
 *
 * Every program times only its computation and prints
 *   time: <seconds>
 *   check: <key=value ...>
 * with the same check line as examples/baselines.rs's sequential and
 * rayon versions of the kernel. */
#ifndef HYFI_BASELINES_COMMON_H
#define HYFI_BASELINES_COMMON_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>

static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Starts the OpenMP threads before the clock does. */
static inline void warm_up(void) {
    int t = 0;
#pragma omp parallel reduction(+ : t)
    t += 1;
    if (t < 1) abort();
}

static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

/* examples/common/mod.rs random_matrix: n*n entries in [-1, 1). */
static inline double *random_matrix(size_t n, uint64_t seed) {
    double *m = xmalloc(n * n * sizeof(double));
    uint64_t s = seed;
    for (size_t k = 0; k < n * n; k++) {
        s += 0x9e3779b97f4a7c15ULL;
        uint64_t z = s;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        m[k] = (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    }
    return m;
}

static inline uint64_t bits(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline uint64_t fnv_doubles(const double *v, size_t len) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t k = 0; k < len; k++) {
        uint64_t u = bits(v[k]);
        for (int b = 0; b < 8; b++) {
            h ^= (u >> (8 * b)) & 0xff;
            h *= 0x100000001b3ULL;
        }
    }
    return h;
}

/* The LU baselines' check line (examples/baselines.rs's): the bits of the
 * sum of the n x n factor in row-major order, rows in pivot order, and an
 * FNV-1a hash of the permutation. */
static inline void print_lu_check(const double *lu, const long *perm, long n, long singular_at) {
    double sum = 0.0;
    for (long k = 0; k < n * n; k++) sum += lu[k];
    uint64_t h = 0xcbf29ce484222325ULL;
    for (long i = 0; i < n; i++) {
        h ^= (uint64_t)perm[i];
        h *= 0x100000001b3ULL;
    }
    printf("check: sum_bits=%016" PRIx64 " perm_hash=%016" PRIx64 " singular_at=%ld\n", bits(sum), h,
           singular_at);
}

static inline long arg_or(int argc, char **argv, int i, long dflt) {
    return argc > i ? strtol(argv[i], NULL, 10) : dflt;
}

#endif
