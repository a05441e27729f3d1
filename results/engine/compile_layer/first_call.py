import time
t=time.perf_counter()
import mlx_specstream, mlx.core as mx
f = mx.compile(lambda x, y: (x * mx.sigmoid(x)) * y + 1.0)
for n in (1, 4, 7, 16):
    x = mx.ones((1, n, 1024)); y = mx.ones((1, n, 1024))
    t = time.perf_counter(); mx.eval(f(x, y)); print(n, round((time.perf_counter()-t)*1e3, 1), 'ms first call')
    t = time.perf_counter(); mx.eval(f(x, y)); print(n, round((time.perf_counter()-t)*1e3, 2), 'ms second')
