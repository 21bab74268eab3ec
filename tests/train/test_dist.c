// train/dist.h without mpirun: the block split every data-parallel loop uses, and one rank's calls
// (the MPI runs themselves: tests/train/test_mpi.py, make MPI=1 test-mpi).
#include <criterion/criterion.h>
#include <string.h>

#include "core/alloc.h"
#include "train/dist.h"

// The ranks' blocks tile [0, n) in rank order, their sizes differing by at most one.
Test(dist, shares_tile_the_items_in_order) {
    for (int size = 1; size <= 9; size++)
        for (int n = 0; n <= 40; n++) {
            int next = 0, least = n, most = 0;
            for (int r = 0; r < size; r++) {
                int lo, hi;
                dist_share(n, r, size, &lo, &hi);
                cr_assert_eq(lo, next, "n %d size %d rank %d starts at %d", n, size, r, lo);
                cr_assert(hi >= lo);
                least = hi - lo < least ? hi - lo : least;
                most = hi - lo > most ? hi - lo : most;
                next = hi;
            }
            cr_assert_eq(next, n);
            cr_assert(most - least <= 1, "n %d size %d: blocks of %d to %d", n, size, least, most);
        }
}

// Without mpirun (or without MPI=1) there is one rank and every collective leaves its data as it is.
Test(dist, one_rank_calls_leave_the_data) {
    cr_assert_eq(dist_rank(), 0);
    cr_assert_eq(dist_size(), 1);
    float g[3] = {1.5f, -2.0f, 3.25f};
    double s[2] = {4.0, 5.0};
    cr_assert_eq(dist_sum_floats(g, 3), 0);
    cr_assert_eq(dist_sum_doubles(s, 2), 0);
    cr_assert(g[0] == 1.5f && g[1] == -2.0f && g[2] == 3.25f && s[0] == 4.0 && s[1] == 5.0);
    cr_assert_eq(dist_check_same(g, sizeof g, "test data"), 0);
    void *all;
    size_t n;
    cr_assert_eq(dist_gather(g, 3, sizeof(float), &all, &n), 0);
    cr_assert_eq(n, 3);
    cr_assert(memcmp(all, g, sizeof g) == 0);
    er_free(all);
}
