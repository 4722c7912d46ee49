/* A raw MPI ping-pong: a 16-byte request, a reply of S bytes sent whole or
 * in pieces of P bytes (MPI_Isend each, then MPI_Waitall), 20 000 round
 * trips per size. It found the eager limit of Open MPI's shared-memory
 * path that the MPI transport's pieces stay under (hyfi_net::mpi::PIECE;
 * BENCHMARKS.md, the transports section).
 *
 *   mpicc -O2 -o pingpong_pieces benches/baselines/pingpong_pieces.c
 *   mpirun -np 2 ./pingpong_pieces
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define N 20000

/* Mean round trip in µs, reply of `s` bytes in pieces of `p` (0: whole). */
static double run(int rank, int s, int p) {
    static char req[16];
    char *rep = calloc(s, 1);
    MPI_Request r[64];
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < N; i++) {
        if (rank == 0) {
            MPI_Send(req, 16, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            if (p == 0)
                MPI_Recv(rep, s, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            else
                for (int o = 0; o < s; o += p)
                    MPI_Recv(rep + o, s - o < p ? s - o : p, MPI_BYTE, 1, 1, MPI_COMM_WORLD,
                             MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(req, 16, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (p == 0) {
                MPI_Send(rep, s, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
            } else {
                int k = 0;
                for (int o = 0; o < s; o += p)
                    MPI_Isend(rep + o, s - o < p ? s - o : p, MPI_BYTE, 0, 1, MPI_COMM_WORLD,
                              &r[k++]);
                MPI_Waitall(k, r, MPI_STATUSES_IGNORE);
            }
        }
    }
    double t = (MPI_Wtime() - t0) / N * 1e6;
    free(rep);
    return t;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0)
            fprintf(stderr, "pingpong_pieces: run it on 2 ranks (mpirun -np 2)\n");
        MPI_Finalize();
        return 2;
    }
    const int sizes[] = {4000, 4040, 4050, 4096, 4109, 8192, 16384, 32768, 65536};
    const int pieces[] = {0, 2048, 3968, 4000};
    if (rank == 0)
        printf("reply_bytes whole_us pieces_2048_us pieces_3968_us pieces_4000_us\n");
    for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        double t[4];
        for (unsigned j = 0; j < 4; j++)
            t[j] = run(rank, sizes[i], pieces[j]);
        if (rank == 0)
            printf("%d %.2f %.2f %.2f %.2f\n", sizes[i], t[0], t[1], t[2], t[3]);
    }
    MPI_Finalize();
    return 0;
}
