// Where a rank trains (train/device.h): train_device_pick's rules on made-up nodes (no GPU is needed),
// and train_device_open's choice in this build.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/device.h"
#include "train/dist.h"

// The pick for ask, expected to succeed: the device index (-1 = the CPU); *why the CPU's reason.
static int pick_ok(DeviceAsk a, const char **why) {
    int index = -2;
    const char *w = NULL;
    cr_assert_eq(train_device_pick(&a, &index, &w), ER_OK, "%s", er_last_error());
    if (why)
        *why = w;
    return index;
}

// The pick for ask, expected to fail with a message holding `text`.
static void pick_fails(DeviceAsk a, const char *text) {
    int index = -2;
    const char *w = NULL;
    cr_expect_lt(train_device_pick(&a, &index, &w), 0, "request %s: no error", a.request ? a.request : "(none)");
    cr_expect(strstr(er_last_error(), text), "request %s: '%s' lacks '%s'", a.request ? a.request : "(none)",
              er_last_error(), text);
}

// Rank r of a node takes cuda:r; with more ranks than GPUs the run is refused unless shared.
Test(device_pick, local_ranks_map_to_their_own_gpu) {
    for (int r = 0; r < 8; r++)
        cr_expect_eq(pick_ok((DeviceAsk){.cuda_built = 1, .n_gpus = 8, .local_rank = r, .local_size = 8}, NULL), r);
    for (int r = 0; r < 4; r++) // --device cuda means the same
        cr_expect_eq(pick_ok((DeviceAsk){.request = "cuda", .cuda_built = 1, .n_gpus = 8, .local_rank = r,
                                         .local_size = 4}, NULL), r);
    pick_fails((DeviceAsk){.cuda_built = 1, .n_gpus = 2, .local_rank = 3, .local_size = 4},
               "4 ranks on this node but 2 CUDA devices");
    pick_fails((DeviceAsk){.cuda_built = 1, .n_gpus = 1, .local_rank = 0, .local_size = 2}, "ER_SHARE_GPU=1");
    for (int r = 0; r < 5; r++)
        cr_expect_eq(pick_ok((DeviceAsk){.cuda_built = 1, .n_gpus = 2, .local_rank = r, .local_size = 5, .share = 1},
                             NULL), r % 2);
}

// cuda:N is taken as it is by one rank; all the ranks of a node on it only when shared.
Test(device_pick, explicit_device) {
    cr_expect_eq(pick_ok((DeviceAsk){.request = "cuda:3", .cuda_built = 1, .n_gpus = 4, .local_size = 1}, NULL), 3);
    pick_fails((DeviceAsk){.request = "cuda:4", .cuda_built = 1, .n_gpus = 4, .local_size = 1},
               "--device cuda:4: this node has 4 CUDA devices (cuda:0..cuda:3)");
    pick_fails((DeviceAsk){.request = "cuda:0", .cuda_built = 1, .n_gpus = 8, .local_rank = 1, .local_size = 8},
               "--device cuda:0 puts all 8 ranks of this node on one GPU");
    cr_expect_eq(pick_ok((DeviceAsk){.request = "cuda:1", .cuda_built = 1, .n_gpus = 8, .local_rank = 5,
                                     .local_size = 8, .share = 1}, NULL), 1);
    pick_fails((DeviceAsk){.request = "cuda:x", .cuda_built = 1, .n_gpus = 1, .local_size = 1},
               "--device 'cuda:x': expected cpu, cuda or cuda:N");
    pick_fails((DeviceAsk){.request = "tpu", .cuda_built = 1, .n_gpus = 1, .local_size = 1}, "expected cpu");
    const char *why = "x";
    cr_expect_eq(pick_ok((DeviceAsk){.request = "cpu", .cuda_built = 1, .n_gpus = 8, .local_size = 8}, &why), -1);
    cr_expect_null(why);
}

// No --device: the CPU quietly where there is no GPU at all, with a reason where the build or the job
// rules the GPU out, and an error where a driver answers but fails; --device cuda refuses all three.
Test(device_pick, the_cpu_quietly_with_a_reason_or_an_error) {
    const char *why = "x";
    cr_expect_eq(pick_ok((DeviceAsk){.cuda_built = 1, .n_gpus = 0, .local_size = 1}, &why), -1);
    cr_expect_null(why, "no GPU at all: quietly");
    pick_fails((DeviceAsk){.request = "cuda", .cuda_built = 1, .n_gpus = 0, .local_size = 1},
               "--device cuda: this machine has no CUDA device");
    cr_expect_eq(pick_ok((DeviceAsk){.cuda_built = 0, .local_size = 1}, &why), -1);
    cr_expect_str_eq(why, "this build has no CUDA backend (make CUDA=1 adds it)");
    pick_fails((DeviceAsk){.request = "cuda:0", .cuda_built = 0, .local_size = 1},
               "--device cuda:0: this build has no CUDA backend (build with make CUDA=1)");
    cr_expect_eq(pick_ok((DeviceAsk){.cuda_built = 1, .n_gpus = 2, .local_size = 1, .host_only = "QAT"}, &why), -1);
    cr_expect_str_eq(why, "QAT");
    const char *broken = "cuda: cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version";
    pick_fails((DeviceAsk){.cuda_built = 1, .n_gpus = 0, .count_error = broken, .local_size = 1},
               "the default device (the GPU): cuda: cudaGetDeviceCount: CUDA driver version is insufficient");
    pick_fails((DeviceAsk){.request = "cuda", .cuda_built = 1, .n_gpus = 0, .count_error = broken, .local_size = 1},
               "--device cuda: cuda: cudaGetDeviceCount");
}

// This build's choice without --device, through train_device_open (one rank, nothing placed).
Test(device_pick, this_build_without_a_device_flag) {
    TrainJob job;
    memset(&job, 0, sizeof job);
    job.label = "test";
    TrainDevice d;
    cr_assert_eq(train_device_open(&d, &job, NULL, 0), ER_OK, "%s", er_last_error());
    cr_expect_eq(dist_local_size(), 1);
#ifndef ER_CUDA
    cr_expect_str_eq(d.where, "cpu");
    cr_expect_str_eq(d.why_cpu, "this build has no CUDA backend (make CUDA=1 adds it)");
#endif
    train_device_close(&d);
    cr_expect_lt(train_device_open(&d, &job, "cuda:bad", 0), 0);
    cr_expect(strstr(er_last_error(), "--device 'cuda:bad'"), "%s", er_last_error());
    setenv("ER_SHARE_GPU", "yes", 1);
    cr_expect_eq(train_device_open(&d, &job, NULL, 0), ER_EINVAL);
    cr_expect_str_eq(er_last_error(), "ER_SHARE_GPU='yes': expected 0 or 1");
    unsetenv("ER_SHARE_GPU");
    cr_assert_eq(train_device_open(&d, &job, "cpu", 0), ER_OK, "%s", er_last_error());
    cr_expect_str_eq(d.where, "cpu");
    cr_expect_null(d.why_cpu);
    train_device_close(&d);
}
