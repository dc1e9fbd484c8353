// What a zd_client and a zd_model talk to. Embedded mode implements these
// with the engine in this process; daemon mode implements them over the
// call ring and the socket. The C functions in zerod.cpp see only these
// interfaces, and every model call is one call record (base/call_record.h)
// run by the engine's one dispatcher (engine/calls/dispatch.h), so the ABI
// behaves the same in both modes.
#pragma once

#include "calls/dispatch.h"
#include "model/model.h"
#include "model/registry.h"

#include <zerod/zerod.h>

#include <memory>
#include <string>

namespace zerod::abi {

struct ScriptOptions {
  std::string path;
  std::string text;
  std::string name;
  bool allow_io = false;
  std::string device;  // overrides the job script's device ("" = the script's)
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;

  virtual zd_param_id register_param(const std::string& name, const std::string& module,
                                     zd_dtype dtype, std::vector<int64_t> shape, const void* init,
                                     zd_dtype init_dtype) = 0;
  // The parameters and modules, as registered (names, shapes, modules).
  virtual const Registry& registry() const = 0;
  // Every call of the table (call_record.h) after registration. data: the
  // caller's buffer of a whole-parameter or state call, or the stream of
  // set_stream. Embedded: calls::dispatch on the engine. Daemon: the call
  // ring, or an answer this side already holds.
  virtual calls::Outcome call(const calls::Args& a, void* data) = 0;
};

class ClientBackend {
 public:
  virtual ~ClientBackend() = default;
  virtual zd_client_info info() const = 0;
  virtual std::unique_ptr<ModelBackend> create_model(const ScriptOptions& script) = 0;
};

// The engine in this process, one rank.
std::unique_ptr<ClientBackend> make_embedded_client();
// Who a rank is in its job.
struct RankIdentity {
  int rank = 0, world = 1, local_rank = 0;
  int local_world = 0;  // the job's ranks on this node (0: not known)
  std::string job_key;  // which job, for a daemon serving several ("" = none named)
  std::string launch_id;  // which launch of it (LauncherRanks::launch_id; "" = not known)
};
// A zerod daemon at a unix socket; rank and world size from `who` (another
// launcher's, node_daemon.h), else from the launcher's environment as
// launcher_ranks() reads it (ZEROD_RANK and ZEROD_WORLD_SIZE first, as `zerod
// run` sets them; then torchrun's, Open MPI's, Slurm's). timeout_ms 0 = no limit.
std::unique_ptr<ClientBackend> make_remote_client(const std::string& socket_path, uint32_t timeout_ms,
                                                  const RankIdentity* who = nullptr);

}  // namespace zerod::abi
