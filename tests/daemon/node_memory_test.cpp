// The node's host memory under `zerod serve --jobs` (daemon/server/node_memory.h):
// a model is admitted whole on the node or not at all. Each of a model's
// ranks reaches the gate at finalize on its own thread; charged one by one,
// two 4-rank jobs started at once beside room for one got two ranks each
// in, the others refused, and both failed while the admitted ranks held
// their memory. Here the ranks' calls are made by hand, in the order that
// broke it, and then from threads racing as the sessions' do.
#include "node_memory.h"

#include "error.h"

#include <gtest/gtest.h>
#include <zerod/kit/text.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace zerod;

namespace {

constexpr uint64_t kRankBytes = 1000;  // what every rank here plans to hold in host RAM

// Every local rank's need, as Model::local_needs gives it: `ranks` ranks from 0.
std::map<int, TierBytes> needs_of(int ranks, uint64_t host = kRankBytes, uint64_t device = 0) {
  std::map<int, TierBytes> needs;
  for (int r = 0; r < ranks; ++r) {
    needs[r][ZD_TIER_HOST] = host;
    needs[r][ZD_TIER_DEVICE] = device;
  }
  return needs;
}

// The rank's admission: "" when admitted, else the refusal's status and message.
std::string admit(MemoryAdmission& gate, int rank, const std::map<int, TierBytes>& needs) {
  try {
    gate.admit(rank, needs);
    return "";
  } catch (const Error& e) {
    return std::string(status_name(e.code())) + ": " + e.what();
  }
}

}  // namespace

TEST(NodeMemory, TwoModelsStartedAtOnceBesideRoomForOneAdmitOneWholeAndRefuseTheOther) {
  auto node = std::make_shared<server::NodeMemory>(2 * kRankBytes);
  auto a = node->for_model("job A", 0, false);
  auto b = node->for_model("job B", 1, false);
  const auto needs = needs_of(2);
  // The interleaving that charged A's rank 0 and B's rank 0 and refused both rank 1s.
  EXPECT_EQ(admit(*a, 0, needs), "");
  const std::string b0 = admit(*b, 0, needs);
  EXPECT_EQ(admit(*a, 1, needs), "") << "job A's rank 1 was refused: the node has room for job A whole";
  const std::string b1 = admit(*b, 1, needs);
  EXPECT_EQ(b0.rfind("ZD_ERR_BUDGET: job B: the model state of its ranks 0,1 on this node needs", 0), 0u) << b0;
  EXPECT_NE(b0.find("(2000 bytes) of the node's host memory together (a model is admitted whole or not at all)"),
            std::string::npos)
      << b0;
  EXPECT_NE(b0.find("job A, model 0: ranks 0,1, "), std::string::npos) << "the refusal names who holds it: " << b0;
  EXPECT_EQ(b1, b0) << "job B's rank 1 did not share its rank 0's refusal";
  EXPECT_EQ(node->held(), 2 * kRankBytes);
  EXPECT_EQ(node->holders(), "  job A, model 0: ranks 0,1, " + format_bytes(2 * kRankBytes) + "\n");

  // Job A ends (~Model releases every rank): the charge is the model's,
  // held until its last rank lets go.
  a->release(0);
  EXPECT_EQ(node->held(), 2 * kRankBytes) << "job A's charge went while its rank 1 still holds its state";
  a->release(1);
  EXPECT_EQ(node->held(), 0u);
  EXPECT_EQ(node->holders(), "");
  b->release(0);  // job B's ranks' failed finalizes: they held nothing
  b->release(1);
  EXPECT_EQ(node->held(), 0u);

  // Job B's ranks retry their finalize: told before, they ask afresh and now fit.
  EXPECT_EQ(admit(*b, 1, needs), "");
  EXPECT_EQ(admit(*b, 0, needs), "");
  EXPECT_EQ(node->holders(), "  job B, model 1: ranks 0,1, " + format_bytes(2 * kRankBytes) + "\n");
  b->release(0);
  b->release(1);
  EXPECT_EQ(node->held(), 0u);
}

TEST(NodeMemory, AChargeLastsWhileARankHoldsItAndIsNeverTakenTwice) {
  auto node = std::make_shared<server::NodeMemory>(2 * kRankBytes);
  auto a = node->for_model("job A", 0, false);
  const auto needs = needs_of(2);
  EXPECT_EQ(admit(*a, 0, needs), "");
  a->release(0);  // its allocation failed: its rank 1 has not come yet
  EXPECT_EQ(node->held(), 0u) << "no rank holds the charge";
  EXPECT_EQ(admit(*a, 1, needs), "");
  EXPECT_EQ(admit(*a, 0, needs), "") << "rank 0's retry";
  EXPECT_EQ(node->held(), 2 * kRankBytes) << "charged twice, or not at all";
  a.reset();  // a gate that goes holding a charge gives it back
  EXPECT_EQ(node->held(), 0u);
}

TEST(NodeMemory, ARankThatFailedBeforeAdmissionDoesNotTakeARefusalMeantForAnEarlierTry) {
  auto node = std::make_shared<server::NodeMemory>(3 * kRankBytes);
  auto other = node->for_model("job B", 1, false);
  EXPECT_EQ(admit(*other, 0, needs_of(1, 2 * kRankBytes)), "");
  auto a = node->for_model("job A", 0, false);
  const auto needs = needs_of(2);
  EXPECT_NE(admit(*a, 0, needs), "");
  a->release(0);
  a->release(1);  // failed before it came (its tiers could not be set up)
  other->release(0);  // job B ends
  // Both retry their finalize: the first to come asks afresh.
  EXPECT_EQ(admit(*a, 1, needs), "") << "rank 1 took the refusal of the try it never reached";
  EXPECT_EQ(admit(*a, 0, needs), "");
  EXPECT_EQ(node->held(), 2 * kRankBytes);
}

TEST(NodeMemory, TheDeviceTierIsChargedWhereItIsHostMemory) {
  auto node = std::make_shared<server::NodeMemory>(10 * kRankBytes);
  auto cpu = node->for_model("job A", 0, true);
  auto gpu = node->for_model("job B", 1, false);
  EXPECT_EQ(admit(*cpu, 0, needs_of(1, kRankBytes, 2 * kRankBytes)), "");
  EXPECT_EQ(node->held(), 3 * kRankBytes);
  EXPECT_EQ(admit(*gpu, 0, needs_of(1, kRankBytes, 2 * kRankBytes)), "");
  EXPECT_EQ(node->held(), 4 * kRankBytes);
  // One rank's refusal says whose need it is, ranks of many name a range.
  auto many = node->for_model("job C", 2, false);
  const std::string refused = admit(*many, 0, needs_of(8));
  EXPECT_NE(refused.find("job C: the model state of its ranks 0-7 on this node needs"), std::string::npos) << refused;
  auto one = node->for_model("job D", 3, false);
  const std::string alone = admit(*one, 0, needs_of(1, 7 * kRankBytes));
  EXPECT_NE(alone.find("job D: rank 0's model state needs"), std::string::npos) << alone;
  cpu->release(0);
  gpu->release(0);
  EXPECT_EQ(node->held(), 0u);
}

// The sessions' threads race to the gate: whatever the order, one model
// is in with all of its ranks and the other with none.
TEST(NodeMemory, RacingRanksOfTwoModelsNeverSplitEither) {
  constexpr int kRanks = 4;
  const auto needs = needs_of(kRanks);
  for (int round = 0; round < 200; ++round) {
    auto node = std::make_shared<server::NodeMemory>(kRanks * kRankBytes);
    std::vector<std::shared_ptr<MemoryAdmission>> gates{node->for_model("job A", 0, false),
                                                        node->for_model("job B", 1, false)};
    std::atomic<bool> go{false};
    std::vector<std::string> got(2 * kRanks);
    std::vector<std::thread> ranks;
    for (int i = 0; i < 2 * kRanks; ++i)
      ranks.emplace_back([&, i] {
        while (!go.load()) std::this_thread::yield();
        got[static_cast<size_t>(i)] = admit(*gates[static_cast<size_t>(i % 2)], i / 2, needs);
      });
    go.store(true);
    for (auto& t : ranks) t.join();
    int admitted[2] = {0, 0};
    for (int i = 0; i < 2 * kRanks; ++i) admitted[i % 2] += got[static_cast<size_t>(i)].empty() ? 1 : 0;
    ASSERT_TRUE((admitted[0] == kRanks && admitted[1] == 0) || (admitted[0] == 0 && admitted[1] == kRanks))
        << "round " << round << ": job A got " << admitted[0] << " ranks in, job B " << admitted[1];
    ASSERT_EQ(node->held(), kRanks * kRankBytes);
    for (auto& gate : gates)
      for (int r = 0; r < kRanks; ++r) gate->release(r);
    ASSERT_EQ(node->held(), 0u);
  }
}

// `zerod status` writes each model's charge as what it is, the planned
// state, and beside it the most its ranks held (short-lived buffers
// included), which the daemon reads from their ledgers.
TEST(NodeMemory, StatusLinesSayThePlanAndThePeak) {
  auto node = std::make_shared<server::NodeMemory>(4 * kRankBytes);
  auto a = node->for_model("job A", 0, false);
  ASSERT_EQ(admit(*a, 0, needs_of(1)), "");
  EXPECT_EQ(node->holders({{0, 3 * kRankBytes}}),
            "  job A, model 0: rank 0, " + format_bytes(kRankBytes) + " planned, peak " + format_bytes(3 * kRankBytes) +
                "\n");
  EXPECT_EQ(node->holders(std::map<int, uint64_t>{}),
            "  job A, model 0: rank 0, " + format_bytes(kRankBytes) + " planned\n")
      << "a model whose ledgers the daemon cannot read";
  EXPECT_EQ(node->holders(), "  job A, model 0: rank 0, " + format_bytes(kRankBytes) + "\n") << "as a refusal names it";
  a->release(0);
}
