// Tree and multi-stream attention of a Speculative Streaming decode step (body of an
// mx.fast.metal_kernel; mlx_specstream/kernels/attention.py launches it).
//
// Query rows: q (B, H, R, D). Keys/values: k, v (B, Hkv, N, D) = the cache prefix (n_prefix rows)
// followed by the M tree nodes, then ks, vs (B, Hkv, S, D) = the stream rows, never concatenated
// with k, v. A row sees: every prefix key; node key c iff bit c of anc[node] (node = rows[i, 0]:
// the row's own node for main rows, the stream's node for stream rows); stream keys
// [rows[i, 1], rows[i, 1] + rows[i, 2]). That covers tree attention (no stream keys) and both
// multi-stream visibility rules (see tree.stream_mask).
//
// One threadgroup = NSG simdgroups x 4 query rows = 4 * NSG rows of one (batch, kv head): row rr
// of the GQA group is (node i = rr / G, head hk * G + rr % G), so the G heads of a node sit
// together and share the key tiles. Keys go by tiles of 32 (one per lane) staged in threadgroup
// memory (in T, rows padded so that the lanes of a simdgroup read different banks);
// softmax is online (one pass over the keys), in base 2, in float32. With SPLIT the keys
// [0, N) are cut into `chunk`-key pieces over grid.z and each piece writes its unnormalized
// output and (max, sum) for attention_combine.metal; the stream keys go with the last piece.
//
// Template: T (q/k/v type), OT (out type: T, or float with SPLIT), D (head dim <= 128), NSG (4 or
// 8 simdgroups; the wrapper picks 8 when the tiles fit in 32 KB), SPLIT.
// params: n_prefix, N, S, R, G, W (anc words per node), H, Hkv, n_splits, chunk, B (M = N - n_prefix).
// Grid (threads): (32 * NSG * row blocks, B * Hkv, n_splits); threadgroup (32 * NSG, 1, 1).

constexpr int RS = 4;              // query rows per simdgroup (the lanes of a float4)
constexpr int QB = NSG * RS;       // query rows per threadgroup
constexpr int BK = 32;             // keys per tile: one per lane
constexpr int DT = (D + 31) / 32;  // head-dim elements per lane (d = lane + 32 t)
constexpr int KP = D + (sizeof(T) == 4 ? 1 : 2);  // padded key-tile row, an odd number of words

threadgroup float4 q_tile[NSG * D];   // [sg * D + d][r]: pre-scaled query rows of simdgroup sg
threadgroup T k_tile[BK * KP];        // [c * KP + d]: key c of the tile
threadgroup float4 p_tile[NSG * BK];  // [sg * BK + c][r]: probability of key c for row r

const int n_prefix = params[0];
const int N = params[1];
const int S = params[2];
const int R = params[3];
const int G = params[4];
const int W = params[5];
const int H = params[6];
const int Hkv = params[7];
const int n_splits = params[8];
const int chunk = params[9];
const int B = params[10];

const int tid = int(thread_index_in_threadgroup);
const int sg = int(simdgroup_index_in_threadgroup);
const int lane = int(thread_index_in_simdgroup);
const int block = int(threadgroup_position_in_grid.x);
const int b = int(threadgroup_position_in_grid.y) / Hkv;
const int hk = int(threadgroup_position_in_grid.y) % Hkv;
const int split = int(threadgroup_position_in_grid.z);
const int GR = G * R;
const int row0 = block * QB;

// The rows of this simdgroup.
bool row_ok[RS];
int row_node[RS];
int row_lo[RS];
int row_hi[RS];
for (int r = 0; r < RS; ++r) {
  const int rr = row0 + sg * RS + r;
  row_ok[r] = rr < GR;
  const int i = row_ok[r] ? rr / G : 0;
  row_node[r] = rows[i * 3];
  row_lo[r] = rows[i * 3 + 1];
  row_hi[r] = rows[i * 3 + 1] + rows[i * 3 + 2];
}

// Stream keys any row of the threadgroup sees (they go with the last split).
int s_lo = S;
int s_hi = 0;
for (int rq = 0; rq < QB; ++rq) {
  const int rr = row0 + rq;
  if (rr < GR) {
    const int i = rr / G;
    if (rows[i * 3 + 2] > 0) {
      s_lo = min(s_lo, rows[i * 3 + 1]);
      s_hi = max(s_hi, rows[i * 3 + 1] + rows[i * 3 + 2]);
    }
  }
}
if (split != n_splits - 1 || s_hi <= s_lo) {
  s_lo = 0;
  s_hi = 0;
}

// Query rows, scaled by scale * log2(e) (softmax in base 2).
const float qscale = scale * 1.44269504088896341f;
for (int e = tid; e < QB * D; e += NSG * 32) {
  const int rq = e / D;
  const int d = e % D;
  const int rr = row0 + rq;
  float val = 0.0f;
  if (rr < GR) {
    const int64_t off = int64_t(b) * q_strides[0] + int64_t(hk * G + rr % G) * q_strides[1] +
                        int64_t(rr / G) * q_strides[2] + int64_t(d) * q_strides[3];
    val = float(q[off]) * qscale;
  }
  q_tile[(rq / RS) * D + d][rq % RS] = val;
}

const int64_t k_base = int64_t(b) * k_strides[0] + int64_t(hk) * k_strides[1];
const int64_t v_base = int64_t(b) * v_strides[0] + int64_t(hk) * v_strides[1];
const int64_t ks_base = int64_t(b) * ks_strides[0] + int64_t(hk) * ks_strides[1];
const int64_t vs_base = int64_t(b) * vs_strides[0] + int64_t(hk) * vs_strides[1];

const int a0 = min(N, split * chunk);
const int a1 = min(N, (split + 1) * chunk);
const int n_tiles_a = (a1 - a0 + BK - 1) / BK;
const int n_tiles_b = (s_hi - s_lo + BK - 1) / BK;

float4 m = float4(-INFINITY);
float4 l = float4(0.0f);
float4 o[DT];
for (int t = 0; t < DT; ++t) {
  o[t] = float4(0.0f);
}

for (int tile = 0; tile < n_tiles_a + n_tiles_b; ++tile) {
  // virtual keys [start, end): [0, N) are k/v rows, [N, N + S) stream rows
  int start;
  int end;
  if (tile < n_tiles_a) {
    start = a0 + tile * BK;
    end = min(a1, start + BK);
  } else {
    start = N + s_lo + (tile - n_tiles_a) * BK;
    end = min(N + s_hi, start + BK);
  }

  threadgroup_barrier(mem_flags::mem_threadgroup);  // q_tile written / last tile's k_tile read
  for (int e = tid; e < BK * D; e += NSG * 32) {
    const int c = e / D;
    const int d = e % D;
    const int j = start + c;
    T val = static_cast<T>(0.0f);
    if (j < end) {
      val = j < N ? k[k_base + int64_t(j) * k_strides[2] + int64_t(d) * k_strides[3]]
                  : ks[ks_base + int64_t(j - N) * ks_strides[2] + int64_t(d) * ks_strides[3]];
    }
    k_tile[c * KP + d] = val;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // score of this lane's key for the simdgroup's 4 rows
  const int j = start + lane;
  float4 s = float4(0.0f);
  for (int d = 0; d < D; ++d) {
    s += q_tile[sg * D + d] * float(k_tile[lane * KP + d]);
  }
  for (int r = 0; r < RS; ++r) {
    bool vis = row_ok[r] && j < end;
    if (vis && j >= n_prefix) {
      if (j < N) {
        const int c = j - n_prefix;
        vis = ((anc[row_node[r] * W + c / 32] >> uint(c % 32)) & 1u) != 0u;
      } else {
        vis = j - N >= row_lo[r] && j - N < row_hi[r];
      }
    }
    s[r] = vis ? s[r] : -INFINITY;
  }

  const float4 tile_max = simd_max(s);
  const float4 m_new = max(m, tile_max);
  float4 p;
  float4 corr;
  for (int r = 0; r < RS; ++r) {
    p[r] = s[r] == -INFINITY ? 0.0f : fast::exp2(s[r] - m_new[r]);
    corr[r] = m[r] == -INFINITY ? 0.0f : fast::exp2(m[r] - m_new[r]);
  }
  l = l * corr + simd_sum(p);
  m = m_new;
  for (int t = 0; t < DT; ++t) {
    o[t] *= corr;
  }

  p_tile[sg * BK + lane] = p;
  simdgroup_barrier(mem_flags::mem_threadgroup);
  if (any(tile_max > float4(-INFINITY))) {  // the same on every lane of the simdgroup
    for (int c = 0; c < end - start; ++c) {
      const int jj = start + c;
      const float4 pc = p_tile[sg * BK + c];
      for (int t = 0; t < DT; ++t) {
        const int d = lane + 32 * t;
        if (d < D) {
          const float vv =
              jj < N ? float(v[v_base + int64_t(jj) * v_strides[2] + int64_t(d) * v_strides[3]])
                     : float(vs[vs_base + int64_t(jj - N) * vs_strides[2] + int64_t(d) * vs_strides[3]]);
          o[t] += pc * vv;
        }
      }
    }
  }
}

for (int r = 0; r < RS; ++r) {
  if (row_ok[r]) {
    const int rr = row0 + sg * RS + r;
    const int64_t row = (int64_t(b) * H + hk * G + rr % G) * R + rr / G;
    if (SPLIT) {
      const int64_t base = int64_t(split) * B * H * R + row;
      for (int t = 0; t < DT; ++t) {
        const int d = lane + 32 * t;
        if (d < D) {
          out[base * D + d] = static_cast<OT>(o[t][r]);
        }
      }
      if (lane == 0) {
        ml[base * 2] = m[r];
        ml[base * 2 + 1] = l[r];
      }
    } else {
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      for (int t = 0; t < DT; ++t) {
        const int d = lane + 32 * t;
        if (d < D) {
          out[row * D + d] = static_cast<OT>(o[t][r] * inv);
        }
      }
    }
  }
}
