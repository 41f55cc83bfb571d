#include "kernels/weight_matrix.h"

namespace mr {

const char* WeightFormatName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kQ8G64:
      return "q8/g64";
    default:
      return KFormatName(KFormatOf(f));
  }
}

void MatmulTiles(const KernelTable& kt, const WeightMatrix& w, const QActs& x, int64_t n_rows, float* y, int64_t ldy,
                 int64_t t_begin, int64_t t_end) {
  if (w.native()) {
    kt.matmul_k[static_cast<int>(w.k.format)](w.k, x, n_rows, y, ldy, t_begin, t_end);
  } else {
    kt.matmul_q8(w.q8, x.q.data(), x.scales.data(), n_rows, y, ldy, t_begin, t_end);
  }
}

void MatmulGluTiles(const KernelTable& kt, const WeightMatrix& gate, const WeightMatrix& up, const QActs& x,
                    int64_t n_rows, GluAct act, float* y, int64_t ldy, int64_t t_begin, int64_t t_end) {
  MR_CHECK(gate.format == up.format && gate.rows() == up.rows() && gate.cols() == up.cols());
  if (gate.native()) {
    kt.matmul_k_glu[static_cast<int>(gate.k.format)](gate.k, up.k, x, n_rows, act, y, ldy, t_begin, t_end);
  } else {
    kt.matmul_q8_glu(gate.q8, up.q8, x.q.data(), x.scales.data(), n_rows, act, y, ldy, t_begin, t_end);
  }
}

void DequantizeWeightRow(const WeightMatrix& w, int64_t o, float* dst) {
  if (w.native()) {
    DequantizeKRow(w.k, o, dst);
  } else {
    DequantizeQ8Row(w.q8, o, dst);
  }
}

}  // namespace mr
