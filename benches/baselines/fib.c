/* fib(n) with OpenMP tasks, calls below the cutoff as the plain recursion
 * (scripts/side-by-side.sh's fib-cutoff kernel; without a cutoff every call
 * would be a libgomp task, hundreds of millions of them for fib(40)).
 *   fib [n=40] [cutoff=25] */
#include "common.h"

static long fib_seq(long n) { return n < 2 ? n : fib_seq(n - 1) + fib_seq(n - 2); }

static long fib_task(long n, long cutoff) {
    if (n < 2) return n;
    if (n < cutoff) return fib_seq(n);
    long a, b;
#pragma omp task shared(a)
    a = fib_task(n - 1, cutoff);
    b = fib_task(n - 2, cutoff);
#pragma omp taskwait
    return a + b;
}

int main(int argc, char **argv) {
    const long n = arg_or(argc, argv, 1, 40), cutoff = arg_or(argc, argv, 2, 25);
    if (n < 0 || n > 92 || cutoff < 2) {
        fprintf(stderr, "usage: fib [0 <= n <= 92] [cutoff >= 2]\n");
        return 2;
    }
    warm_up();
    long v = 0;
    const double t = now();
#pragma omp parallel
#pragma omp single
    v = fib_task(n, cutoff);
    const double secs = now() - t;
    printf("baselines fib openmp tasks, cutoff %ld (%d threads)\n", cutoff, omp_get_max_threads());
    printf("time: %.6f\n", secs);
    printf("check: value=%ld\n", v);
    return 0;
}
