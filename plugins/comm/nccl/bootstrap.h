// How the nccl plugin's daemons find each other without MPI: a small TCP
// exchange. Daemons of one job may come from different launchers (one
// `zerod run --nnodes K --node-rank k` per node, torchrun, Slurm), so there
// is no MPI to pass NCCL's unique id around. Node 0 (the root) listens on a
// host:port every daemon knows (the job's comm.port, ZEROD_NCCL_ROOT,
// MASTER_ADDR/MASTER_PORT: resolve_root below); the others connect, with
// retries until the timeout, and say who they are (Hello); when every node
// has come, the root answers each with the id and every node's host and pid
// (Welcome). The root checks that every daemon has the same rank layout and
// is creating the same instance (its `generation`, the count of instances
// this process made: every daemon makes its instances in the same order).
//
// The connections stay open after the exchange: they carry the failure
// notices (Notices, below). A daemon that dies closes its socket, so the
// root learns which node went, and tells the others.
//
// Nothing here needs CUDA or NCCL: the id is an opaque blob (ncclUniqueId is
// 128 bytes), so the tests run the exchange between processes on any CPU.
// Input on the port that is not a daemon of this job (wrong magic, a short
// or slow hello, garbage) is dropped without failing the root. A daemon of
// another bootstrap version (another zerod build) is answered with a
// refusal that says so, in the welcome's head that every version reads, and
// the root fails the job with it (ZD_ERR_VERSION). A second hello for a
// node whose first connection has closed (its daemon restarted during the
// exchange) takes that node's place; one while the first is open is two
// daemons with one --node-rank, and fails the job.
#ifndef ZEROD_COMM_NCCL_BOOTSTRAP_H
#define ZEROD_COMM_NCCL_BOOTSTRAP_H

#include <zerod/zerod.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace zerod::comm::nccl {

constexpr size_t kIdBytes = 128;  // sizeof(ncclUniqueId)
constexpr size_t kHostMax = 64;
using UniqueId = std::array<uint8_t, kIdBytes>;

// Where the root listens, and which setting said so (for messages).
struct RootAddress {
  std::string host;  // what the others connect to
  int port = 0;
  std::string source;  // e.g. "ZEROD_NCCL_ROOT=a:29502", "MASTER_ADDR=a, MASTER_PORT=29500 + 2"
};

// The root's address from, in order: ZEROD_NCCL_ROOT=host:port; else
// MASTER_ADDR with the job's comm.port (`port`, when > 0) or MASTER_PORT + 2
// (torchrun's rendezvous and the trainers' own process group keep
// MASTER_PORT and often MASTER_PORT + 1). `getenv` is the environment (a
// test passes its own). ZD_ERR_CONFIG, naming every key, when none is set
// or a value is not a host and port.
zd_status resolve_root(int port, const std::function<const char*(const char*)>& getenv, RootAddress* out,
                       char* err, size_t err_size);

struct PeerInfo {
  std::string host;
  int64_t pid = 0;
};

struct BootstrapRequest {
  RootAddress root;
  int node = 0;   // this daemon: 0 is the root
  int nodes = 1;
  int world = 1;  // the job's ranks, and each daemon's: checked equal on every node
  int local = 1;
  uint64_t generation = 0;
  double timeout_s = 300;  // 0 = no limit
  UniqueId id{};           // the root's id, handed to every node
  std::string host;        // this daemon's host name and pid, for the others' messages
  int64_t pid = 0;
  // The root logs each connection it drops (hostile or stale input), for
  // an operator who wonders why the port saw traffic. May be empty.
  std::function<void(const std::string&)> log;
};

// The outcome on one daemon: the root's id, every node's host and pid, and
// the open connections (the root's to nodes 1..nodes-1, indexed by node,
// -1 for itself; another node's to the root at index 0).
struct BootstrapResult {
  UniqueId id{};
  std::vector<PeerInfo> peers;
  std::vector<int> fds;
};

// Runs the exchange for this node. ZD_ERR_TIMEOUT when the root never
// answers or a node never comes within the timeout (naming the address and
// the nodes missing), ZD_ERR_CONFIG when the port is taken or a daemon's
// layout differs (naming both), ZD_ERR_VERSION when a daemon speaks another
// bootstrap version (the root's refusal: on the root and on that node),
// ZD_ERR_IO for other socket failures.
zd_status bootstrap(const BootstrapRequest& req, BootstrapResult* out, char* err, size_t err_size);

// Failure notices over the bootstrap connections, after the exchange.
// Each daemon runs one thread that reads them (and sees a connection
// close); the root forwards what it hears to every other node.
struct Notice {
  enum Kind : uint32_t { kBye = 1, kAbort = 2 };
  Kind kind = kBye;
  int node = 0;            // who it is about (the sender, or the node lost)
  zd_status status = ZD_OK;
  std::string reason;
};

// Writes a notice; false when the connection is gone.
bool send_notice(int fd, const Notice& n);
// Reads one notice (the connection is readable): 1 read, 0 the connection
// closed (or failed), -1 garbage or half a notice left there for 5 s.
int read_notice(int fd, Notice* out);

// While NCCL sets up the communicators, before the notice thread runs: what
// a peer has already said, without waiting. "" when nothing is waiting on
// any connection; else why this daemon's setup cannot finish: a peer's
// abort notice in its own words (its setup failed, and it says why), or a
// connection that closed (a daemon that died or left during the setup),
// naming that daemon. `peers` and `node` say whom each fd reaches (the
// root holds one per node, fd -1 for itself; a node one, to the root).
std::string setup_news(const std::vector<int>& fds, const std::vector<PeerInfo>& peers, int node);

void close_fds(std::vector<int>& fds);

}  // namespace zerod::comm::nccl

#endif  // ZEROD_COMM_NCCL_BOOTSTRAP_H
