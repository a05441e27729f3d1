import time, sys
import mlx_specstream  # preload blas
import mlx.core as mx
from mlx_specstream import blas
print(blas.blas_label())
shapes = [(384,384),(384,128),(384,128),(384,384),(384,1024),(384,1024),(1024,384)]*8 + [(384,4096)]
W = [mx.random.normal(s) for s in shapes]; mx.eval(W)
def run(M, reps=30):
    xs = {k: mx.random.normal((M,k)) for k in (384,1024)}; mx.eval(list(xs.values()))
    best = 1e9
    for _ in range(reps):
        t=time.perf_counter(); mx.eval([xs[w.shape[0]] @ w for w in W]); best=min(best,time.perf_counter()-t)
    return best*1e3
Ms = [int(a) for a in sys.argv[1:]] or list(range(1,41))
for M in Ms:
    print(M, round(run(M),2), flush=True)
