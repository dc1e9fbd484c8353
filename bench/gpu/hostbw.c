/* The host's memory bandwidth, STREAM's way (run.sh hostbw): copy (c = a)
 * and triad (a = b + 3c) over three arrays of GIB GiB each, far larger than
 * any cache, on OMP_NUM_THREADS threads; the best of 10 passes, bytes
 * counted as STREAM counts them (read and written once each, no
 * write-allocate traffic). The CPU optimizer streams its state the same
 * way, so its GB/s can be put beside these.
 *
 *   gcc -O3 -fopenmp -march=native hostbw.c -o hostbw && OMP_NUM_THREADS=16 ./hostbw [GIB]
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  size_t gib = argc > 1 ? strtoul(argv[1], NULL, 10) : 2;
  size_t n = gib << 27; /* doubles in GIB GiB */
  double *a = aligned_alloc(64, n * sizeof(double));
  double *b = aligned_alloc(64, n * sizeof(double));
  double *c = aligned_alloc(64, n * sizeof(double));
  if (!a || !b || !c) {
    fprintf(stderr, "hostbw: cannot allocate 3 x %zu GiB\n", gib);
    return 1;
  }
  /* Touched first by the threads that stream them: each page lands on
   * the NUMA node of the thread that uses it, as the passes below will. */
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    a[i] = 1.0;
    b[i] = 2.0;
    c[i] = 0.0;
  }
  double copy = 1e30, triad = 1e30;
  for (int pass = 0; pass < 10; pass++) {
    double t = omp_get_wtime();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) c[i] = a[i];
    t = omp_get_wtime() - t;
    copy = t < copy ? t : copy;
    t = omp_get_wtime();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = b[i] + 3.0 * c[i];
    t = omp_get_wtime() - t;
    triad = t < triad ? t : triad;
  }
  /* Read back, so that no pass can be optimised away. */
  double check = a[n / 2] + c[n / 3];
  printf("%d threads, 3 arrays of %zu GiB: copy %.1f GB/s, triad %.1f GB/s (check %g)\n", omp_get_max_threads(),
         gib, 2.0 * n * sizeof(double) / copy / 1e9, 3.0 * n * sizeof(double) / triad / 1e9, check);
  free(a);
  free(b);
  free(c);
  return 0;
}
