// Combine the key-split pieces of tree_attention.metal (SPLIT): for each row, weight each
// piece's unnormalized output by 2^(m_piece - m_max) and divide by the weighted sums.
// part: (n_splits, rows, D) float; ml: (n_splits, rows, 2) float (max in base 2, sum).
// cparams: n_splits, rows, D. Grid (threads): (D, rows, 1). Template: T (out type).

const int n_splits = cparams[0];
const int n_rows = cparams[1];
const int D = cparams[2];
const int d = int(thread_position_in_grid.x);
const int row = int(thread_position_in_grid.y);
if (d < D && row < n_rows) {
  float m_max = -INFINITY;
  for (int s = 0; s < n_splits; ++s) {
    m_max = max(m_max, ml[(int64_t(s) * n_rows + row) * 2]);
  }
  float acc = 0.0f;
  float sum = 0.0f;
  for (int s = 0; s < n_splits; ++s) {
    const int64_t piece = int64_t(s) * n_rows + row;
    const float m = ml[piece * 2];
    if (m != -INFINITY) {
      const float w = fast::exp2(m - m_max);
      acc += w * part[piece * D + d];
      sum += w * ml[piece * 2 + 1];
    }
  }
  out[int64_t(row) * D + d] = static_cast<T>(sum > 0.0f ? acc / sum : 0.0f);
}
