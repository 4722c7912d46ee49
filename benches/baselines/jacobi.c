/* Jacobi sweeps on an n x n grid, top edge 1.0 (examples/jacobi.rs's
 * problem), one OpenMP loop over the rows per sweep with a max reduction.
 *   jacobi [n=1024] [iters=200]        (eps = 0: all sweeps run) */
#include "common.h"

int main(int argc, char **argv) {
    const long n = arg_or(argc, argv, 1, 1024), iters = arg_or(argc, argv, 2, 200);
    if (n < 3 || iters < 1) {
        fprintf(stderr, "usage: jacobi [n >= 3] [iters >= 1]\n");
        return 2;
    }
    double *old = xmalloc(n * n * sizeof(double)), *new = xmalloc(n * n * sizeof(double));
    for (long k = 0; k < n * n; k++) old[k] = new[k] = k < n ? 1.0 : 0.0;
    warm_up();
    double maxdiff = 0.0;
    const double t = now();
    for (long it = 0; it < iters; it++) {
        double m = 0.0;
#pragma omp parallel for reduction(max : m)
        for (long i = 1; i < n - 1; i++) {
            const double *up = old + (i - 1) * n, *mid = old + i * n, *down = old + (i + 1) * n;
            double *out = new + i * n;
            for (long j = 1; j < n - 1; j++) {
                const double v = (up[j] + down[j] + mid[j - 1] + mid[j + 1]) * 0.25;
                out[j] = v;
                double d = v - mid[j];
                if (d < 0) d = -d;
                if (d > m) m = d;
            }
        }
        double *tmp = old;
        old = new;
        new = tmp;
        maxdiff = m;
    }
    const double secs = now() - t;
    printf("baselines jacobi openmp (%d threads)\n", omp_get_max_threads());
    printf("time: %.6f\n", secs);
    printf("check: maxdiff_bits=%016" PRIx64 " grid_bits=%016" PRIx64 "\n", bits(maxdiff),
           fnv_doubles(old, n * n));
    return 0;
}
