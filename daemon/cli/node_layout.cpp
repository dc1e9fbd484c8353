#include "node_layout.h"

#include "error.h"

#include <cstdint>
#include <cstdlib>

extern char** environ;

namespace zerod::cli {

namespace {

// A non-negative integer, or -1.
int number(const std::map<std::string, std::string>& env, const char* key) {
  auto it = env.find(key);
  if (it == env.end() || it->second.empty()) return -1;
  char* end = nullptr;
  const long v = std::strtol(it->second.c_str(), &end, 10);
  if (*end || v < 0 || v > 1 << 20)
    fail(ZD_ERR_INVALID_ARGUMENT, std::string(key) + "=" + it->second + " is not a rank number");
  return static_cast<int>(v);
}

NodeLayout checked(int node, int nodes, std::string source) {
  if (nodes < 1 || node < 0 || node >= nodes)
    fail(ZD_ERR_INVALID_ARGUMENT, source + " says this is node " + std::to_string(node) + " of " +
                                      std::to_string(nodes) + "; it must be 0.." + std::to_string(nodes - 1));
  return NodeLayout{node, nodes, std::move(source)};
}

}  // namespace

RankSpan rank_span(const NodeLayout& node, int nproc) {
  RankSpan r;
  if (__builtin_mul_overflow(node.nodes, nproc, &r.world) || __builtin_mul_overflow(node.node, nproc, &r.first))
    fail(ZD_ERR_INVALID_ARGUMENT, std::to_string(node.nodes) + " nodes of " + std::to_string(nproc) +
                                      " ranks each (" + node.source + ", --nproc) are more ranks than zerod counts (" +
                                      std::to_string(INT32_MAX) + ")");
  return r;
}

NodeLayout detect_node_layout(int flag_node, int flag_nodes, const std::map<std::string, std::string>& env) {
  if (flag_node >= 0 || flag_nodes >= 0) {
    if (flag_node < 0 || flag_nodes < 0)
      fail(ZD_ERR_INVALID_ARGUMENT, "--node-rank and --nnodes go together");
    return checked(flag_node, flag_nodes, "--node-rank/--nnodes");
  }
  const struct {
    const char* rank;
    const char* size;
    const char* who;
  } launchers[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun (Open MPI)"},
      {"PMI_RANK", "PMI_SIZE", "the MPI launcher (PMI)"},
      {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "srun (Slurm)"},
  };
  for (const auto& l : launchers) {
    const int r = number(env, l.rank), n = number(env, l.size);
    if (r >= 0 && n >= 0)
      return checked(r, n, std::string(l.who) + " (" + l.rank + "=" + std::to_string(r) + ", " + l.size + "=" +
                               std::to_string(n) + ")");
  }
  return NodeLayout{};
}

std::map<std::string, std::string> process_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::string layout_problem(const NodeLayout& node, const std::string& comm_backend, const std::string& job_path) {
  if (node.nodes < 2 || comm_backend != "local") return "";
  return "this daemon is node " + std::to_string(node.node) + " of " + std::to_string(node.nodes) + " (" +
         node.source + "), but " + job_path +
         " has comm.backend = \"local\", which runs the collectives of one daemon's ranks; for a job across "
         "daemons (nodes) use comm = { backend = \"mpi\" }";
}

}  // namespace zerod::cli
