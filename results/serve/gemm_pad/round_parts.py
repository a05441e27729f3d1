import sys, time, json, collections
sys.path.insert(0, 'scripts'); sys.argv=['x']
import mlx_specstream
import bench_rounds as br
from mlx_specstream import scheduler as sch, runner as rn
from mlx_specstream.api import DEFAULT_MODEL
from mlx_specstream.pool import ModelPool
acc = collections.defaultdict(float); cnt = collections.Counter(); rows=[]
orig = rn.run_passes
def timed(reqs):
    kind = 'streams' if reqs[0].tree is None else 'tree'
    t = time.perf_counter(); orig(reqs); acc[kind] += time.perf_counter() - t; cnt[kind] += 1
    if kind == 'tree': rows.append((len(reqs), sum(len(r.tree) for r in reqs), max(len(r.tree) for r in reqs)))
sch.run_passes = timed
adapter = sys.argv[1] if len(sys.argv) > 1 else 'sql-lossless'
import os
adapter = os.environ.get('AD', 'sql-lossless')
pool = ModelPool(DEFAULT_MODEL, [adapter] if adapter else [])
tok = pool.tokenizer
model = pool.get(f"{pool.base_id}:{adapter}") if adapter else pool.base
lines = open('data/sql/test.jsonl')
ids = [tok.encode(json.loads(next(lines))["prompt"]) for _ in range(12)]
s = sch.Scheduler(max_active=4); s.start()
run = br.rounds_method(s, model, tok, mode='ss' if adapter else 'ar')
for rep in range(2):
    acc.clear(); cnt.clear(); rows.clear()
    t = time.perf_counter(); ntok = 0
    for k in range(0, 12, 4):
        toks, passes = run(ids[k:k+4], 64); ntok += len(toks)
    wall = time.perf_counter() - t
print('wall', round(wall,3), 'tokens', ntok, {k: (round(v,3), cnt[k], round(v/cnt[k]*1e3,2)) for k,v in acc.items()}, 'host', round(wall-sum(acc.values()),3))
import numpy as np
r = np.array(rows); print('tree passes: seqs mean', r[:,0].mean(), 'rows mean', r[:,1].mean(), 'max*B mean', (r[:,0]*r[:,2]).mean())
s.stop()
