/* Small-row matrix products for MLX on Linux with OpenBLAS (mlx_specstream/blas.py builds this
 * library with -DBLAS_LIBRARY="path of OpenBLAS" and preloads it, so that MLX's cblas_sgemm
 * resolves here; larger products are OpenBLAS's, looked up in that library).
 *
 * A decode pass multiplies 1-16 rows (a token, or a draft tree's nodes) by each weight matrix.
 * OpenBLAS 0.3.21's sgemm packs and threads such products as if they were large (a 1 x 384 by
 * 384 x 1024 product: ~90 us against ~28 us for sgemv), and one sgemv per row reads the whole
 * weight matrix once per row, so a 4-row pass cost about twice a 1-row one. Here the rows share
 * each read of the weights: tiles of up to 4 rows by 4 weight rows (B stored N x K, as a Linear
 * layer's weight), or by 16-32 columns (B stored K x N), kept in registers while they stream
 * through, with the columns split across threads. Row-major products of at most
 * SPECSTREAM_GEMV_ROWS rows (default 16; 0 turns this off) come here (A stored transposed is
 * gathered into rows first); everything else goes to OpenBLAS's sgemm unchanged.
 *
 * Every element is summed the same way whatever the number of rows, the tile it falls in or the
 * thread that computes it (the same sequence of multiply-adds in k, then a fixed tree over the
 * vector's lanes), so a row of a tree pass equals the same row computed alone: lossless decoding
 * stays equal to plain decoding bit for bit, up to the row bound.
 *
 * Worked example (B stored N x K): M = 3 rows, N = 6, K = 40, vectors of 16 floats. Columns 0-3
 * form a 3 x 4 tile: per step of 16 k, 3 loads of A, 4 of B, 12 multiply-adds into 12 vector
 * accumulators; k = 32..39 is added in scalar order after each accumulator's lanes are summed.
 * Columns 4 and 5 are 3 x 1 tiles, each element computed by the same steps.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);

static sgemm_fn blas_sgemm;
static int small_rows = -1;

/* ---- kernels ----------------------------------------------------------------------------- */
#define W 16 /* floats per vector: AVX-512 where the machine has it, two or four narrower ones elsewhere */
typedef float vf __attribute__((vector_size(W * 4)));
static inline vf load(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));

static inline float lanes_sum(vf v) { /* a fixed tree: lane l + lane l + 8, then + 4, + 2, + 1 */
  vf8 lo8, hi8;
  memcpy(&lo8, &v, 32);
  memcpy(&hi8, (const char *)&v + 32, 32);
  vf8 s8 = lo8 + hi8;
  vf4 lo4, hi4;
  memcpy(&lo4, &s8, 16);
  memcpy(&hi4, (const char *)&s8 + 16, 16);
  vf4 s4 = lo4 + hi4;
  float s2[2] = {s4[0] + s4[2], s4[1] + s4[3]};
  return s2[0] + s2[1];
}

static inline void put(float *c, float alpha, float v, float beta) {
  *c = alpha * v + (beta == 0.0f ? 0.0f : beta * *c); /* BLAS: beta 0 ignores C (it may hold NaN) */
}

/* B stored N x K: dot products of NI rows of A with NJ rows of B, into t[i * 4 + j] */
#define DOT_TILE(NI, NJ)                                                                          \
  static void dots_##NI##x##NJ(int K, const float *A, long lda, const float *B, long ldb, float *t) { \
    vf acc[NI][NJ];                                                                               \
    for (int i = 0; i < NI; i++)                                                                  \
      for (int j = 0; j < NJ; j++) acc[i][j] = (vf){0};                                           \
    int k = 0;                                                                                    \
    for (; k + W <= K; k += W) {                                                                  \
      vf a[NI], b[NJ];                                                                            \
      for (int i = 0; i < NI; i++) a[i] = load(A + i * lda + k);                                  \
      for (int j = 0; j < NJ; j++) b[j] = load(B + j * ldb + k);                                  \
      for (int i = 0; i < NI; i++)                                                                \
        for (int j = 0; j < NJ; j++) acc[i][j] += a[i] * b[j];                                    \
    }                                                                                             \
    for (int i = 0; i < NI; i++)                                                                  \
      for (int j = 0; j < NJ; j++) {                                                              \
        float s = lanes_sum(acc[i][j]);                                                           \
        for (int kk = k; kk < K; kk++) s += A[i * lda + kk] * B[j * ldb + kk];                    \
        t[i * 4 + j] = s;                                                                         \
      }                                                                                           \
  }
DOT_TILE(1, 4) DOT_TILE(2, 4) DOT_TILE(3, 4) DOT_TILE(4, 4)
DOT_TILE(1, 1) DOT_TILE(2, 1) DOT_TILE(3, 1) DOT_TILE(4, 1)
typedef void (*dots_fn)(int, const float *, long, const float *, long, float *);
static const dots_fn dots4[4] = {dots_1x4, dots_2x4, dots_3x4, dots_4x4};
static const dots_fn dots1[4] = {dots_1x1, dots_2x1, dots_3x1, dots_4x1};

typedef struct {
  int M, N, K, lda, ldb, ldc, b_rows_are_n; /* b_rows_are_n: B stored N x K (TRANS) */
  float alpha, beta;
  const float *A, *B;
  float *C;
} product;

static void dot_columns(const product *p, int j_begin, int j_end) {
  float t[16];
  for (int j0 = j_begin; j0 < j_end;) {
    int nj = j_end - j0 >= 4 ? 4 : 1;
    for (int i0 = 0; i0 < p->M; i0 += 4) {
      int ni = p->M - i0 < 4 ? p->M - i0 : 4;
      (nj == 4 ? dots4 : dots1)[ni - 1](p->K, p->A + (long)i0 * p->lda, p->lda, p->B + (long)j0 * p->ldb,
                                        p->ldb, t);
      for (int i = 0; i < ni; i++)
        for (int j = 0; j < nj; j++) put(p->C + (long)(i0 + i) * p->ldc + j0 + j, p->alpha, t[i * 4 + j], p->beta);
    }
    j0 += nj;
  }
}

/* B stored K x N: up to 4 rows of C by V vectors of columns, each lane summed over k in order */
#define AXPY_TILE(NI, V)                                                                          \
  static void axpy_##NI##x##V(int K, const float *A, long lda, const float *B, long ldb, float *c, \
                              long ldc, float alpha, float beta) {                                \
    vf acc[NI][V];                                                                                \
    for (int i = 0; i < NI; i++)                                                                  \
      for (int v = 0; v < V; v++) acc[i][v] = (vf){0};                                            \
    for (int k = 0; k < K; k++) {                                                                 \
      vf b[V];                                                                                    \
      for (int v = 0; v < V; v++) b[v] = load(B + k * ldb + v * W);                               \
      for (int i = 0; i < NI; i++) {                                                              \
        float a = A[i * lda + k];                                                                 \
        for (int v = 0; v < V; v++) acc[i][v] += a * b[v];                                        \
      }                                                                                           \
    }                                                                                             \
    for (int i = 0; i < NI; i++)                                                                  \
      for (int v = 0; v < V; v++) {                                                               \
        float *out = c + i * ldc + v * W;                                                         \
        vf r = alpha * acc[i][v];                                                                 \
        if (beta != 0.0f) r += beta * load(out);                                                  \
        store(out, r);                                                                            \
      }                                                                                           \
  }
AXPY_TILE(1, 2) AXPY_TILE(2, 2) AXPY_TILE(3, 2) AXPY_TILE(4, 2)
AXPY_TILE(1, 1) AXPY_TILE(2, 1) AXPY_TILE(3, 1) AXPY_TILE(4, 1)
typedef void (*axpy_fn)(int, const float *, long, const float *, long, float *, long, float, float);
static const axpy_fn axpy2[4] = {axpy_1x2, axpy_2x2, axpy_3x2, axpy_4x2};
static const axpy_fn axpy1[4] = {axpy_1x1, axpy_2x1, axpy_3x1, axpy_4x1};

static void axpy_columns(const product *p, int j_begin, int j_end) {
  for (int i0 = 0; i0 < p->M; i0 += 4) {
    int ni = p->M - i0 < 4 ? p->M - i0 : 4;
    const float *a = p->A + (long)i0 * p->lda;
    float *c = p->C + (long)i0 * p->ldc;
    int j = j_begin;
    for (; j + 2 * W <= j_end; j += 2 * W)
      axpy2[ni - 1](p->K, a, p->lda, p->B + j, p->ldb, c + j, p->ldc, p->alpha, p->beta);
    for (; j + W <= j_end; j += W)
      axpy1[ni - 1](p->K, a, p->lda, p->B + j, p->ldb, c + j, p->ldc, p->alpha, p->beta);
    for (; j < j_end; j++) /* the last columns, each lane's steps in scalar form */
      for (int i = 0; i < ni; i++) {
        float s = 0.0f;
        for (int k = 0; k < p->K; k++) s += a[(long)i * p->lda + k] * p->B[(long)k * p->ldb + j];
        put(c + (long)i * p->ldc + j, p->alpha, s, p->beta);
      }
  }
}

/* The columns of part `part` of `parts`: whole blocks of 2W, so a column's code path (vector
 * block or scalar tail) is the same however many parts there are. */
static void run_part(const product *p, int part, int parts) {
  int blocks = (p->N + 2 * W - 1) / (2 * W);
  int begin = (int)((long)blocks * part / parts) * 2 * W, end = (int)((long)blocks * (part + 1) / parts) * 2 * W;
  if (end > p->N) end = p->N;
  if (begin >= end) return;
  if (p->b_rows_are_n)
    dot_columns(p, begin, end);
  else
    axpy_columns(p, begin, end);
}

/* ---- threads: the caller computes part 0, workers the others ----------------------------- */
#define MAX_THREADS 8
#define SPINS 400000 /* a worker waits this long for the next product before it sleeps (~0.1 ms) */
static int n_threads = 1;
static int workers_started;
static pthread_mutex_t pool = PTHREAD_MUTEX_INITIALIZER;
static product job;
static int job_parts;
static atomic_uint posted;     /* bumped once per product handed to the workers */
static atomic_int remaining;   /* workers still computing the current product */
static atomic_int sleepers;    /* workers asleep on `posted` */

static void futex_wait(atomic_uint *addr, unsigned value) {
  syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, value, NULL, NULL, 0);
}
static void futex_wake(void *addr) { syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0); }
static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static unsigned posted_before; /* `posted` when the workers were started, before their first product */

static void *worker(void *arg) {
  int id = (int)(long)arg;
  unsigned seen = posted_before;
  for (;;) {
    unsigned now;
    for (int spin = 0; (now = atomic_load(&posted)) == seen; spin++) {
      if (spin < SPINS) {
        relax();
        continue;
      }
      atomic_fetch_add(&sleepers, 1);
      if (atomic_load(&posted) == seen) futex_wait(&posted, seen);
      atomic_fetch_sub(&sleepers, 1);
      spin = 0;
    }
    seen = now;
    if (id < job_parts) run_part(&job, id, job_parts);
    if (atomic_fetch_sub(&remaining, 1) == 1) futex_wake(&remaining);
  }
  return NULL;
}

static void forget_workers(void) { /* a forked child has none of them */
  workers_started = 0;
  atomic_store(&sleepers, 0);
}

static int start_workers(void) {
  if (workers_started) return n_threads;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  posted_before = atomic_load(&posted);
  int started = 1;
  for (; started < n_threads; started++) {
    pthread_t t;
    if (pthread_create(&t, &attr, worker, (void *)(long)started) != 0) break;
  }
  pthread_attr_destroy(&attr);
  n_threads = started;
  workers_started = 1;
  return n_threads;
}

static void run(const product *p) {
  long work = (long)p->M * p->N * p->K;
  int parts = work < 65536 ? 1 : (int)(work / 65536 < n_threads ? work / 65536 : n_threads);
  if (parts < 2 || pthread_mutex_trylock(&pool) != 0) { /* small, or another thread has the workers */
    run_part(p, 0, 1);
    return;
  }
  int workers = start_workers() - 1;
  if (parts > workers + 1) parts = workers + 1;
  job = *p;
  job_parts = parts;
  atomic_store(&remaining, workers);
  atomic_fetch_add(&posted, 1);
  if (atomic_load(&sleepers) > 0) futex_wake(&posted);
  run_part(p, 0, parts);
  for (int spin = 0, left; (left = atomic_load(&remaining)) > 0; spin++) {
    if (spin < SPINS)
      relax();
    else
      futex_wait((atomic_uint *)&remaining, (unsigned)left);
  }
  pthread_mutex_unlock(&pool);
}

static void resolve(void) {
  void *blas = dlopen(BLAS_LIBRARY, RTLD_NOW | RTLD_GLOBAL);
  blas_sgemm = (sgemm_fn)dlsym(blas, "cblas_sgemm");
  const char *rows = getenv("SPECSTREAM_GEMV_ROWS");
  cpu_set_t cpus;
  n_threads = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
  if (n_threads < 1) n_threads = 1;
  pthread_atfork(NULL, NULL, forget_workers);
  small_rows = rows ? atoi(rows) : 16;
}

/* C (M x N) = alpha * op(A) (M x K) * op(B) (K x N) + beta * C */
void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  if (small_rows < 0) resolve();
  if (order != ROW_MAJOR || M > small_rows || K == 0 || N == 0) {
    blas_sgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  float *rows = NULL; /* A stored K x M: its rows gathered first, so that each is computed as alone */
  if (trans_a != NO_TRANS) {
    if (!(rows = malloc((size_t)M * K * sizeof *rows))) {
      blas_sgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    }
    for (int i = 0; i < M; i++)
      for (int k = 0; k < K; k++) rows[(long)i * K + k] = A[(long)k * lda + i];
  }
  product p = {M, N, K, rows ? K : lda, ldb, ldc, trans_b == TRANS, alpha, beta, rows ? rows : A, B, C};
  run(&p);
  free(rows);
}
