/* LU with partial pivoting (examples/lu.rs's matrix, seed 1, and its
 * arithmetic: l = a(i,k) / a(k,k) stored in place, row i -= l x row k) as
 * an MPI user writes it for rows dealt cyclically over the ranks: each
 * step finds the pivot with MPI_Allreduce(MPI_MAXLOC) over the ranks'
 * candidates (the largest |a(i,k)| of their rows not yet chosen, computed
 * as the previous step updated them), the rank holding the pivot row
 * broadcasts its tail (MPI_Bcast), and every rank updates its own rows.
 * Rows stay where they are (the permutation is recorded, as examples/lu.rs
 * does); the factor is gathered on rank 0 afterwards, in pivot order, for
 * the same check line as the other LU baselines.
 *   mpirun -n R lu_mpi [n=1024] [seed=1]
 * The time printed is the slowest rank's, from a barrier before the first
 * step to the end of the last. */
#include <mpi.h>

#include "common.h"

/* MPI_DOUBLE_INT, for MPI_MAXLOC: ties go to the lower row, as
 * examples/lu.rs's `better` does. (The sequential baselines swap rows, so
 * on an exact tie they take the lower *position*, and in the singular case
 * they leave the rows never chosen in another order: the check line is the
 * same as theirs for inputs with neither, as the examples' inputs are.) */
struct cand {
    double mag;
    int row;
};

/* Offers row `row` (global index) with entry `x` in the pivot column. */
static inline void offer(struct cand *c, double x, long row) {
    const double d = x < 0 ? -x : x;
    if (d > c->mag) *c = (struct cand){d, (int)row};
}

/* How many of the n rows rank r of `size` holds (rows r, r + size, ...). */
static inline long rows_of(long n, int size, int r) { return n / size + (r < n % size ? 1 : 0); }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const long n = arg_or(argc, argv, 1, 1024);
    const uint64_t seed = (uint64_t)arg_or(argc, argv, 2, 1);
    if (n < 1 || n > 46340) { /* n * n doubles counted in an int (MPI) */
        if (rank == 0) fprintf(stderr, "usage: lu_mpi [1 <= n <= 46340] [seed]\n");
        MPI_Finalize();
        return 2;
    }
    /* Every rank makes the whole input and keeps its rows i = rank + r*size. */
    double *all = random_matrix(n, seed);
    const long mine = rows_of(n, size, rank);
    double *a = xmalloc((mine > 0 ? mine : 1) * n * sizeof(double));
    for (long r = 0; r < mine; r++) memcpy(a + r * n, all + (rank + r * size) * n, n * sizeof(double));
    free(all);
    char *done = xmalloc(mine > 0 ? mine : 1);
    memset(done, 0, mine > 0 ? mine : 1);
    long *perm = xmalloc(n * sizeof(long));
    double *piv = xmalloc(n * sizeof(double));
    long singular_at = -1;

    /* Step 0's candidate from the input. */
    struct cand local = {-1.0, (int)n}, best;
    for (long r = 0; r < mine; r++) offer(&local, a[r * n], rank + r * size);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t = now();
    for (long k = 0; k < n; k++) {
        MPI_Allreduce(&local, &best, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
        if (best.mag == 0.0) {
            singular_at = k;
            break;
        }
        const long p = best.row, owner = p % size;
        perm[k] = p;
        if (owner == rank) {
            const long r = p / size;
            done[r] = 1;
            memcpy(piv + k, a + r * n + k, (n - k) * sizeof(double));
        }
        MPI_Bcast(piv + k, (int)(n - k), MPI_DOUBLE, (int)owner, MPI_COMM_WORLD);
        /* Eliminate in my free rows; each offers its candidate for k + 1. */
        local = (struct cand){-1.0, (int)n};
        for (long r = 0; r < mine; r++) {
            if (done[r]) continue;
            double *row = a + r * n;
            const double l = row[k] / piv[k];
            row[k] = l;
            for (long j = k + 1; j < n; j++) row[j] -= l * piv[j];
            if (k + 1 < n) offer(&local, row[k + 1], rank + r * size);
        }
    }
    double secs = now() - t, slowest = 0.0;
    MPI_Reduce(&secs, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    /* The factor on rank 0, rows in pivot order (untimed): every rank's
     * block in one MPI_Gatherv (rank r's rows are r, r + size, ...), then
     * each row put at its pivot position. */
    const long steps = singular_at < 0 ? n : singular_at;
    int *counts = xmalloc(size * sizeof(int)), *displs = xmalloc(size * sizeof(int));
    for (int r = 0, off = 0; r < size; r++) {
        counts[r] = (int)(rows_of(n, size, r) * n);
        displs[r] = off;
        off += counts[r];
    }
    double *blocks = rank == 0 ? xmalloc(n * n * sizeof(double)) : NULL;
    MPI_Gatherv(a, (int)(mine * n), MPI_DOUBLE, blocks, counts, displs, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        char *chosen = xmalloc(n);
        memset(chosen, 0, n);
        for (long k = 0; k < steps; k++) chosen[perm[k]] = 1;
        long next = steps;
        for (long i = 0; i < n && singular_at >= 0; i++)
            if (!chosen[i]) perm[next++] = i;
        double *lu = xmalloc(n * n * sizeof(double));
        for (long k = 0; k < n; k++) {
            const long i = perm[k], owner = i % size;
            memcpy(lu + k * n, blocks + displs[owner] + (i / size) * n, n * sizeof(double));
        }
        printf("baselines lu mpi (%d ranks)\n", size);
        printf("time: %.6f\n", slowest);
        print_lu_check(lu, perm, n, singular_at);
        free(lu);
        free(chosen);
        free(blocks);
    }
    free(counts);
    free(displs);
    free(a);
    free(done);
    free(perm);
    free(piv);
    MPI_Finalize();
    return 0;
}
