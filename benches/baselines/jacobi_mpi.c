/* Jacobi sweeps on an n x n grid, top edge 1.0 (examples/jacobi.rs's
 * problem), as an MPI user writes it: the interior rows divided into
 * contiguous blocks, one per rank; each sweep exchanges one halo row with
 * each neighbour (MPI_Sendrecv) and combines the ranks' maxdiff with
 * MPI_Allreduce(MPI_MAX). The grid is gathered on rank 0 after the timed
 * sweeps for the same check line as the other baselines.
 *   mpirun -n R jacobi_mpi [n=1024] [iters=200]   (eps = 0: all sweeps run)
 * The time printed is the slowest rank's, from a barrier before the first
 * sweep to the end of the last. */
#include <mpi.h>

#include "common.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const long n = arg_or(argc, argv, 1, 1024), iters = arg_or(argc, argv, 2, 200);
    if (n < 3 || iters < 1 || size > n - 2) {
        if (rank == 0) fprintf(stderr, "usage: jacobi_mpi [n >= 3, n - 2 >= ranks] [iters >= 1]\n");
        MPI_Finalize();
        return 2;
    }
    /* Interior rows 1..n-2; this rank owns [lo, hi). */
    const long rows = n - 2, per = rows / size, extra = rows % size;
    const long lo = 1 + rank * per + (rank < extra ? rank : extra);
    const long hi = lo + per + (rank < extra ? 1 : 0);
    const long local = hi - lo + 2; /* with one halo row above and below */
    double *old = xmalloc(local * n * sizeof(double)), *new = xmalloc(local * n * sizeof(double));
    for (long r = 0; r < local; r++)
        for (long j = 0; j < n; j++) old[r * n + j] = new[r * n + j] = (lo - 1 + r) == 0 ? 1.0 : 0.0;
    const int up = rank > 0 ? rank - 1 : MPI_PROC_NULL;
    const int down = rank < size - 1 ? rank + 1 : MPI_PROC_NULL;
    double maxdiff = 0.0;
    MPI_Barrier(MPI_COMM_WORLD);
    const double t = now();
    for (long it = 0; it < iters; it++) {
        /* Halos: my first row to the rank above, its last row into row 0. */
        MPI_Sendrecv(old + n, (int)n, MPI_DOUBLE, up, 0, old + (local - 1) * n, (int)n, MPI_DOUBLE,
                     down, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Sendrecv(old + (local - 2) * n, (int)n, MPI_DOUBLE, down, 1, old, (int)n, MPI_DOUBLE,
                     up, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        double m = 0.0;
        for (long i = 1; i < local - 1; i++) {
            const double *u = old + (i - 1) * n, *mid = old + i * n, *d = old + (i + 1) * n;
            double *out = new + i * n;
            for (long j = 1; j < n - 1; j++) {
                const double v = (u[j] + d[j] + mid[j - 1] + mid[j + 1]) * 0.25;
                out[j] = v;
                double diff = v - mid[j];
                if (diff < 0) diff = -diff;
                if (diff > m) m = diff;
            }
        }
        MPI_Allreduce(&m, &maxdiff, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double *tmp = old;
        old = new;
        new = tmp;
    }
    double secs = now() - t, slowest = 0.0;
    MPI_Reduce(&secs, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    /* The whole grid on rank 0 for the fingerprint (untimed). */
    int *counts = xmalloc(size * sizeof(int)), *displs = xmalloc(size * sizeof(int));
    for (int r = 0; r < size; r++) {
        const long rlo = 1 + r * per + (r < extra ? r : extra);
        const long rhi = rlo + per + (r < extra ? 1 : 0);
        counts[r] = (int)((rhi - rlo) * n);
        displs[r] = (int)(rlo * n);
    }
    double *grid = rank == 0 ? xmalloc(n * n * sizeof(double)) : NULL;
    if (rank == 0)
        for (long k = 0; k < n * n; k++) grid[k] = k < n ? 1.0 : 0.0;
    MPI_Gatherv(old + n, (int)((hi - lo) * n), MPI_DOUBLE, grid, counts, displs, MPI_DOUBLE, 0,
                MPI_COMM_WORLD);
    if (rank == 0) {
        printf("baselines jacobi mpi (%d ranks)\n", size);
        printf("time: %.6f\n", slowest);
        printf("check: maxdiff_bits=%016" PRIx64 " grid_bits=%016" PRIx64 "\n", bits(maxdiff),
               fnv_doubles(grid, n * n));
    }
    MPI_Finalize();
    return 0;
}
