// The GEMM configuration table (src/gemm/cuda/configs.def), read on the host as every build does:
// the public names stay what callers and scripts type, each name spells its row (the build's
// static_asserts check the same; here the check itself is shown to reject a wrong name), and
// gemm_config_names() lists the table in a CPU-only library too.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gemm/cuda/configs.hpp"

namespace groupmm::cuda {
namespace {

std::string built_name(const sm90::KernelRow& r) {
  const sm90::ConfigName n = sm90::kernel_name(r);
  return std::string(n.text, n.size);
}

// The public names (GroupedGemmArgs::config, `bench gemm --config`, tests/cli, scripts): renaming
// one breaks callers, so a change here is a change of the public interface.
TEST(GemmConfigs, NamesAreThePublicOnes) {
  const std::set<std::string> expected = {
      "fwd_bf16_128x256_coop_c12",
      "fwd_fp16_128x256_coop_c12",
      "fwd_bf16_f32_128x256_coop_c12",
      "fwd_fp16_f32_128x256_coop_c12",
      "fwd_bf16_128x256_coop_c21",
      "fwd_bf16_128x128_pp_c12",
      "fwdswap_bf16_128x32_pp_c11",
      "fwdswap_fp16_128x32_pp_c11",
      "dgrad_bf16_128x256_coop_c11",
      "dgrad_fp16_128x256_coop_c11",
      "dgrad_bf16_f32_128x256_coop_c11",
      "dgrad_fp16_f32_128x256_coop_c11",
      "wgrad_bf16_f32_128x256_coop_c21",
      "wgrad_fp16_f32_128x256_coop_c21",
      "wgrad_bf16_bf16_128x256_coop_c21",
      "wgrad_fp16_fp16_128x256_coop_c21",
      "wgrad_bf16_bf16_128x128_pp_c21",
      "wgrad_bf16_bf16_128x192_coop_c21",
      "wgrad_bf16_f32_128x128_pp_c21",
      "fwd_e4m3_bf16_128x192_coop_c21",
      "fwd_e4m3_bf16_fast_128x256_coop_c12",
      "fwdswap_e4m3_bf16_128x32_pp_c11",
      "dgrad_e4m3_bf16_128x192_coop_c11",
      "dgrad_e5m2xe4m3_bf16_128x192_coop_c11",
      "wgrad_e4m3_f32_128x192_coop_c21",
      "wgrad_e5m2xe4m3_f32_128x192_coop_c21",
      "wgrad_e4m3_bf16_128x192_coop_c21",
      "wgrad_e5m2xe4m3_bf16_128x192_coop_c21",
      "fwd_e4m3_bf16_block_128x192_coop_c21",
      "dgrad_e4m3_bf16_block_128x192_coop_c11",
      "fwdswap_e4m3_bf16_block_128x32_pp_c11",
      "wgrad_e4m3_f32_block_128x128_coop_c12",
      "wgrad_e4m3_bf16_block_128x128_coop_c12",
      "fwd_bf16_alpha_128x256_coop_c12",
      "wgrad_bf16_bf16_split_pp128x128_coop128x256",
      "wgrad_bf16_f32_split_pp128x128_coop128x256",
  };
  const std::vector<std::string> names = gemm_config_names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected);
  EXPECT_EQ(names.size(), expected.size()) << "a name listed twice";
}

TEST(GemmConfigs, EveryNameSpellsItsRow) {
  for (const sm90::KernelRow& r : kKernelRows) EXPECT_EQ(built_name(r), r.name);
  for (const SplitRow& s : kSplitRows) {
    const sm90::ConfigName n = sm90::split_name(kernel_row(s.inside), kernel_row(s.outside));
    EXPECT_EQ(std::string(n.text, n.size), s.name);
    EXPECT_TRUE(sm90::same_kind(kernel_row(s.inside), kernel_row(s.outside))) << s.name;
  }
}

// The check the build runs on each row rejects a name that any spelled parameter contradicts.
TEST(GemmConfigs, NameCheckRejectsAWrongName) {
  const sm90::KernelRow good = kernel_row(GemmConfig::wgrad_e5m2xe4m3_f32_128x192_coop_c21);
  ASSERT_TRUE(sm90::name_matches(good));
  std::vector<sm90::KernelRow> bad(9, good);
  bad[0].role = sm90::Role::dgrad;
  bad[1].a = DType::fp8e4m3;
  bad[2].out = DType::bf16;
  bad[3].recipe = QuantRecipe::fp8_block;
  bad[4].tile_n = 128;
  bad[5].cluster_m = 1;
  bad[6].schedule = sm90::Schedule::pingpong;
  bad[7].fast_accum = true;
  bad[8].name = "wgrad_e5m2xe4m3_f32_128x192_coop_c21x";
  for (size_t i = 0; i < bad.size(); ++i)
    EXPECT_FALSE(sm90::name_matches(bad[i])) << "variant " << i << ": " << built_name(bad[i]);
}

TEST(GemmConfigs, FindByNameAndWhatEachComputes) {
  for (int i = 0; i < kConfigCount; ++i)
    EXPECT_EQ(find_config(config_name(GemmConfig(i))), GemmConfig(i));
  EXPECT_FALSE(find_config("fwd_bf16_1x1").has_value());
  EXPECT_FALSE(find_config("").has_value());
  const sm90::KernelRow& swap = kernel_row(GemmConfig::fwdswap_e4m3_bf16_block_128x32_pp_c11);
  EXPECT_EQ(sm90::pass_of(swap.role), GemmPass::forward);
  EXPECT_EQ(swap.recipe, QuantRecipe::fp8_block);
  EXPECT_EQ(sm90::scaling_of(kernel_row(GemmConfig::fwd_bf16_alpha_128x256_coop_c12).recipe),
            sm90::Scaling::per_expert);
  EXPECT_TRUE(is_split(GemmConfig::wgrad_bf16_f32_split_pp128x128_coop128x256));
  EXPECT_FALSE(is_split(GemmConfig::wgrad_bf16_f32_128x128_pp_c21));
}

}  // namespace
}  // namespace groupmm::cuda
