// What the mpi plugin tests share. Each test program runs once per "node"
// under mpirun (one MPI process per daemon, as zerod is deployed): the
// process loads zd_comm_mpi.so as the engine does, creates instances with
// its node's rank layout, and runs its ranks as threads. The plugin
// initialises MPI itself; the test reads its node from mpirun's
// environment, as a daemon would. Inputs are drawn from seeds of the global
// rank, so every process can compute every rank's inputs and the reference.
#ifndef ZEROD_TESTS_COMM_MPI_TEST_UTIL_H
#define ZEROD_TESTS_COMM_MPI_TEST_UTIL_H

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm_test_util.h"

namespace zerod::comm::test {

// This process's node and the number of nodes, from ZEROD_MPI_JOIN or the
// launcher's environment (Open MPI, then PMI); 0 of 1 when started alone.
struct NodeEnv {
  int node = 0;
  int nodes = 1;
};

inline NodeEnv node_env() {
  NodeEnv e;
  // Daemons joined from mpiruns of their own (join.h): <name>,<node>,<nodes>[,...].
  if (const char* join = std::getenv("ZEROD_MPI_JOIN")) {
    if (std::sscanf(join, "%*[^,],%d,%d", &e.node, &e.nodes) == 2) return e;
  }
  for (const auto& [rank, size] : {std::pair{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                   std::pair{"PMI_RANK", "PMI_SIZE"}}) {
    const char* r = std::getenv(rank);
    const char* s = std::getenv(size);
    if (r != nullptr && s != nullptr) {
      e.node = std::atoi(r);
      e.nodes = std::atoi(s);
      break;
    }
  }
  return e;
}

inline const zd_comm_v2* mpi_plugin(std::string* error = nullptr) {
  static std::string why;
  static const auto* d = reinterpret_cast<const zd_comm_v2*>(comm_descriptor("zd_comm_mpi.so", 2, &why));
  if (error != nullptr) *error = why;
  return d;
}

// The hyperparameters in spec order: timeout (s), spin_us, segment (bytes).
struct MpiValues {
  double timeout_s = 60;
  double spin_us = 20;
  double segment = 1 << 20;
};

// An instance for this node with `local` ranks per node (every node the
// same), destroyed at scope end.
class MpiComm {
 public:
  explicit MpiComm(int local, MpiValues v = {}) : MpiComm(local, v, node_env()) {}
  MpiComm(int local, MpiValues v, NodeEnv env) : d_(mpi_plugin()), env_(env), local_(local) {
    if (d_ == nullptr) {
      ADD_FAILURE() << "the mpi plugin is not loaded";
      return;
    }
    const zd_comm_config cfg = config_of(env.nodes * local, env.node * local, local);
    create_status_ = create(cfg, v, &create_error_);
    EXPECT_EQ(create_status_, ZD_OK) << create_error_;
  }
  ~MpiComm() {
    if (d_ != nullptr && inst_ != nullptr) d_->destroy(inst_);
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  const zd_comm_v2& d() const { return *d_; }
  void* inst() const { return inst_; }
  bool ok() const { return inst_ != nullptr; }
  int node() const { return env_.node; }
  int nodes() const { return env_.nodes; }
  int local() const { return local_; }
  int world() const { return env_.nodes * local_; }
  int first() const { return env_.node * local_; }
  std::string error(int rank) const { return d_->last_error(inst_, rank); }
  zd_comm_figures figures(int rank) const {
    zd_comm_figures f = ZD_COMM_FIGURES_INIT;
    d_->figures(inst_, rank, &f);
    return f;
  }

  // Runs fn(global rank) on one thread per rank of this node.
  void on_my_ranks(const std::function<void(int)>& fn) const {
    on_ranks(local_, [&](int i) { fn(first() + i); });
  }

 private:
  zd_status create(const zd_comm_config& cfg, const MpiValues& v, std::string* err) {
    char buf[1024] = "";
    const double values[] = {v.timeout_s, v.spin_us, v.segment};
    const zd_status st = d_->create(nullptr, values, 3, &cfg, &inst_, buf, sizeof buf);
    *err = buf;
    return st;
  }

  const zd_comm_v2* d_;
  NodeEnv env_;
  int local_;
  void* inst_ = nullptr;
  zd_status create_status_ = ZD_ERR_INTERNAL;
  std::string create_error_;
};

// Calls with a limit, so that a test that goes wrong fails instead of
// hanging the others.
inline zd_comm_call mpi_call(int rank, uint64_t tag = 0, const char* what = "test", uint32_t timeout_ms = 60000) {
  return call_for(rank, tag, what, timeout_ms);
}

// The reduction the mpi plugin computes: each node's ranks in order (16-bit
// in fp32, the partial rounded to the dtype), then the nodes' partials in
// node order. A group of one is its member's bits.
inline void hierarchical_reduce(zd_reduce_op op, const std::vector<const Buffer*>& ranks, int local, size_t offset,
                                size_t count, Buffer* dst, size_t dst_offset) {
  const zd_comm_dtype dt = ranks[0]->dtype;
  const int nodes = static_cast<int>(ranks.size()) / local;
  if (count == 0) return;
  std::vector<Buffer> partial(static_cast<size_t>(nodes), Buffer(dt, count));
  for (int m = 0; m < nodes; ++m) {
    std::vector<const Buffer*> group(ranks.begin() + m * local, ranks.begin() + (m + 1) * local);
    if (local == 1) std::memcpy(partial[m].data(), group[0]->bytes.data() + offset * size_of(dt), count * size_of(dt));
    else reference_reduce(op, group, offset, count, &partial[m], 0);
  }
  std::vector<const Buffer*> parts;
  for (const auto& p : partial) parts.push_back(&p);
  if (nodes == 1) std::memcpy(dst->at(dst_offset), partial[0].data(), count * size_of(dt));
  else reference_reduce(op, parts, 0, count, dst, dst_offset);
}

inline uint64_t seed_of(int rank, size_t count, int salt) {
  return (static_cast<uint64_t>(rank) << 40) ^ (static_cast<uint64_t>(count) << 8) ^ static_cast<uint64_t>(salt);
}

}  // namespace zerod::comm::test

#endif  // ZEROD_TESTS_COMM_MPI_TEST_UTIL_H
