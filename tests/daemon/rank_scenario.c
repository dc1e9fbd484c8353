/*
 * A trainer for end-to-end daemon tests, run by `zerod run --nproc N`:
 *   rank_scenario normal    train 20 steps, print each rank's checksum
 *   rank_scenario hang      rank 1 stops calling for 3 s before a step
 *   rank_scenario die       rank 1 kills itself (SIGKILL) at step 5
 *   rank_scenario diverge   rank 0 begins module m1, rank 1 module m2 (stage 3)
 *   rank_scenario diverge_destroy
 *                           diverge, but another model of the client is
 *                           destroyed between the (deferred) forward_end and
 *                           the next begin, which must still return the
 *                           end's error
 *   rank_scenario resume    5 steps; prints the step number the first one got
 *   rank_scenario set_lr    rank 0 sets lr 0.01, rank 1 0.02 (refused on both);
 *                           then both 0.005, and 3 steps: each rank prints
 *                           the refusal and the lr the steps used
 *   rank_scenario set_lr_one_rank_invalid
 *                           (stage 0-2) rank 0 sets lr NaN, rank 1 0.01; then
 *                           both 0.01, rank 0 inside module m1's forward:
 *                           each rank prints both refusals, then 3 steps and
 *                           the lr they used (the job's)
 *   rank_scenario wait      (stage 3) rank 1 never calls; rank 0 waits in a
 *                           gather, on the call ring, until a process dies
 *   rank_scenario sleepy    (stage 3) rank 1 begins 1 s late; rank 0 prints
 *                           the wall and CPU time its forward_begin took
 *   rank_scenario pairs N   N forward_begin/_end pairs of m1; prints the time
 *   rank_scenario timeout   rank 0 connects with timeout_ms = 1000, rank 1
 *                           finalizes 3 s late: rank 0's finalize times out
 *                           while the daemon still runs it; 3 s later rank 0
 *                           calls forward_begin and zd_model_memory and
 *                           prints what each returned and how long it took
 *   rank_scenario finalize_alone
 *                           rank 1 registers and idles; rank 0 finalizes,
 *                           waiting for rank 1, and prints what it got
 *   rank_scenario reconnect rank 1 as in finalize_alone; rank 0, with
 *                           timeout_ms = 1000, gives up on its finalize,
 *                           disconnects and connects again, and prints how
 *                           long that took and what it returned
 *   rank_scenario leave_early [S]
 *                           rank 1 connects and, 2 s later, disconnects and
 *                           exits before its zd_model_create; rank 0 waits
 *                           S seconds (default 0), then creates, registers
 *                           and finalizes, and prints what it got
 * At the end each rank prints its checksum (the sum of every parameter, to
 * compare across stages within a tolerance) and "rank R: parameters H1 H2
 * H3", the FNV-1a hash of each parameter's fp32 bytes, to compare ranks bit
 * for bit. With ZEROD_SCENARIO_DUMP=DIR it also writes them, fp32, to
 * DIR/rank<R>.f32 (w1, w2, w3 back to back). On a zerod error it prints "rank R: STATUS: message" and exits 1.
 */
#include <zerod/zerod.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int rank = 0;

#define CHECK(call)                                                                      \
  do {                                                                                   \
    zd_status st_ = (call);                                                              \
    if (st_ != ZD_OK) {                                                                  \
      printf("rank %d: %s: %s\n", rank, zd_status_str(st_), zd_last_error());            \
      fflush(stdout);                                                                    \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

/* FNV-1a, 64-bit: equal hashes mean equal bytes, for every practical purpose. */
static unsigned long long fnv1a(const void* data, size_t n) {
  const unsigned char* b = (const unsigned char*)data;
  unsigned long long h = 14695981039346656037ULL;
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ULL;
  }
  return h;
}

static double seconds_since(const struct timespec* t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

/* Prints what a call returned, without exiting: "rank R: CALL: STATUS in S s: message". */
static void report(const char* call, zd_status st, const struct timespec* t0) {
  printf("rank %d: %s: %s in %.3f s: %s\n", rank, call, zd_status_str(st), seconds_since(t0),
         st == ZD_OK ? "" : zd_last_error());
  fflush(stdout);
}

int main(int argc, char** argv) {
  const char* scenario = argc > 1 ? argv[1] : "normal";
  zd_client* c = NULL;
  zd_connect_options co = ZD_CONNECT_OPTIONS_INIT;
  const char* env_rank = getenv("ZEROD_RANK");
  if ((!strcmp(scenario, "timeout") || !strcmp(scenario, "reconnect")) && env_rank && !strcmp(env_rank, "0"))
    co.timeout_ms = 1000;
  CHECK(zd_connect(NULL, &co, &c));
  zd_client_info info = ZD_CLIENT_INFO_INIT;
  CHECK(zd_client_get_info(c, &info));
  rank = info.rank;
  if (!strcmp(scenario, "leave_early")) {
    /* Rank 1 goes before its first create, once rank 0 is surely connected;
       rank 0's model, made before or after that, must not wait for it. */
    if (rank == 1) {
      printf("rank 1: leaves before its create\n");
      fflush(stdout);
      sleep(2);
      zd_disconnect(c);
      return 0;
    }
    sleep((unsigned)(argc > 2 ? atoi(argv[2]) : 0));
  }
  zd_model_options o = ZD_MODEL_OPTIONS_INIT; /* the job from ZEROD_JOB */
  zd_model* m = NULL;
  CHECK(zd_model_create(c, &o, &m));

  /* Three modules of one parameter each, 1000 elements, from rank 0's init. */
  enum { N = 1000 };
  static float init[N];
  for (int i = 0; i < N; ++i) init[i] = (float)((i % 17) - 8) / 8.0f;
  const char* names[3] = {"m1", "m2", "m3"};
  zd_param_id p[3];
  for (int k = 0; k < 3; ++k) {
    char pname[16];
    snprintf(pname, sizeof pname, "w%d", k + 1);
    int64_t shape[1] = {N};
    zd_param_desc d = ZD_PARAM_DESC_INIT;
    d.name = pname;
    d.module = names[k];
    d.ndim = 1;
    d.shape = shape;
    d.init = init;
    d.init_dtype = ZD_DTYPE_F32;
    CHECK(zd_model_register_param(m, &d, &p[k]));
  }
  if (!strcmp(scenario, "finalize_alone") || !strcmp(scenario, "reconnect") || !strcmp(scenario, "leave_early")) {
    struct timespec t0;
    if (rank == 1) {
      printf("rank 1: idle\n");
      fflush(stdout);
      sleep(120);
      return 0;
    }
    printf("rank 0: finalizing\n");
    fflush(stdout);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    report("zd_model_finalize", zd_model_finalize(m), &t0);
    if (!strcmp(scenario, "reconnect")) {
      /* As the timeout's message says: destroy, disconnect, connect again. */
      zd_model_destroy(m);
      zd_disconnect(c);
      c = NULL;
      co.timeout_ms = 0;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      report("zd_connect", zd_connect(NULL, &co, &c), &t0);
    }
    return 0;
  }
  if (!strcmp(scenario, "timeout")) {
    /* Rank 0 gives up on its finalize after 1 s; the daemon runs it on and
       answers it once rank 1 arrives, 3 s in. Rank 0's next calls come
       after that answer: each must fail, saying the connection is out of
       step, and none may take the late answer for its own. */
    struct timespec t0;
    if (rank == 1) {
      sleep(3);
      clock_gettime(CLOCK_MONOTONIC, &t0);
      report("zd_model_finalize", zd_model_finalize(m), &t0);
    } else {
      clock_gettime(CLOCK_MONOTONIC, &t0);
      report("zd_model_finalize", zd_model_finalize(m), &t0);
      sleep(3);
      clock_gettime(CLOCK_MONOTONIC, &t0);
      report("zd_forward_begin", zd_forward_begin(m, 0), &t0);
      zd_memory_figures mem = ZD_MEMORY_FIGURES_INIT;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      report("zd_model_memory", zd_model_memory(m, -1, ZD_TIER_DEVICE, ZD_MEM_ALL, &mem), &t0);
    }
    zd_model_destroy(m);
    zd_disconnect(c);
    return 0;
  }
  CHECK(zd_model_finalize(m));

  if (!strcmp(scenario, "wait")) {
    if (rank == 1) {
      printf("rank 1: idle\n");
      fflush(stdout);
      sleep(120);
      return 0;
    }
    printf("rank 0: waiting\n");
    fflush(stdout);
    /* The begin copies rank 1's shard without waiting for it; the end waits
       for rank 1 to arrive at the same gather, in the daemon, when the next
       begin carries it there (the client defers zd_forward_end). */
    CHECK(zd_forward_begin(m, 0));
    CHECK(zd_forward_end(m, 0));
    CHECK(zd_forward_begin(m, 1));
    printf("rank 0: no failure seen\n");
    return 0;
  }
  if (!strcmp(scenario, "sleepy") || !strcmp(scenario, "pairs")) {
    const int pairs = !strcmp(scenario, "pairs") ? (argc > 2 ? atoi(argv[2]) : 5000) : 1;
    if (pairs == 1 && rank == 1) sleep(1);
    if (pairs == 1 && rank == 0) {
      printf("rank 0: begins\n");
      fflush(stdout);
    }
    struct timespec w0, c0, w1, c1;
    clock_gettime(CLOCK_MONOTONIC, &w0);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    /* With one pair, rank 0 waits for rank 1 in its end (the begin's
       gather is compared with rank 1's there), which the daemon runs with
       the rank's next call: the memory query below, timed too. */
    for (int i = 0; i < pairs; ++i) {
      CHECK(zd_forward_begin(m, 0));
      CHECK(zd_forward_end(m, 0));
    }
    zd_memory_figures mem = ZD_MEMORY_FIGURES_INIT;
    CHECK(zd_model_memory(m, -1, ZD_TIER_DEVICE, ZD_MEM_ALL, &mem));
    clock_gettime(CLOCK_MONOTONIC, &w1);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    const double wall = (double)(w1.tv_sec - w0.tv_sec) * 1e3 + (double)(w1.tv_nsec - w0.tv_nsec) / 1e6;
    const double cpu = (double)(c1.tv_sec - c0.tv_sec) * 1e3 + (double)(c1.tv_nsec - c0.tv_nsec) / 1e6;
    printf("rank %d: %d pairs, wall %.1f ms, cpu %.1f ms\n", rank, pairs, wall, cpu);
    zd_model_destroy(m);
    zd_disconnect(c);
    return 0;
  }
  if (!strcmp(scenario, "diverge_destroy")) {
    /* A second model on the same client, destroyed while the first one's
       zd_forward_end is deferred: that end's error (the ranks disagree)
       is the first model's next call's, not lost in the destroy. */
    zd_model* other = NULL;
    CHECK(zd_model_create(c, &o, &other));
    CHECK(zd_forward_begin(m, rank == 0 ? 0 : 1));
    CHECK(zd_forward_end(m, rank == 0 ? 0 : 1));
    zd_model_destroy(other);
    CHECK(zd_forward_begin(m, 2));
    printf("rank %d: no divergence detected\n", rank);
    return 0;
  }
  if (!strcmp(scenario, "diverge")) {
    /* The rank that gathers first is told at its next call: the end, which
       the client sends with the begin after it. */
    CHECK(zd_forward_begin(m, rank == 0 ? 0 : 1));
    CHECK(zd_forward_end(m, rank == 0 ? 0 : 1));
    CHECK(zd_forward_begin(m, 2));
    printf("rank %d: no divergence detected\n", rank);
    return 0;
  }
  const int resume = !strcmp(scenario, "resume");
  const int set_lr = !strcmp(scenario, "set_lr") || !strcmp(scenario, "set_lr_one_rank_invalid");
  char refused[1024] = "";
  if (!strcmp(scenario, "set_lr")) {
    /* zd_model_set_lr is a collective: values that differ are refused on
       every rank, naming them, and the lr in force stays. */
    const zd_status st = zd_model_set_lr(m, rank == 0 ? 0.01 : 0.02);
    if (st == ZD_OK) {
      printf("rank %d: set_lr took values that differ between the ranks\n", rank);
      return 1;
    }
    snprintf(refused, sizeof refused, "%s: %s", zd_status_str(st), zd_last_error());
    CHECK(zd_model_set_lr(m, 0.005));
  }
  if (!strcmp(scenario, "set_lr_one_rank_invalid")) {
    /* What one rank refuses every rank refuses: none is left waiting in the
       comparison, and the next calls meet on every rank. Module m1's forward
       gathers nothing below stage 3, so rank 0 can be inside it alone. */
    const zd_status invalid = zd_model_set_lr(m, rank == 0 ? NAN : 0.01);
    char first[512];
    snprintf(first, sizeof first, "%s: %s", zd_status_str(invalid), zd_last_error());
    if (rank == 0) CHECK(zd_forward_begin(m, 0));
    const zd_status in_module = zd_model_set_lr(m, 0.01);
    if (rank == 0) CHECK(zd_forward_end(m, 0));
    snprintf(refused, sizeof refused, "[%s] [%s: %s]", first, zd_status_str(in_module), zd_last_error());
    if (invalid == ZD_OK || in_module == ZD_OK) {
      printf("rank %d: set_lr took what another rank refused %s\n", rank, refused);
      return 1;
    }
  }
  double lr = 0;
  for (int step = 0; step < (resume ? 5 : set_lr ? 3 : 20); ++step) {
    for (int k = 0; k < 3; ++k) {
      CHECK(zd_forward_begin(m, k));
      CHECK(zd_forward_end(m, k));
    }
    for (int k = 2; k >= 0; --k) {
      CHECK(zd_backward_begin(m, k));
      zd_view w = ZD_VIEW_INIT, g = ZD_VIEW_INIT;
      CHECK(zd_param_view(m, p[k], &w));
      CHECK(zd_grad_view(m, p[k], &g));
      /* d/dw of sum((w - target)^2) / 2 with a per-rank target. */
      for (int i = 0; i < N; ++i)
        ((float*)g.data)[i] = ((const float*)w.data)[i] - (float)(rank + k) * 0.1f;
      CHECK(zd_backward_end(m, k));
    }
    if (!strcmp(scenario, "hang") && rank == 1 && step == 3) sleep(3);
    if (!strcmp(scenario, "die") && rank == 1 && step == 5) raise(SIGKILL);
    zd_step_result r = ZD_STEP_RESULT_INIT;
    CHECK(zd_step(m, &r));
    if (resume && step == 0) printf("rank %d: resumed at step %lld\n", rank, (long long)r.step);
    if (step > 0 && r.lr != lr) lr = -1; /* not one lr for every step */
    else lr = r.lr;
  }
  if (set_lr) printf("rank %d: set_lr refused: %s; 3 steps at lr %g\n", rank, refused, lr);
  double sum = 0;
  unsigned long long hash[3];
  static float all[3][N];
  for (int k = 0; k < 3; ++k) {
    float* v = all[k];
    CHECK(zd_param_read(m, p[k], ZD_DTYPE_F32, v, sizeof all[k]));
    for (int i = 0; i < N; ++i) sum += v[i];
    hash[k] = fnv1a(v, sizeof all[k]);
  }
  const char* dump = getenv("ZEROD_SCENARIO_DUMP");
  if (dump && *dump) {
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.f32", dump, rank);
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(all, sizeof all, 1, f) != 1 || fclose(f) != 0) {
      printf("rank %d: cannot write %s\n", rank, path);
      return 1;
    }
  }
  printf("rank %d: checksum %.6f\n", rank, sum);
  printf("rank %d: parameters %016llx %016llx %016llx\n", rank, hash[0], hash[1], hash[2]);
  zd_model_destroy(m);
  zd_disconnect(c);
  return 0;
}
