/* Explicit heat diffusion on an n x n grid (examples/diffusion.rs's
 * problem: top edge 100, left edge 50, the rest 0), one OpenMP loop over
 * the rows per step, no reduction (the compiler vectorises the row loop).
 *   diffusion [n=1026] [steps=100] */
#include "common.h"

static inline double step(double mid, double up, double down, double left, double right) {
    return mid + 0.2 * ((up + down + left + right) - 4.0 * mid);
}

int main(int argc, char **argv) {
    const long n = arg_or(argc, argv, 1, 1026), steps = arg_or(argc, argv, 2, 100);
    if (n < 3 || steps < 1) {
        fprintf(stderr, "usage: diffusion [n >= 3] [steps >= 1]\n");
        return 2;
    }
    double *old = xmalloc(n * n * sizeof(double)), *new = xmalloc(n * n * sizeof(double));
    for (long i = 0; i < n; i++)
        for (long j = 0; j < n; j++) old[i * n + j] = new[i * n + j] = i == 0 ? 100.0 : j == 0 ? 50.0 : 0.0;
    warm_up();
    const double t = now();
    for (long s = 0; s < steps; s++) {
#pragma omp parallel for
        for (long i = 1; i < n - 1; i++) {
            const double *up = old + (i - 1) * n, *mid = old + i * n, *down = old + (i + 1) * n;
            double *out = new + i * n;
            for (long j = 1; j < n - 1; j++) out[j] = step(mid[j], up[j], down[j], mid[j - 1], mid[j + 1]);
        }
        double *tmp = old;
        old = new;
        new = tmp;
    }
    const double secs = now() - t;
    /* The fingerprint examples/diffusion.rs prints: FNV over 64-bit words. */
    uint64_t h = 0xcbf29ce484222325ULL;
    for (long k = 0; k < n * n; k++) h = (h ^ bits(old[k])) * 0x100000001b3ULL;
    printf("baselines diffusion openmp (%d threads)\n", omp_get_max_threads());
    printf("time: %.6f\n", secs);
    printf("check: grid_bits=%016" PRIx64 "\n", h);
    return 0;
}
