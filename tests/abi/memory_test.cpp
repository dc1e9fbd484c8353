// Per-tier byte accounting and budgets.
#include "abi_fixture.h"

using namespace zerod_test;

class MemoryTest : public AbiTest {
 protected:
  static zd_memory_figures figures(zd_model* m, zd_mem_kind kind) {
    zd_memory_figures f = ZD_MEMORY_FIGURES_INIT;
    EXPECT_EQ(zd_model_memory(m, -1, ZD_TIER_DEVICE, kind, &f), ZD_OK) << last();
    return f;
  }
};

TEST_F(MemoryTest, EveryKindIsCountedExactly) {
  // 1000 + 24 elements: each parameter starts 64-byte aligned, so the group
  // holds 1024 + 32 elements.
  zd_model* m = model("return { optimizer = { type = 'adamw' } }");
  add(m, "a", "l1", {1000});
  add(m, "b", "l2", {24});
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  const uint64_t elems = 1024 + 32;
  EXPECT_EQ(figures(m, ZD_MEM_PARAMS).current, elems * 4);
  EXPECT_EQ(figures(m, ZD_MEM_GRADS).current, elems * 4);
  EXPECT_EQ(figures(m, ZD_MEM_MASTER).current, elems * 4);
  EXPECT_EQ(figures(m, ZD_MEM_OPTIMIZER).current, elems * 8);  // exp_avg, exp_avg_sq
  EXPECT_EQ(figures(m, ZD_MEM_BUFFERS).current, 0u);
  EXPECT_EQ(figures(m, ZD_MEM_ALL).current, elems * 20);
  EXPECT_EQ(figures(m, ZD_MEM_ALL).budget, UINT64_MAX);
  zd_memory_figures f = ZD_MEMORY_FIGURES_INIT;
  ASSERT_EQ(zd_model_memory(m, -1, ZD_TIER_HOST, ZD_MEM_ALL, &f), ZD_OK);
  EXPECT_EQ(f.current, 0u);
  EXPECT_EQ(zd_model_memory(m, 3, ZD_TIER_DEVICE, ZD_MEM_ALL, &f), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zd_model_memory(m, -1, 7, ZD_MEM_ALL, &f), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zd_model_memory(m, -1, ZD_TIER_DEVICE, 9, &f), ZD_ERR_INVALID_ARGUMENT);
  zd_model_destroy(m);
}

TEST_F(MemoryTest, SixteenBitWorkingCopiesAndGradientsTakeTwoBytes) {
  zd_model* m = model("return { precision = 'bf16', optimizer = { type = 'adam' } }");
  add(m, "w", "l", {4096}, {}, ZD_DTYPE_BF16);
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  // DESIGN.md section 4: 2 + 2 + 12 bytes per parameter at stage 0.
  EXPECT_EQ(figures(m, ZD_MEM_PARAMS).current, 4096u * 2);
  EXPECT_EQ(figures(m, ZD_MEM_GRADS).current, 4096u * 2);
  EXPECT_EQ(figures(m, ZD_MEM_MASTER).current + figures(m, ZD_MEM_OPTIMIZER).current, 4096u * 12);
  zd_model_destroy(m);
}

TEST_F(MemoryTest, TransientGradientBuffersAreCountedAndReturned) {
  zd_model* m = model("return { optimizer = { type = 'sgd' }, gradient_accumulation_steps = 2 }");
  const zd_param_id p = add(m, "w", "l", {256});
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  const zd_module_id mod = module_id(m, "l");
  micro_step(m, mod, p, std::vector<float>(256, 1.0f));
  // The second micro-batch cannot write into the accumulator directly.
  ASSERT_EQ(zd_backward_begin(m, mod), ZD_OK);
  EXPECT_EQ(figures(m, ZD_MEM_BUFFERS).current, 256u * 4);
  ASSERT_EQ(zd_backward_end(m, mod), ZD_OK);
  EXPECT_EQ(figures(m, ZD_MEM_BUFFERS).current, 0u);
  EXPECT_EQ(figures(m, ZD_MEM_BUFFERS).peak, 256u * 4);
  zd_model_destroy(m);
}

TEST_F(MemoryTest, AModelOverItsDeviceBudgetIsRefusedWithATable) {
  zd_model* m = model("return { optimizer = { type = 'adamw' }, budgets = { device = '64KiB' } }");
  add(m, "big", "l", {4096});  // 4096 * 20 B = 80 KiB
  EXPECT_EQ(zd_model_finalize(m), ZD_ERR_BUDGET);
  const std::string e = zd_model_last_error(m);
  EXPECT_NE(e.find("does not fit"), std::string::npos) << e;
  EXPECT_NE(e.find("device"), std::string::npos) << e;
  EXPECT_NE(e.find("80.00 KiB"), std::string::npos) << e;
  EXPECT_NE(e.find("64.00 KiB"), std::string::npos) << e;
  EXPECT_NE(e.find("over budget"), std::string::npos) << e;
  // Nothing was allocated.
  EXPECT_EQ(figures(m, ZD_MEM_ALL).current, 0u);
  zd_model_destroy(m);
}

TEST_F(MemoryTest, TheBudgetAlsoBoundsTransientBuffers) {
  // The state fits (20 B x 1024 = 20 KiB), the transient view of a second
  // micro-batch does not.
  zd_model* m = model(
      "return { optimizer = { type = 'adamw' }, gradient_accumulation_steps = 2,"
      " budgets = { device = 20480 + 1000 } }");
  const zd_param_id p = add(m, "w", "l", {1024});
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  const zd_module_id mod = module_id(m, "l");
  micro_step(m, mod, p, std::vector<float>(1024, 1.0f));
  EXPECT_EQ(zd_backward_begin(m, mod), ZD_ERR_BUDGET);
  EXPECT_NE(last().find("gradient view of parameter 'w'"), std::string::npos) << last();
  // Refused cleanly: the module did not begin.
  EXPECT_EQ(zd_backward_end(m, mod), ZD_ERR_INVALID_STATE);
  zd_model_destroy(m);
}

TEST_F(MemoryTest, ABackwardEndRefusedForBudgetStillEndsTheModule) {
  // Stage 2 with a bucket of one element: the backward's end sends the
  // bucket, whose 4 KiB the budget (state 12 KiB, the gradient view 4 KiB)
  // refuses. The engine ends the module all the same (the gradients stay
  // pending for the next zd_step), so its views are gone in both modes:
  // through the daemon they used to be kept by the client and handed out
  // over released blocks.
  zd_model* m = model(
      "return { optimizer = { type = 'sgd' }, zero = { stage = 2, reduce_bucket_size = 1 },"
      " budgets = { device = 16384 + 600 } }");
  const zd_param_id p = add(m, "w", "l", {1024});
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  const zd_module_id mod = module_id(m, "l");
  ASSERT_EQ(zd_forward_begin(m, mod), ZD_OK) << last();
  ASSERT_EQ(zd_forward_end(m, mod), ZD_OK) << last();
  ASSERT_EQ(zd_backward_begin(m, mod), ZD_OK) << last();
  zd_view v = ZD_VIEW_INIT;
  ASSERT_EQ(zd_grad_view(m, p, &v), ZD_OK) << last();
  EXPECT_EQ(zd_backward_end(m, mod), ZD_ERR_BUDGET);
  EXPECT_NE(last().find("a gradient bucket needs 4.00 KiB"), std::string::npos) << last();
  EXPECT_EQ(zd_grad_view(m, p, &v), ZD_ERR_INVALID_STATE) << "a view of an ended backward";
  EXPECT_NE(last().find("has no gradient buffer now"), std::string::npos) << last();
  EXPECT_EQ(zd_param_view(m, p, &v), ZD_ERR_INVALID_STATE) << "a view of an ended backward";
  EXPECT_EQ(zd_model_set_stream(m, nullptr), ZD_OK) << last();
  EXPECT_EQ(zd_backward_end(m, mod), ZD_ERR_INVALID_STATE);
  zd_model_destroy(m);
}
