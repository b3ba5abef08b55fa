// One summation order for the grouped bias gradient (dbias.hpp): group_dbias on the GPU equals
// the CPU reference bit for bit, and equals the bias gradient of bgrad_group_quantize.
#include "common/quant_test_util.hpp"
#include "groupmm/dbias.hpp"

namespace groupmm::test {
namespace {

TEST(DbiasOrderGpu, GroupDbiasIsBitExactAndEqualsBgradQuantize) {
  GROUPMM_REQUIRE_GPU();
  Context cctx(Device::CPU), gctx(Device::CUDA);
  for (const Pattern pat :
       {Pattern::balanced, Pattern::zipf, Pattern::zero_first, Pattern::random_odd}) {
    for (const DType t : {DType::bf16, DType::fp16, DType::fp32}) {
      const int64_t G = 8, M = 3000, K = 256;
      std::vector<int64_t> s = make_splits(pat, G, M);
      const std::vector<float> values = rand_wide(static_cast<size_t>(M * K));
      Tensor hx = make_input(values, t, {M, K}, Device::CPU);
      Tensor dx = clone_to(hx, Device::CUDA);
      Tensor ds = clone_to(host_view(s, DType::int64, {G}), Device::CUDA);
      std::vector<float> ref(static_cast<size_t>(G * K));
      group_dbias(cctx, hx, host_view(s, DType::int64, {G}), host_view(ref, DType::fp32, {G, K}));
      Tensor db = Tensor::empty({G, K}, DType::fp32, Device::CUDA);
      Tensor db_q = Tensor::empty({G, K}, DType::fp32, Device::CUDA);
      fill_bytes(db, 0xFF);
      fill_bytes(db_q, 0xFF);
      group_dbias(gctx, dx, ds, db);
      run_quantize(gctx, dx, ds, qcfg(QuantRecipe::mxfp8), db_q);
      gctx.check();
      const std::vector<uint8_t> want(reinterpret_cast<const uint8_t*>(ref.data()),
                                      reinterpret_cast<const uint8_t*>(ref.data() + ref.size()));
      EXPECT_EQ(quant_bytes(db), want) << pattern_name(pat) << " " << dtype_name(t);
      EXPECT_EQ(quant_bytes(db_q), want) << pattern_name(pat) << " " << dtype_name(t);
    }
  }
}

}  // namespace
}  // namespace groupmm::test
