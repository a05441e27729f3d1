/* Small-row matrix products for MLX on Linux with OpenBLAS (mlx_specstream/blas.py builds this
 * library with -DBLAS_LIBRARY="path of OpenBLAS" and preloads it, so that MLX's cblas_sgemm
 * resolves here; the products themselves are OpenBLAS's, looked up in that library).
 *
 * A decode pass multiplies 1-8 rows by each weight matrix. OpenBLAS 0.3.21's sgemm packs and
 * threads such products as if they were large: a 1 x 384 by 384 x 1024 product costs ~90 us
 * there against ~28 us for sgemv on the same 2 cores. Row-major products of at most
 * SPECSTREAM_GEMV_ROWS rows (default 8; 0 turns this off) run as one sgemv per row; everything
 * else goes to OpenBLAS's sgemm unchanged. Each row is then computed the same way whatever the
 * number of rows in the pass, up to that bound.
 */
#include <dlfcn.h>
#include <stdlib.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);

static sgemm_fn blas_sgemm;
static sgemv_fn blas_sgemv;
static int gemv_rows = -1;

static void resolve(void) {
  void *blas = dlopen(BLAS_LIBRARY, RTLD_NOW | RTLD_GLOBAL);
  blas_sgemm = (sgemm_fn)dlsym(blas, "cblas_sgemm");
  blas_sgemv = (sgemv_fn)dlsym(blas, "cblas_sgemv");
  const char *rows = getenv("SPECSTREAM_GEMV_ROWS");
  gemv_rows = rows ? atoi(rows) : 8;
}

/* C (M x N) = alpha * op(A) (M x K) * op(B) (K x N) + beta * C */
void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  if (gemv_rows < 0) resolve();
  if (order != ROW_MAJOR || M > gemv_rows || K == 0 || !blas_sgemv) {
    blas_sgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
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
