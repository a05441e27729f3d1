#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <dlfcn.h>
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int, float, float *, int);
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
  void *h = dlopen("/usr/lib/x86_64-linux-gnu/libopenblas.so.0", RTLD_NOW);
  sgemv_fn gemv = (sgemv_fn)dlsym(h, "cblas_sgemv");
  void *m = dlopen("./sg.so", RTLD_NOW | RTLD_LOCAL); sgemm_fn mine = (sgemm_fn)dlsym(m, "cblas_sgemm");
  /* one model: 8 layers of q,k,v,o,gate,up,down + head */
  int shapes[][2] = {{384, 384}, {128, 384}, {128, 384}, {384, 384}, {1024, 384}, {1024, 384}, {384, 1024}};
  int L = 8, P = 7 * 8 + 1;
  float **B = malloc(P * sizeof(float *)); int *Ns = malloc(P * 4), *Ks = malloc(P * 4);
  for (int p = 0; p < P; p++) {
    Ns[p] = p < 56 ? shapes[p % 7][0] : 4096; Ks[p] = p < 56 ? shapes[p % 7][1] : 384;
    B[p] = malloc((long)Ns[p] * Ks[p] * 4);
    for (long x = 0; x < (long)Ns[p] * Ks[p]; x++) B[p][x] = (rand() % 1000) / 1000.0f - 0.5f;
  }
  float *A = malloc(32 * 1024 * 4), *C = malloc(32 * 4096 * 4);
  for (int x = 0; x < 32 * 1024; x++) A[x] = (rand() % 1000) / 1000.0f - 0.5f;
  int Ms[] = {1, 2, 4, 8, 12, 16};
  for (int mi = 0; mi < 6; mi++) {
    int M = Ms[mi]; double b0 = 1e9, b1 = 1e9;
    for (int rep = 0; rep < 30; rep++) {
      double t = now();
      for (int p = 0; p < P; p++) for (int i = 0; i < M; i++) gemv(101, 111, Ns[p], Ks[p], 1.0f, B[p], Ks[p], A + i * Ks[p], 1, 0.0f, C + i * Ns[p], 1);
      double t1 = now();
      for (int p = 0; p < P; p++) mine(101, 111, 112, M, Ns[p], Ks[p], 1.0f, A, Ks[p], B[p], Ks[p], 0.0f, C, Ns[p]);
      double t2 = now();
      if (t1 - t < b0) b0 = t1 - t; if (t2 - t1 < b1) b1 = t2 - t1;
    }
    printf("M=%2d  sgemv per row %6.2f ms   small_gemm %6.2f ms\n", M, b0 * 1e3, b1 * 1e3);
  }
}
