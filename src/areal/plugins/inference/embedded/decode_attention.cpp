// The embedded engine's decode attention, in one call per layer (decode_kernel.py says why).
//
// For each row b of a decode step: write its new key and value into the pool at write[b], then
// attend its one query per head over the first lens[b] slots listed in read[b], read in place
// from the pool (no gathered copy). Query head h reads KV head h / (Hq / Hkv), as grouped-query
// attention does. float32 only; the caller checks shapes, this file checks every index.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace {

// One (row, KV head) pair at a time; D fixed at compile time for the usual head sizes, so the
// dot products and the weighted sum vectorise.
template <int64_t kDim>
void attend_rows(int64_t begin, int64_t end, int64_t kv_heads, int64_t group, int64_t span,
                 int64_t runtime_dim, const float* q, const float* keys, const float* values,
                 const int64_t* read, const int64_t* lens, float* out) {
  const int64_t dim = kDim > 0 ? kDim : runtime_dim;
  const int64_t q_heads = kv_heads * group;
  const int64_t token = kv_heads * dim;  // floats per pool slot
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  std::vector<float> scores(group * span);
  std::vector<float> acc(group * dim);
  for (int64_t task = begin; task < end; ++task) {
    const int64_t b = task / kv_heads, h = task % kv_heads;
    const int64_t n = lens[b];
    const int64_t* slots = read + b * span;
    const float* qb = q + (b * q_heads + h * group) * dim;
    for (int64_t s = 0; s < n; ++s) {
      const float* k = keys + slots[s] * token + h * dim;
      for (int64_t g = 0; g < group; ++g) {
        const float* qg = qb + g * dim;
        float dot = 0.f;
        for (int64_t d = 0; d < dim; ++d) dot += qg[d] * k[d];
        scores[g * span + s] = dot * scale;
      }
    }
    for (int64_t g = 0; g < group; ++g) {  // softmax over the row's n keys (n >= 1)
      float* sc = scores.data() + g * span;
      float top = sc[0];
      for (int64_t s = 1; s < n; ++s) top = sc[s] > top ? sc[s] : top;
      float sum = 0.f;
      for (int64_t s = 0; s < n; ++s) {
        sc[s] = std::exp(sc[s] - top);
        sum += sc[s];
      }
      const float inv = 1.f / sum;
      for (int64_t s = 0; s < n; ++s) sc[s] *= inv;
    }
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t s = 0; s < n; ++s) {
      const float* v = values + slots[s] * token + h * dim;
      for (int64_t g = 0; g < group; ++g) {
        const float p = scores[g * span + s];
        float* a = acc.data() + g * dim;
        for (int64_t d = 0; d < dim; ++d) a[d] += p * v[d];
      }
    }
    for (int64_t g = 0; g < group; ++g)
      std::memcpy(out + (b * q_heads + h * group + g) * dim, acc.data() + g * dim,
                  dim * sizeof(float));
  }
}

void check_float(const at::Tensor& t, const char* name, int64_t dims) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dims && t.is_contiguous(), name, " must be a contiguous ", dims,
              "-d tensor, got ", t.sizes());
}

void check_slots(const at::Tensor& t, const char* name, int64_t slots) {
  TORCH_CHECK(t.scalar_type() == at::kLong && t.is_contiguous(), name,
              " must be a contiguous int64 tensor");
  const int64_t* p = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    TORCH_CHECK(p[i] >= 0 && p[i] < slots, name, " holds slot ", p[i], ", outside the pool's ",
                slots);
}

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                        at::Tensor& k_layer, at::Tensor& v_layer, const at::Tensor& write,
                        const at::Tensor& read, const at::Tensor& lens) {
  check_float(q, "q", 3);
  check_float(k_layer, "k_layer", 3);
  check_float(v_layer, "v_layer", 3);
  check_float(k_new, "k_new", 3);
  check_float(v_new, "v_new", 3);
  const int64_t rows = q.size(0), q_heads = q.size(1), dim = q.size(2);
  const int64_t slots = k_layer.size(0), kv_heads = k_layer.size(1);
  TORCH_CHECK(v_layer.sizes() == k_layer.sizes(), "k_layer and v_layer differ in shape");
  TORCH_CHECK(k_layer.size(2) == dim, "the pool's head size is not q's");
  TORCH_CHECK(kv_heads > 0 && q_heads % kv_heads == 0, "q's heads are not a multiple of the KV heads");
  TORCH_CHECK(k_new.sizes() == v_new.sizes() && k_new.size(0) == write.numel() &&
                  k_new.size(1) == kv_heads && k_new.size(2) == dim,
              "k_new and v_new must be [len(write), kv_heads, head_dim]");
  TORCH_CHECK(read.dim() == 2 && read.size(0) == rows, "read must be [rows, span]");
  TORCH_CHECK(lens.dim() == 1 && lens.size(0) == rows, "lens must be [rows]");
  const int64_t span = read.size(1);
  check_slots(write, "write", slots);
  check_slots(read, "read", slots);
  TORCH_CHECK(lens.scalar_type() == at::kLong && lens.is_contiguous(), "lens must be int64");
  const int64_t* lp = lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < rows; ++b)
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= span, "lens[", b, "] = ", lp[b], " is not in 1..", span);

  float* keys = k_layer.data_ptr<float>();
  float* values = v_layer.data_ptr<float>();
  const int64_t token = kv_heads * dim;
  const int64_t* wp = write.data_ptr<int64_t>();
  for (int64_t i = 0; i < write.numel(); ++i) {
    std::memcpy(keys + wp[i] * token, k_new.data_ptr<float>() + i * token, token * sizeof(float));
    std::memcpy(values + wp[i] * token, v_new.data_ptr<float>() + i * token, token * sizeof(float));
  }
  at::Tensor out = at::empty_like(q);
  const int64_t group = q_heads / kv_heads;
  const float* qp = q.data_ptr<float>();
  const int64_t* rp = read.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows * kv_heads, 1, [&](int64_t begin, int64_t end) {
    switch (dim) {
      case 32: return attend_rows<32>(begin, end, kv_heads, group, span, dim, qp, keys, values, rp, lp, op);
      case 64: return attend_rows<64>(begin, end, kv_heads, group, span, dim, qp, keys, values, rp, lp, op);
      case 128: return attend_rows<128>(begin, end, kv_heads, group, span, dim, qp, keys, values, rp, lp, op);
      default: return attend_rows<0>(begin, end, kv_heads, group, span, dim, qp, keys, values, rp, lp, op);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(areal_kernels, m) {
  m.def(
      "paged_decode(Tensor q, Tensor k_new, Tensor v_new, Tensor(a!) k_layer, Tensor(b!) v_layer,"
      " Tensor write, Tensor read, Tensor lens) -> Tensor");
}

TORCH_LIBRARY_IMPL(areal_kernels, CPU, m) { m.impl("paged_decode", &paged_decode); }
