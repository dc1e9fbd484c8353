// Which node a daemon is (daemon/cli/node_layout.h): from flags, from the
// launcher's environment in a fixed order, refused when it makes no sense;
// and the comm backend that cannot serve a layout of several nodes.
#include "node_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error.h"

namespace zerod::cli {
namespace {

using ::testing::HasSubstr;
using Env = std::map<std::string, std::string>;

TEST(NodeLayout, OneNodeWithoutFlagsOrLauncher) {
  const NodeLayout n = detect_node_layout(-1, -1, Env{{"HOME", "/root"}});
  EXPECT_EQ(n.node, 0);
  EXPECT_EQ(n.nodes, 1);
}

TEST(NodeLayout, FlagsWinOverTheEnvironment) {
  const NodeLayout n = detect_node_layout(1, 3, Env{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_EQ(n.node, 1);
  EXPECT_EQ(n.nodes, 3);
  EXPECT_EQ(n.source, "--node-rank/--nnodes");
}

TEST(NodeLayout, LaunchersInOrderOpenMpiThenPmiThenSlurm) {
  const Env all = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"PMI_RANK", "3"},
                   {"PMI_SIZE", "4"},           {"SLURM_PROCID", "5"},        {"SLURM_STEP_NUM_TASKS", "6"}};
  NodeLayout n = detect_node_layout(-1, -1, all);
  EXPECT_EQ(n.node, 1);
  EXPECT_THAT(n.source, HasSubstr("mpirun (Open MPI)"));
  n = detect_node_layout(-1, -1, Env{{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"SLURM_PROCID", "5"},
                                     {"SLURM_STEP_NUM_TASKS", "6"}});
  EXPECT_EQ(n.node, 3);
  EXPECT_EQ(n.nodes, 4);
  n = detect_node_layout(-1, -1, Env{{"SLURM_PROCID", "5"}, {"SLURM_STEP_NUM_TASKS", "6"}});
  EXPECT_EQ(n.node, 5);
  EXPECT_EQ(n.nodes, 6);
  EXPECT_THAT(n.source, HasSubstr("srun (Slurm)"));
}

TEST(NodeLayout, NonsenseIsRefusedWithWhereItCameFrom) {
  try {
    detect_node_layout(-1, -1, Env{{"SLURM_PROCID", "4"}, {"SLURM_STEP_NUM_TASKS", "4"}});
    FAIL() << "node 4 of 4 was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("srun (Slurm)"));
    EXPECT_THAT(e.what(), HasSubstr("node 4 of 4"));
  }
  EXPECT_THROW(detect_node_layout(-1, -1, Env{{"PMI_RANK", "x"}, {"PMI_SIZE", "2"}}), Error);
  EXPECT_THROW(detect_node_layout(0, -1, Env{}), Error);
}

TEST(NodeLayout, RankCountsThatOverflowAreRefused) {
  const RankSpan r = rank_span(detect_node_layout(2, 3, Env{}), 4);
  EXPECT_EQ(r.world, 12);
  EXPECT_EQ(r.first, 8);
  try {
    rank_span(detect_node_layout(5, 1 << 20, Env{}), 4096);
    FAIL() << "2^32 ranks were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(e.what(), HasSubstr("1048576 nodes of 4096 ranks each"));
  }
}

TEST(NodeLayout, TheLocalBackendCannotSpanNodes) {
  const NodeLayout two{1, 2, "mpirun (Open MPI)"};
  const std::string why = layout_problem(two, "local", "job.lua");
  EXPECT_THAT(why, HasSubstr("node 1 of 2 (mpirun (Open MPI))"));
  EXPECT_THAT(why, HasSubstr("job.lua has comm.backend = \"local\""));
  EXPECT_THAT(why, HasSubstr("use comm = { backend = \"mpi\" }"));
  EXPECT_EQ(layout_problem(two, "mpi", "job.lua"), "");
  EXPECT_EQ(layout_problem(NodeLayout{}, "local", "job.lua"), "");
}

}  // namespace
}  // namespace zerod::cli
