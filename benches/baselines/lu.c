/* LU with partial pivoting (examples/lu.rs's matrix, seed 1, and its
 * arithmetic: l = a(i,k) / a(k,k) stored in place, row i -= l x row k),
 * rows swapped, the elimination of each step an OpenMP loop over rows.
 *   lu [n=1024] [seed=1] */
#include "common.h"

int main(int argc, char **argv) {
    const long n = arg_or(argc, argv, 1, 1024);
    const uint64_t seed = (uint64_t)arg_or(argc, argv, 2, 1);
    if (n < 1) {
        fprintf(stderr, "usage: lu [n >= 1] [seed]\n");
        return 2;
    }
    double *a = random_matrix(n, seed);
    long *perm = xmalloc(n * sizeof(long));
    for (long i = 0; i < n; i++) perm[i] = i;
    long singular_at = -1;
    warm_up();
    const double t = now();
    for (long k = 0; k < n; k++) {
        long p = k;
        double m = a[k * n + k];
        if (m < 0) m = -m;
        for (long i = k + 1; i < n; i++) {
            double d = a[i * n + k];
            if (d < 0) d = -d;
            if (d > m) {
                m = d;
                p = i;
            }
        }
        if (m == 0.0) {
            singular_at = k;
            break;
        }
        if (p != k) {
            for (long j = 0; j < n; j++) {
                const double x = a[k * n + j];
                a[k * n + j] = a[p * n + j];
                a[p * n + j] = x;
            }
            const long x = perm[k];
            perm[k] = perm[p];
            perm[p] = x;
        }
        const double *pivot = a + k * n;
#pragma omp parallel for
        for (long i = k + 1; i < n; i++) {
            double *row = a + i * n;
            const double l = row[k] / pivot[k];
            row[k] = l;
            for (long j = k + 1; j < n; j++) row[j] -= l * pivot[j];
        }
    }
    const double secs = now() - t;
    printf("baselines lu openmp (%d threads)\n", omp_get_max_threads());
    printf("time: %.6f\n", secs);
    print_lu_check(a, perm, n, singular_at);
    return 0;
}
