/* C = A x B (examples/matmul.rs's matrices, seed 1), i-k-j loop order,
 * OpenMP over the rows of C.
 *   matmul [n=1024] [seed=1] */
#include "common.h"

int main(int argc, char **argv) {
    const long n = arg_or(argc, argv, 1, 1024);
    const uint64_t seed = (uint64_t)arg_or(argc, argv, 2, 1);
    if (n < 1) {
        fprintf(stderr, "usage: matmul [n >= 1] [seed]\n");
        return 2;
    }
    double *a = random_matrix(n, seed), *b = random_matrix(n, seed ^ 0x5555555555555555ULL);
    double *c = xmalloc(n * n * sizeof(double));
    for (long k = 0; k < n * n; k++) c[k] = 0.0;
    warm_up();
    const double t = now();
#pragma omp parallel for
    for (long i = 0; i < n; i++) {
        double *ci = c + i * n;
        for (long k = 0; k < n; k++) {
            const double aik = a[i * n + k];
            const double *bk = b + k * n;
            for (long j = 0; j < n; j++) ci[j] += aik * bk[j];
        }
    }
    const double secs = now() - t;
    double sum = 0.0;
    for (long k = 0; k < n * n; k++) sum += c[k];
    printf("baselines matmul openmp (%d threads)\n", omp_get_max_threads());
    printf("time: %.6f\n", secs);
    printf("check: sum_bits=%016" PRIx64 "\n", bits(sum));
    return 0;
}
