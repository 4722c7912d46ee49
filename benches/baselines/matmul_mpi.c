/* C = A x B (examples/matmul.rs's matrices, seed 1) as an MPI user writes
 * it: rank 0 holds A and B, broadcasts B (MPI_Bcast) and scatters A's rows
 * in blocks (MPI_Scatterv); every rank computes its rows of C with the
 * i-k-j loop of matmul.c; C's rows are gathered on rank 0 (MPI_Gatherv)
 * for the same check line as the other matmul baselines.
 *   mpirun -n R matmul_mpi [n=1024] [seed=1]
 * The time printed is the slowest rank's, from a barrier before the
 * broadcast to the end of its rows: distributing the inputs is part of
 * the work, as hyfi's matmul fetches B's pages inside its timed phase.
 * The gather for the check is not timed. */
#include <mpi.h>

#include "common.h"

/* Rows [first, first + count) of rank r of `size`: blocks, the first
 * n % size ranks one row more. */
static inline void block_of(long n, int size, int r, long *first, long *count) {
    const long base = n / size, extra = n % size;
    *count = base + (r < extra ? 1 : 0);
    *first = r * base + (r < extra ? r : extra);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const long n = arg_or(argc, argv, 1, 1024);
    const uint64_t seed = (uint64_t)arg_or(argc, argv, 2, 1);
    if (n < 1 || n > 46340) { /* n * n doubles counted in an int (MPI) */
        if (rank == 0) fprintf(stderr, "usage: matmul_mpi [1 <= n <= 46340] [seed]\n");
        MPI_Finalize();
        return 2;
    }
    int *counts = xmalloc(size * sizeof(int)), *displs = xmalloc(size * sizeof(int));
    for (int r = 0; r < size; r++) {
        long first, count;
        block_of(n, size, r, &first, &count);
        counts[r] = (int)(count * n);
        displs[r] = (int)(first * n);
    }
    long first, mine;
    block_of(n, size, rank, &first, &mine);
    double *a = NULL, *b;
    if (rank == 0) {
        a = random_matrix(n, seed);
        b = random_matrix(n, seed ^ 0x5555555555555555ULL);
    } else {
        b = xmalloc(n * n * sizeof(double));
    }
    double *arows = xmalloc((mine > 0 ? mine : 1) * n * sizeof(double));
    double *crows = xmalloc((mine > 0 ? mine : 1) * n * sizeof(double));
    for (long k = 0; k < mine * n; k++) crows[k] = 0.0;

    MPI_Barrier(MPI_COMM_WORLD);
    const double t = now();
    MPI_Bcast(b, (int)(n * n), MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Scatterv(a, counts, displs, MPI_DOUBLE, arows, counts[rank], MPI_DOUBLE, 0, MPI_COMM_WORLD);
    for (long i = 0; i < mine; i++) {
        double *ci = crows + i * n;
        for (long k = 0; k < n; k++) {
            const double aik = arows[i * n + k];
            const double *bk = b + k * n;
            for (long j = 0; j < n; j++) ci[j] += aik * bk[j];
        }
    }
    double secs = now() - t, slowest = 0.0;
    MPI_Reduce(&secs, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    double *c = rank == 0 ? xmalloc(n * n * sizeof(double)) : NULL;
    MPI_Gatherv(crows, counts[rank], MPI_DOUBLE, c, counts, displs, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        double sum = 0.0;
        for (long k = 0; k < n * n; k++) sum += c[k];
        printf("baselines matmul mpi (%d ranks)\n", size);
        printf("time: %.6f\n", slowest);
        printf("check: sum_bits=%016" PRIx64 "\n", bits(sum));
    }
    MPI_Finalize();
    return 0;
}
