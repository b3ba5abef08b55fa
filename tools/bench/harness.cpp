// The bench suites' harness (harness.hpp).
#include "bench/harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include <cublas_v2.h>

#include "groupmm/convert.hpp"
#include "groupmm/random.hpp"

namespace groupmm::tool {

void check_case_filter(const std::string& filter, const std::vector<std::string>& names,
                       const std::string& what) {
  if (std::any_of(names.begin(), names.end(),
                  [&](const std::string& n) { return case_matches(filter, n); }))
    return;
  std::string all;
  for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
  throw UsageError("--case '" + filter + "' matches no " + what + " (cases: " + all + ")");
}

std::vector<int64_t> bench_splits(const std::string& pattern, int64_t G, int64_t total,
                                  uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> w(static_cast<size_t>(G), 1.0);
  if (pattern == "zipf") {
    for (int64_t i = 0; i < G; ++i) w[size_t(i)] = 1.0 / std::pow(double(i + 1), 1.1);
    std::shuffle(w.begin(), w.end(), rng);
  } else if (pattern == "empty25") {
    std::vector<int64_t> idx(static_cast<size_t>(G));
    std::iota(idx.begin(), idx.end(), 0);
    std::shuffle(idx.begin(), idx.end(), rng);
    for (int64_t i = 0; i < G / 4; ++i) w[size_t(idx[size_t(i)])] = 0;
  }
  const double sum = std::accumulate(w.begin(), w.end(), 0.0);
  std::vector<int64_t> s(static_cast<size_t>(G));
  int64_t assigned = 0;
  for (int64_t i = 0; i < G; ++i) {
    s[size_t(i)] = int64_t(std::floor(w[size_t(i)] / sum * double(total)));
    assigned += s[size_t(i)];
  }
  for (int64_t i = 0; assigned < total; i = (i + 1) % G)
    if (w[size_t(i)] > 0) ++s[size_t(i)], ++assigned;
  return s;
}

std::vector<int64_t> align_splits16(std::vector<int64_t> s) {
  int64_t rest = 0;
  for (auto& v : s) rest += v % 16, v -= v % 16;
  for (auto& v : s)
    if (v > 0 || rest == 0) {
      v += rest;
      break;
    }
  return s;
}

namespace {

// A bf16 or fp32 view (any device) as host floats.
std::vector<float> host_floats(const TensorView& v) {
  std::vector<float> f(size_t(v.numel()));
  if (v.dtype == DType::fp32) {
    copy(TensorView(f.data(), DType::fp32, Device::CPU, {v.numel()}), v);
    return f;
  }
  GROUPMM_CHECK(v.dtype == DType::bf16, "bench: bf16 or fp32 views, got ", dtype_name(v.dtype));
  std::vector<uint16_t> h(f.size());
  copy(TensorView(h.data(), DType::bf16, Device::CPU, {v.numel()}), v);
  for (size_t i = 0; i < h.size(); ++i) f[i] = bf16_bits_to_float(h[i]);
  return f;
}

}  // namespace

double rel_err(const TensorView& a, const TensorView& b) {
  const std::vector<float> fa = host_floats(a), fb = host_floats(b);
  double num = 0, den = 0;
  const int64_t n = a.numel();
#pragma omp parallel for reduction(+ : num, den)
  for (int64_t i = 0; i < n; ++i) {
    const double x = fa[size_t(i)], y = fb[size_t(i)];
    if (!std::isfinite(x)) num += INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double calc_diff(const TensorView& x, const TensorView& y) {
  const std::vector<float> hx = host_floats(x), hy = host_floats(y);
  double xy = 0, xx = 0, yy = 0;
#pragma omp parallel for reduction(+ : xy, xx, yy)
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double a = hx[size_t(i)], b = hy[size_t(i)];
    xy += a * b;
    xx += a * a;
    yy += b * b;
  }
  return xx + yy == 0 ? 0 : 1 - 2 * xy / (xx + yy);
}

int Failures::summary() const {
  std::printf("%s: %d case(s) failed validation\n", count ? "FAIL" : "ok", count);
  std::fflush(stdout);
  return count ? 1 : 0;
}

int rotation_copies(int64_t input_bytes) {
  int dev = 0, l2 = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
  if (input_bytes <= 0) return 1;
  return int(std::min<int64_t>(
      16, std::max<int64_t>(1, (3 * int64_t(l2) + input_bytes - 1) / input_bytes)));
}

double copy_bandwidth_gbs(cudaStream_t stream) {
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  GROUPMM_CHECK_CUDA(cudaMalloc(&a, bytes));
  GROUPMM_CHECK_CUDA(cudaMalloc(&b, bytes));
  GROUPMM_CHECK_CUDA(cudaMemsetAsync(a, 1, bytes, stream));
  const double ms = median_ms(stream, 2, 10, [&](int) {
    GROUPMM_CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}

QuantRecipe training_recipe_of(const std::string& name) {
  if (name == "fp8_current") return QuantRecipe::fp8_current;
  if (name == "fp8_block") return QuantRecipe::fp8_block;
  GROUPMM_CHECK(name == "mxfp8", "training_recipe_of: '", name, "' is not a training recipe");
  return QuantRecipe::mxfp8;
}

double dense_gemm_ms(Context& ctx, GemmPass pass, int64_t M, int64_t N, int64_t K,
                     const DenseOperands& operands, void* out, DType out_t, int iters) {
  auto blas = static_cast<cublasHandle_t>(ctx.cublas_handle());
  const cudaDataType_t blas_out = out_t == DType::fp32 ? CUDA_R_32F : CUDA_R_16BF;
  const float one = 1, zero = 0;
  const int iM = int(M), iN = int(N), iK = int(K);
  const bool fwd = pass == GemmPass::forward, dgrad = pass == GemmPass::dgrad;
  // column-major cuBLAS on row-major operands, b first: forward TN (m=N, n=M, k=K); dgrad NN
  // (K, M, N); wgrad NT (K, N, M)
  const int m = fwd ? iN : iK, n = fwd || dgrad ? iM : iN, k = fwd ? iK : dgrad ? iN : iM;
  const int ldb = iK, lda = fwd ? iK : iN, ldc = fwd ? iN : iK;
  const cublasOperation_t ta = fwd ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = fwd || dgrad ? CUBLAS_OP_N : CUBLAS_OP_T;
  return median_ms(ctx.stream(), 2, iters, [&](int i) {
    const auto [a, b] = operands(i);
    GROUPMM_CHECK_CUBLAS(cublasGemmEx(blas, ta, tb, m, n, k, &one, b, CUDA_R_16BF, ldb, a,
                                      CUDA_R_16BF, lda, &zero, out, blas_out, ldc,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
}

double dense_gemm_ms(Context& ctx, GemmPass pass, int64_t M, int64_t N, int64_t K, int iters) {
  cudaStream_t s = ctx.stream();
  const bool fwd = pass == GemmPass::forward, dgrad = pass == GemmPass::dgrad;
  Tensor a = Tensor::empty({M, fwd ? K : N}, DType::bf16, Device::CUDA, s);
  Tensor b = Tensor::empty({fwd || dgrad ? N : M, K}, DType::bf16, Device::CUDA, s);
  Tensor out = Tensor::empty({fwd ? M : dgrad ? M : N, fwd ? N : K}, DType::bf16, Device::CUDA, s);
  fill_uniform(ctx, a, -1.0f, 1.0f, 1);
  fill_uniform(ctx, b, -1.0f, 1.0f, 2);
  return dense_gemm_ms(
      ctx, pass, M, N, K,
      [&](int) { return std::pair<const void*, const void*>(a.data(), b.data()); }, out.data(),
      DType::bf16, iters);
}

// ---- the table ---------------------------------------------------------------------------------

namespace {

std::string pad(const std::string& s, int width, bool left) {
  if (int(s.size()) >= width) return s;
  const std::string fill(size_t(width) - s.size(), ' ');
  return left ? s + fill : fill + s;
}

std::string number(const Column& c, const Cell& cell) {
  char buf[64];
  if (const auto* i = std::get_if<int64_t>(&cell)) {
    std::snprintf(buf, sizeof buf, "%lld", (long long)*i);
  } else {
    const double v = std::get<double>(cell);
    const char fmt[] = {'%', '.', '*', c.kind == 's' || c.kind == 'd' ? 'f' : c.kind, '\0'};
    std::snprintf(buf, sizeof buf, fmt, c.precision, v);
  }
  return buf;
}

}  // namespace

void Table::print_header() const {
  std::string line = indent_;
  for (size_t i = 0; i < cols_.size(); ++i)
    line += (i ? cols_[i].sep : "") + pad(cols_[i].head, cols_[i].width, cols_[i].left);
  std::printf("%s\n", line.c_str());
}

std::string Table::row(const std::vector<Cell>& cells, const std::string& tail) const {
  GROUPMM_CHECK(cells.size() == cols_.size(), "Table: ", cells.size(), " cells for ", cols_.size(),
                " columns");
  std::string line = indent_;
  for (size_t i = 0; i < cols_.size(); ++i) {
    const Column& c = cols_[i];
    const auto* text = std::get_if<std::string>(&cells[i]);
    const std::string s =
        text ? pad(*text, c.width, c.left)
             : pad(number(c, cells[i]), c.width - int(c.unit.size()), false) + c.unit;
    line += (i ? c.sep : "") + s;
  }
  return line + tail;
}

void Table::print_row(const std::vector<Cell>& cells, const std::string& tail) const {
  std::printf("%s\n", row(cells, tail).c_str());
  std::fflush(stdout);
}

// ---- --json ------------------------------------------------------------------------------------

namespace {

std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') q += '\\';
    q += ch;
  }
  return q + "\"";
}

}  // namespace

JsonRecord& JsonRecord::raw(const std::string& key, const std::string& json) {
  body_ += (body_.empty() ? "" : ", ") + quoted(key) + ": " + json;
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, const std::string& v) {
  return raw(key, quoted(v));
}

JsonRecord& JsonRecord::add(const std::string& key, double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return raw(key, std::isfinite(v) ? buf : "null");
}

JsonRecord& JsonRecord::add(const std::string& key, int64_t v) {
  return raw(key, std::to_string(v));
}

JsonRecord& JsonRecord::add(const std::string& key, bool v) {
  return raw(key, v ? "true" : "false");
}

JsonRecord& JsonRecord::add(const std::string& key, const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return raw(key, s + "]");
}

JsonRecord& JsonRecord::add(const std::string& key, const JsonRecord& v) {
  return raw(key, v.str());
}

JsonFile::JsonFile(std::string path) : path_(std::move(path)) {
  if (on()) f_ = open_json(path_);  // a wrong path fails before any work
}

void JsonFile::write(const JsonRecord& head, const JsonRecord& tail, bool announce) {
  if (!on()) return;
  f_ << "{" << head.str().substr(1, head.str().size() - 2) << (head.empty() ? "" : ", ")
     << "\"cases\": [";
  for (size_t i = 0; i < cases_.size(); ++i) f_ << (i ? ",\n  " : "\n  ") << cases_[i];
  f_ << "\n]" << (tail.empty() ? "" : ", ") << tail.str().substr(1, tail.str().size() - 2) << "}\n";
  close_json(f_, path_);
  if (announce) std::printf("wrote %s\n", path_.c_str());
}

}  // namespace groupmm::tool
