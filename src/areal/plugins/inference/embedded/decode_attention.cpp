// The embedded engine's decode attention, in one call per layer (decode_kernel.py says why).
//
// For each row b of a decode step: write its new key and value into the pool at write[b], then
// attend its one query per head over the first lens[b] slots listed in read[b], read in place
// from the pool (no gathered copy). Query head h reads KV head h / (Hq / Hkv), as grouped-query
// attention does. float32 only; the caller checks shapes, this file checks every index.
//
// paged_decode_rope does the same on the projections as they come out of the linear layer: it
// first applies the per-head RMSNorm (Qwen3's q_norm and k_norm, when given) and the rotary
// embedding (rotate-half, cos and sin of each row's position) to the queries and the new keys,
// the ~20 small ops a layer the model would otherwise run before attention.
//
// decode_layers runs a decode step's whole stack of dense decoder layers around those calls
// (norms, projections, MLP, residuals), so an eager step has no Python between its layers.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/silu.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
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

// The pool, the slots and the lengths of a call, all checked before anything is written.
struct Pool {
  int64_t rows, q_heads, kv_heads, dim, span;
};

// check_indexes false: the caller checked these very write, read and lens against a pool of this
// shape already (decode_layers, after its first layer): the shapes are checked, the indexes not.
Pool check_call(const at::Tensor& q, const at::Tensor& k_layer, const at::Tensor& v_layer,
                const at::Tensor& write, const at::Tensor& read, const at::Tensor& lens,
                bool check_indexes = true) {
  check_float(k_layer, "k_layer", 3);
  check_float(v_layer, "v_layer", 3);
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.dim() == 3, "q must be a float32 [rows, heads, dim]");
  const int64_t rows = q.size(0), q_heads = q.size(1), dim = q.size(2);
  const int64_t slots = k_layer.size(0), kv_heads = k_layer.size(1);
  TORCH_CHECK(v_layer.sizes() == k_layer.sizes(), "k_layer and v_layer differ in shape");
  TORCH_CHECK(k_layer.size(2) == dim, "the pool's head size is not q's");
  TORCH_CHECK(kv_heads > 0 && q_heads % kv_heads == 0, "q's heads are not a multiple of the KV heads");
  TORCH_CHECK(read.dim() == 2 && read.size(0) == rows, "read must be [rows, span]");
  TORCH_CHECK(lens.dim() == 1 && lens.size(0) == rows, "lens must be [rows]");
  const int64_t span = read.size(1);
  if (!check_indexes) return {rows, q_heads, kv_heads, dim, span};
  check_slots(write, "write", slots);
  check_slots(read, "read", slots);
  TORCH_CHECK(lens.scalar_type() == at::kLong && lens.is_contiguous(), "lens must be int64");
  const int64_t* lp = lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < rows; ++b)
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= span, "lens[", b, "] = ", lp[b], " is not in 1..", span);
  return {rows, q_heads, kv_heads, dim, span};
}

// A [n, heads, dim] float32 tensor whose heads are contiguous; its rows may be strided (views of
// one projection's output). Returns the row stride.
int64_t check_rows(const at::Tensor& t, const char* name, int64_t n, int64_t heads, int64_t dim) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 3 && t.size(0) == n && t.size(1) == heads && t.size(2) == dim, name,
              " must be [", n, ", ", heads, ", ", dim, "], got ", t.sizes());
  TORCH_CHECK(t.stride(2) == 1 && (heads == 1 || t.stride(1) == dim), name,
              "'s heads must be contiguous");
  return t.stride(0);
}

at::Tensor attend_all(const Pool& p, const float* qp, float* keys, float* values,
                      const at::Tensor& read, const at::Tensor& lens, const at::Tensor& like) {
  at::Tensor out = at::empty({p.rows, p.q_heads, p.dim}, like.options());
  const int64_t group = p.q_heads / p.kv_heads;
  const int64_t* rp = read.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t kv = p.kv_heads, span = p.span, dim = p.dim;
  at::parallel_for(0, p.rows * kv, 1, [&](int64_t begin, int64_t end) {
    switch (dim) {
      case 32: return attend_rows<32>(begin, end, kv, group, span, dim, qp, keys, values, rp, lp, op);
      case 64: return attend_rows<64>(begin, end, kv, group, span, dim, qp, keys, values, rp, lp, op);
      case 128: return attend_rows<128>(begin, end, kv, group, span, dim, qp, keys, values, rp, lp, op);
      default: return attend_rows<0>(begin, end, kv, group, span, dim, qp, keys, values, rp, lp, op);
    }
  });
  return out;
}

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                        at::Tensor& k_layer, at::Tensor& v_layer, const at::Tensor& write,
                        const at::Tensor& read, const at::Tensor& lens) {
  check_float(q, "q", 3);
  check_float(k_new, "k_new", 3);
  check_float(v_new, "v_new", 3);
  const Pool p = check_call(q, k_layer, v_layer, write, read, lens);
  TORCH_CHECK(k_new.sizes() == v_new.sizes() && k_new.size(0) == write.numel() &&
                  k_new.size(1) == p.kv_heads && k_new.size(2) == p.dim,
              "k_new and v_new must be [len(write), kv_heads, head_dim]");
  float* keys = k_layer.data_ptr<float>();
  float* values = v_layer.data_ptr<float>();
  const int64_t token = p.kv_heads * p.dim;
  const int64_t* wp = write.data_ptr<int64_t>();
  for (int64_t i = 0; i < write.numel(); ++i) {
    std::memcpy(keys + wp[i] * token, k_new.data_ptr<float>() + i * token, token * sizeof(float));
    std::memcpy(values + wp[i] * token, v_new.data_ptr<float>() + i * token, token * sizeof(float));
  }
  return attend_all(p, q.data_ptr<float>(), keys, values, read, lens, q);
}

// One head: RMSNorm with weight w (when w is not null), then rotate-half rotary embedding.
inline void norm_rope(const float* x, float* out, int64_t dim, const float* w, float eps,
                      const float* cos, const float* sin) {
  float scale = 1.f;
  if (w != nullptr) {
    float squares = 0.f;
    for (int64_t d = 0; d < dim; ++d) squares += x[d] * x[d];
    scale = 1.f / std::sqrt(squares / static_cast<float>(dim) + eps);
  }
  const int64_t half = dim / 2;
  for (int64_t d = 0; d < half; ++d) {
    const float a = x[d] * scale * (w != nullptr ? w[d] : 1.f);
    const float b = x[d + half] * scale * (w != nullptr ? w[d + half] : 1.f);
    out[d] = a * cos[d] - b * sin[d];
    out[d + half] = b * cos[d + half] + a * sin[d + half];
  }
}

const float* norm_weight(const std::optional<at::Tensor>& w, const char* name, int64_t dim) {
  if (!w.has_value() || !w->defined()) return nullptr;
  TORCH_CHECK(w->scalar_type() == at::kFloat && w->dim() == 1 && w->size(0) == dim &&
                  w->is_contiguous(),
              name, " must be a contiguous float32 [", dim, "]");
  return w->data_ptr<float>();
}

at::Tensor rope_attend(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                       at::Tensor& k_layer, at::Tensor& v_layer, const at::Tensor& write,
                       const at::Tensor& read, const at::Tensor& lens, const at::Tensor& cos,
                       const at::Tensor& sin, const std::optional<at::Tensor>& q_norm,
                       const std::optional<at::Tensor>& k_norm, double eps, bool check_indexes) {
  const Pool p = check_call(q, k_layer, v_layer, write, read, lens, check_indexes);
  const int64_t dim = p.dim, rows = p.rows;
  TORCH_CHECK(dim % 2 == 0, "the rotary embedding needs an even head size, got ", dim);
  TORCH_CHECK(write.numel() == rows, "a decode step writes one token a row");
  const int64_t q_stride = check_rows(q, "q", rows, p.q_heads, dim);
  const int64_t k_stride = check_rows(k_new, "k_new", rows, p.kv_heads, dim);
  const int64_t v_stride = check_rows(v_new, "v_new", rows, p.kv_heads, dim);
  check_float(cos, "cos", 2);
  check_float(sin, "sin", 2);
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.size(0) == rows && cos.size(1) == dim,
              "cos and sin must be [rows, head_dim]");
  const float* qw = norm_weight(q_norm, "q_norm", dim);
  const float* kw = norm_weight(k_norm, "k_norm", dim);
  const float e = static_cast<float>(eps);

  float* keys = k_layer.data_ptr<float>();
  float* values = v_layer.data_ptr<float>();
  const int64_t token = p.kv_heads * dim;
  const int64_t* wp = write.data_ptr<int64_t>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const float* kp = k_new.data_ptr<float>();
  const float* vp = v_new.data_ptr<float>();
  const float* qp = q.data_ptr<float>();
  at::Tensor roped = at::empty({rows, p.q_heads, dim}, q.options());
  float* rq = roped.data_ptr<float>();
  for (int64_t b = 0; b < rows; ++b) {  // small: [rows, heads, dim] of one token each
    const float* c = cp + b * dim;
    const float* s = sp + b * dim;
    for (int64_t h = 0; h < p.kv_heads; ++h)
      norm_rope(kp + b * k_stride + h * dim, keys + wp[b] * token + h * dim, dim, kw, e, c, s);
    std::memcpy(values + wp[b] * token, vp + b * v_stride, token * sizeof(float));
    for (int64_t h = 0; h < p.q_heads; ++h)
      norm_rope(qp + b * q_stride + h * dim, rq + (b * p.q_heads + h) * dim, dim, qw, e, c, s);
  }
  return attend_all(p, rq, keys, values, read, lens, q);
}

at::Tensor paged_decode_rope(const at::Tensor& q, const at::Tensor& k_new,
                             const at::Tensor& v_new, at::Tensor& k_layer, at::Tensor& v_layer,
                             const at::Tensor& write, const at::Tensor& read,
                             const at::Tensor& lens, const at::Tensor& cos, const at::Tensor& sin,
                             const std::optional<at::Tensor>& q_norm,
                             const std::optional<at::Tensor>& k_norm, double eps) {
  return rope_attend(q, k_new, v_new, k_layer, v_layer, write, read, lens, cos, sin, q_norm,
                     k_norm, eps, /*check_indexes=*/true);
}

// RMSNorm over the last dimension in one call (torch's CPU rms_norm is seven ops): x [..., H]
// contiguous float32, weight [H]. Rows split over threads only when there are enough of them.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() >= 1,
              "x must be a contiguous float32 tensor");
  const int64_t hidden = x.size(-1);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 1 &&
                  weight.size(0) == hidden && weight.is_contiguous(),
              "weight must be a contiguous float32 [", hidden, "]");
  at::Tensor out = at::empty(x.sizes(), x.options());
  const int64_t rows = hidden > 0 ? x.numel() / hidden : 0;
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float e = static_cast<float>(eps);
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(hidden, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xp + r * hidden;
      float* orow = op + r * hidden;
      float squares = 0.f;
      for (int64_t d = 0; d < hidden; ++d) squares += xr[d] * xr[d];
      const float scale = 1.f / std::sqrt(squares / static_cast<float>(hidden) + e);
      for (int64_t d = 0; d < hidden; ++d) orow[d] = xr[d] * scale * wp[d];
    }
  });
  return out;
}

// oneDNN's linear on a weight packed by mkldnn::_reorder_linear_weight (packed_linear.py), or
// ATen's on a plain one.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  bool packed) {
  if (!packed) return at::linear(x, weight, bias);
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            c10::string_view, c10::List<std::optional<at::Scalar>>,
                            std::optional<c10::string_view>)>();
  return op.call(x, weight, bias, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

// The output columns [at, at + width) of a projection as [rows, width / dim, dim] (a view).
at::Tensor heads_of(const at::Tensor& out, int64_t at, int64_t width, int64_t dim) {
  return out.narrow(1, at, width).view({out.size(0), width / dim, dim});
}

// A whole decode step's decoder layers in one call: for each layer, RMSNorm, the q/k/v
// projection(s), paged_decode_rope, the output projection and residual, RMSNorm, the SwiGLU MLP
// and residual; the same ops the model's modules run, without a Python call between them. x is
// [rows, hidden] (one new token a row). Per layer, ``groups`` gives how many linears make q/k/v
// (1: fused, 3) and gate/up (1: fused, 2); ``weights`` and ``biases`` list the layer's linears
// in order (q/k/v, o, gate/up, down), ``norms`` its two RMSNorm weights, ``qk_norms`` its q and
// k norms (None: none).
at::Tensor decode_layers(const at::Tensor& x, at::TensorList weights,
                         const c10::List<std::optional<at::Tensor>>& biases,
                         at::IntArrayRef groups, at::TensorList norms,
                         const c10::List<std::optional<at::Tensor>>& qk_norms,
                         at::TensorList k_pool, at::TensorList v_pool, const at::Tensor& write,
                         const at::Tensor& read, const at::Tensor& lens, const at::Tensor& cos,
                         const at::Tensor& sin, double eps, double qk_eps, bool packed) {
  const int64_t layers = static_cast<int64_t>(k_pool.size());
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "x must be a float32 [rows, hidden]");
  TORCH_CHECK(layers > 0 && static_cast<int64_t>(v_pool.size()) == layers &&
                  static_cast<int64_t>(groups.size()) == 2 * layers &&
                  static_cast<int64_t>(norms.size()) == 2 * layers &&
                  static_cast<int64_t>(qk_norms.size()) == 2 * layers,
              "groups, norms and qk_norms need two entries a layer, the pools one");
  TORCH_CHECK(biases.size() == weights.size(), "biases must pair with weights");
  int64_t expected = 0;
  for (int64_t l = 0; l < layers; ++l) {
    TORCH_CHECK((groups[2 * l] == 1 || groups[2 * l] == 3) &&
                    (groups[2 * l + 1] == 1 || groups[2 * l + 1] == 2),
                "layer ", l, ": q/k/v come from 1 or 3 linears, gate/up from 1 or 2");
    expected += groups[2 * l] + groups[2 * l + 1] + 2;
  }
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == expected, "expected ", expected,
              " linear weights for ", layers, " layers, got ", weights.size());
  for (int64_t l = 0; l < layers; ++l) {  // every layer's pool, before any is written
    check_float(k_pool[l], "k_pool", 3);
    check_float(v_pool[l], "v_pool", 3);
    TORCH_CHECK(k_pool[l].sizes() == k_pool[0].sizes() && v_pool[l].sizes() == k_pool[0].sizes(),
                "every layer's k_pool and v_pool must have one shape");
  }
  const int64_t rows = x.size(0);
  at::Tensor hidden = x.contiguous().clone();  // the residual stream, added to in place
  size_t at_weight = 0;
  auto next = [&](const at::Tensor& in) {
    const size_t i = at_weight++;
    return linear(in, weights[i], biases.get(i), packed);
  };
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t kv_heads = k_pool[l].size(1), dim = k_pool[l].size(2);
    at::Tensor h = rms_norm(hidden, norms[2 * l], eps);
    at::Tensor q, k, v;
    if (groups[2 * l] == 1) {
      at::Tensor qkv = next(h);
      const int64_t kv_width = kv_heads * dim, q_width = qkv.size(1) - 2 * kv_width;
      q = heads_of(qkv, 0, q_width, dim);
      k = heads_of(qkv, q_width, kv_width, dim);
      v = heads_of(qkv, q_width + kv_width, kv_width, dim);
    } else {
      at::Tensor qo = next(h), ko = next(h), vo = next(h);
      q = heads_of(qo, 0, qo.size(1), dim);
      k = heads_of(ko, 0, ko.size(1), dim);
      v = heads_of(vo, 0, vo.size(1), dim);
    }
    at::Tensor k_layer = k_pool[l], v_layer = v_pool[l];
    // The slot indexes are checked once, at the first layer (before its write): every layer's
    // pool has one shape (checked above) and reads the same slots.
    at::Tensor attended =
        rope_attend(q, k, v, k_layer, v_layer, write, read, lens, cos, sin, qk_norms.get(2 * l),
                    qk_norms.get(2 * l + 1), qk_eps, /*check_indexes=*/l == 0);
    hidden.add_(next(attended.view({rows, -1})));
    h = rms_norm(hidden, norms[2 * l + 1], eps);
    at::Tensor gate, up;
    if (groups[2 * l + 1] == 1) {
      at::Tensor gate_up = next(h);
      const int64_t width = gate_up.size(1) / 2;
      gate = gate_up.narrow(1, 0, width);
      up = gate_up.narrow(1, width, width);
    } else {
      gate = next(h);
      up = next(h);
    }
    hidden.add_(next(at::silu(gate).mul_(up)));
  }
  return hidden;
}

}  // namespace

TORCH_LIBRARY(areal_kernels, m) {
  m.def(
      "paged_decode(Tensor q, Tensor k_new, Tensor v_new, Tensor(a!) k_layer, Tensor(b!) v_layer,"
      " Tensor write, Tensor read, Tensor lens) -> Tensor");
  m.def(
      "paged_decode_rope(Tensor q, Tensor k_new, Tensor v_new, Tensor(a!) k_layer,"
      " Tensor(b!) v_layer, Tensor write, Tensor read, Tensor lens, Tensor cos, Tensor sin,"
      " Tensor? q_norm, Tensor? k_norm, float eps) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def(
      "decode_layers(Tensor x, Tensor[] weights, Tensor?[] biases, int[] groups, Tensor[] norms,"
      " Tensor?[] qk_norms, Tensor(a!)[] k_pool, Tensor(b!)[] v_pool, Tensor write, Tensor read,"
      " Tensor lens, Tensor cos, Tensor sin, float eps, float qk_eps, bool packed) -> Tensor");
}

TORCH_LIBRARY_IMPL(areal_kernels, CPU, m) {
  m.impl("paged_decode", &paged_decode);
  m.impl("paged_decode_rope", &paged_decode_rope);
  m.impl("rms_norm", &rms_norm);
  m.impl("decode_layers", &decode_layers);
}

// Packed weights are oneDNN tensors, which dispatch a call that takes them to this key.
TORCH_LIBRARY_IMPL(areal_kernels, MkldnnCPU, m) { m.impl("decode_layers", &decode_layers); }
