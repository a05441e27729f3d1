/* Small-row matrix products for MLX on Linux with OpenBLAS (mlx_specstream/blas.py builds this
 * library with -DBLAS_LIBRARY="path of OpenBLAS" and preloads it, so that MLX's cblas_sgemm
 * resolves here; everything this file does not handle goes to that library's cblas_sgemm).
 *
 * A decode pass multiplies 1-32 rows (a token, the nodes of a draft tree, their streams) by each
 * weight matrix, and the weights do not fit in the cache: a pass streams them from memory. OpenBLAS
 * 0.3.21's sgemm packs and threads such products as if they were large (a 1 x 384 by 384 x 1024
 * product: ~90 us against ~28 us for sgemv), and one sgemv per row reads the weights once per row.
 * Row-major products of at most SPECSTREAM_GEMV_ROWS rows (default 32; 0 turns this off) run here
 * instead, on x86-64 CPUs with AVX2 and FMA:
 *   - C = A B^T with B stored N x K (MLX's Linear layers, attention scores): tiles of up to 4 rows
 *     of A by 2-8 rows of B share every load; the rows of B go through the cache in chunks that
 *     serve every group of 4 rows, so the weights are read from memory once per product; a
 *     product of at least HELPER_MIN weights splits its columns with one helper thread;
 *   - C = A B with B stored K x N (low-rank adapters' second factor, attention's values): tiles of
 *     up to 4 rows by 16 columns.
 * Other layouts, or a CPU without AVX2/FMA, take one sgemv per row; bigger products, OpenBLAS.
 *
 * Every output C[i, j] is computed by the same operations whatever the number of rows, the tile
 * it falls in or the thread (A B^T: fused multiply-adds into 8 lanes over k in order, the lanes
 * summed by one fixed tree, reduce8, then the k % 8 tail in order; A B: one fused multiply-add per
 * k in order). So a row of a speculative pass gets the bits it would get in a pass of one row,
 * which lossless decoding relies on (it compares their argmax).
 */
#include <dlfcn.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);

static sgemm_fn blas_sgemm;
static sgemv_fn blas_sgemv;
static int small_rows = -1, have_avx2, kernels = 1;

static void resolve(void) {
  void *blas = dlopen(BLAS_LIBRARY, RTLD_NOW | RTLD_GLOBAL);
  blas_sgemm = (sgemm_fn)dlsym(blas, "cblas_sgemm");
  blas_sgemv = (sgemv_fn)dlsym(blas, "cblas_sgemv");
#if defined(__x86_64__)
  __builtin_cpu_init();
  have_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  const char *rows = getenv("SPECSTREAM_GEMV_ROWS");
  small_rows = rows ? atoi(rows) : 32;
}

#if defined(__x86_64__)
/* ---- the tiles: C[r, j + q] for r < R, q < J (A and C already offset to the tile's rows) ---- */

#define AVX2 __attribute__((target("avx2,fma")))

/* out[t] = the sum of a[t]'s 8 lanes, for t < 8, by one fixed tree: ((0+1)+(2+3))+((4+5)+(6+7)) */
AVX2 static inline __m256 reduce8(const __m256 *a) {
  __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
  __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
  __m256 h0123 = _mm256_hadd_ps(h01, h23), h4567 = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20),
                       _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

/* C[i, j] from its reduced lanes s: the k % 8 tail in order, then alpha and beta */
static inline void store(float s, const float *a, const float *b, int k8, int K, float alpha, float beta,
                         float *c) {
  for (int k = k8; k < K; k++) s += a[k] * b[k];
  *c = beta == 0.0f ? alpha * s : alpha * s + beta * *c; /* beta 0 ignores C (it may hold NaN) */
}

#define TILE(R, J)                                                                                  \
  AVX2 static void tile_##R##x##J(int j0, int j1, int K, float alpha, const float *A, int lda,     \
                                  const float *B, int ldb, float beta, float *C, int ldc) {        \
    int k8 = K & ~7;                                                                                \
    for (int j = j0; j < j1; j += J) {                                                              \
      __m256 acc[8];                                                                                \
      for (int t = 0; t < 8; t++) acc[t] = _mm256_setzero_ps();                                     \
      const float *b = B + (long)j * ldb;                                                           \
      for (int k = 0; k < k8; k += 8) {                                                             \
        __m256 w[J];                                                                                \
        for (int q = 0; q < J; q++) {                                                               \
          _mm_prefetch((const char *)(b + (long)(q + J) * ldb + k), _MM_HINT_T0);                   \
          w[q] = _mm256_loadu_ps(b + (long)q * ldb + k);                                            \
        }                                                                                           \
        for (int r = 0; r < R; r++) {                                                               \
          __m256 x = _mm256_loadu_ps(A + (long)r * lda + k);                                        \
          for (int q = 0; q < J; q++) acc[r * J + q] = _mm256_fmadd_ps(x, w[q], acc[r * J + q]);    \
        }                                                                                           \
      }                                                                                             \
      float s[8];                                                                                   \
      _mm256_storeu_ps(s, reduce8(acc));                                                            \
      for (int r = 0; r < R; r++)                                                                   \
        for (int q = 0; q < J; q++)                                                                 \
          store(s[r * J + q], A + (long)r * lda, b + (long)q * ldb, k8, K, alpha, beta,            \
                C + (long)r * ldc + j + q);                                                         \
    }                                                                                               \
  }
TILE(1, 8) TILE(2, 4) TILE(3, 2) TILE(4, 2) TILE(1, 1) TILE(2, 1) TILE(3, 1) TILE(4, 1)

typedef void (*tile_fn)(int, int, int, float, const float *, int, const float *, int, float, float *, int);
static const tile_fn wide[5] = {0, tile_1x8, tile_2x4, tile_3x2, tile_4x2};
static const tile_fn narrow[5] = {0, tile_1x1, tile_2x1, tile_3x1, tile_4x1};
static const int wide_j[5] = {0, 8, 4, 2, 2};
enum { CHUNK_BYTES = 96 * 1024 }; /* weight rows per chunk: kept in L2 while every row group uses them */

/* C[:M, j0:j1] = alpha A B^T + beta C: column chunks, and in each chunk the rows in groups of 4 */
static void nt_columns(int M, int j0, int j1, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc) {
  int chunk = CHUNK_BYTES / (4 * (K > 0 ? K : 1));
  chunk = chunk < 8 ? 8 : chunk & ~7;
  for (int c0 = j0; c0 < j1; c0 += chunk) {
    int c1 = c0 + chunk < j1 ? c0 + chunk : j1;
    for (int i0 = 0; i0 < M; i0 += 4) {
      int r = M - i0 < 4 ? M - i0 : 4, cw = c0 + (c1 - c0) / wide_j[r] * wide_j[r];
      const float *a = A + (long)i0 * lda;
      float *c = C + (long)i0 * ldc;
      wide[r](c0, cw, K, alpha, a, lda, B, ldb, beta, c, ldc);
      if (cw < c1) narrow[r](cw, c1, K, alpha, a, lda, B, ldb, beta, c, ldc);
    }
  }
}

/* ---- C = A B with B stored K x N (low-rank adapters' second factor, attention's values) ---- */

/* C[r, j..j+16) for r < R: broadcast A[r, k] times B[k, j..j+16), fused over k in order */
#define TILE_NN(R)                                                                                  \
  AVX2 static void nn_##R(int j0, int j1, int K, float alpha, const float *A, int lda,             \
                          const float *B, int ldb, float beta, float *C, int ldc) {                \
    for (int j = j0; j < j1; j += 16) {                                                             \
      __m256 acc[R][2];                                                                             \
      for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();                      \
      for (int k = 0; k < K; k++) {                                                                 \
        __m256 b0 = _mm256_loadu_ps(B + (long)k * ldb + j), b1 = _mm256_loadu_ps(B + (long)k * ldb + j + 8); \
        for (int r = 0; r < R; r++) {                                                               \
          __m256 a = _mm256_broadcast_ss(A + (long)r * lda + k);                                    \
          acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);                                            \
          acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);                                            \
        }                                                                                           \
      }                                                                                             \
      for (int r = 0; r < R; r++) {                                                                 \
        float s[16];                                                                                \
        _mm256_storeu_ps(s, acc[r][0]);                                                             \
        _mm256_storeu_ps(s + 8, acc[r][1]);                                                         \
        float *c = C + (long)r * ldc + j;                                                           \
        for (int q = 0; q < 16; q++) c[q] = beta == 0.0f ? alpha * s[q] : alpha * s[q] + beta * c[q]; \
      }                                                                                             \
    }                                                                                               \
  }
TILE_NN(1) TILE_NN(2) TILE_NN(3) TILE_NN(4)
static const tile_fn nn_tiles[5] = {0, nn_1, nn_2, nn_3, nn_4};

/* the columns past the last 16: the same fused sums, one output at a time */
AVX2 static void nn_tail(int M, int j0, int N, int K, float alpha, const float *A, int lda, const float *B,
                         int ldb, float beta, float *C, int ldc) {
  for (int i = 0; i < M; i++)
    for (int j = j0; j < N; j++) {
      float s = 0.0f;
      for (int k = 0; k < K; k++) s = __builtin_fmaf(A[(long)i * lda + k], B[(long)k * ldb + j], s);
      float *c = C + (long)i * ldc + j;
      *c = beta == 0.0f ? alpha * s : alpha * s + beta * *c;
    }
}

static void nn_gemm(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                    float beta, float *C, int ldc) {
  int n16 = N & ~15;
  for (int i0 = 0; i0 < M; i0 += 4) {
    int r = M - i0 < 4 ? M - i0 : 4;
    nn_tiles[r](0, n16, K, alpha, A + (long)i0 * lda, lda, B, ldb, beta, C + (long)i0 * ldc, ldc);
  }
  if (n16 < N) nn_tail(M, n16, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- one helper thread takes the upper half of the columns of a big enough product ---- */

typedef struct {
  int M, j0, j1, K, lda, ldb, ldc;
  float alpha, beta;
  const float *A, *B;
  float *C;
} job_t;
static job_t job;
static atomic_int posted, finished; /* job numbers */
static pthread_mutex_t caller = PTHREAD_MUTEX_INITIALIZER;
static int helper_state; /* 0 not started, 1 running, -1 could not start */
enum {
  HELPER_MIN = 256 * 1024, /* weights: 384 x 1024 and up (MLP, LM head); smaller ones cost the handoff */
  SPIN = 1000,             /* pauses (some microseconds) before the helper sleeps between products */
};

static void *helper(void *first) {
  int seen = (int)(long)first; /* the last job posted before the thread was made */
  for (;;) {
    int n = 0, now;
    while ((now = atomic_load_explicit(&posted, memory_order_acquire)) == seen) {
      if (++n < SPIN) {
        _mm_pause();
        continue;
      }
      syscall(SYS_futex, &posted, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
      n = 0;
    }
    seen = now;
    nt_columns(job.M, job.j0, job.j1, job.K, job.alpha, job.A, job.lda, job.B, job.ldb, job.beta,
               job.C, job.ldc);
    atomic_store_explicit(&finished, now, memory_order_release);
  }
  return NULL;
}

static void forget_helper(void) { helper_state = 0; } /* a forked child has no helper thread */

static void nt_gemm(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                    float beta, float *C, int ldc) {
  int split = (N / 2) & ~7;
  if ((long)N * K < HELPER_MIN || split == 0 || pthread_mutex_trylock(&caller) != 0) {
    nt_columns(M, 0, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (helper_state == 0) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    helper_state = pthread_create(&thread, &attr, helper, (void *)(long)atomic_load(&posted)) == 0 ? 1 : -1;
    pthread_attr_destroy(&attr);
    pthread_atfork(NULL, NULL, forget_helper);
  }
  if (helper_state < 0) {
    pthread_mutex_unlock(&caller);
    nt_columns(M, 0, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  job = (job_t){M, split, N, K, lda, ldb, ldc, alpha, beta, A, B, C};
  int number = atomic_load(&posted) + 1;
  atomic_store_explicit(&posted, number, memory_order_release);
  syscall(SYS_futex, &posted, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
  nt_columns(M, 0, split, K, alpha, A, lda, B, ldb, beta, C, ldc);
  while (atomic_load_explicit(&finished, memory_order_acquire) != number) _mm_pause();
  pthread_mutex_unlock(&caller);
}

#endif

/* Whether the kernels above run (1, the default) or one sgemv per row (0): for A/B measurements
 * within one process (blas.use_small_kernels). Returns the previous setting. */
int specstream_small_gemm_kernels(int on) {
  int before = kernels;
  kernels = on;
  return before;
}

/* C (M x N) = alpha * op(A) (M x K) * op(B) (K x N) + beta * C */
void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  if (small_rows < 0) resolve();
  if (order != ROW_MAJOR || M > small_rows || K == 0 || !blas_sgemv) {
    blas_sgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#if defined(__x86_64__)
  if (have_avx2 && kernels && trans_a == NO_TRANS) {
    (trans_b == TRANS ? nt_gemm : nn_gemm)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#endif
  for (int i = 0; i < M; i++) {
    float *c = C + (long)i * ldc;
    if (beta == 0.0f) /* BLAS lets beta 0 ignore C (it may hold NaN); scaling by 0 would not */
      for (int j = 0; j < N; j++) c[j] = 0.0f;
    const float *a = trans_a == NO_TRANS ? A + (long)i * lda : A + i; /* row i of op(A) */
    int inc_a = trans_a == NO_TRANS ? 1 : lda;
    if (trans_b == NO_TRANS) /* B stored K x N: c = B^T a */
      blas_sgemv(ROW_MAJOR, TRANS, K, N, alpha, B, ldb, a, inc_a, beta, c, 1);
    else /* B stored N x K: c = B a */
      blas_sgemv(ROW_MAJOR, NO_TRANS, N, K, alpha, B, ldb, a, inc_a, beta, c, 1);
  }
}
