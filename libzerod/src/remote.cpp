// Daemon mode: the client side. At connect it sends the daemon a call ring
// (transport/ring.h); each table call is then a call record in the ring and
// its reply record (without a ring, ZEROD_NO_RING=1, the same records as
// socket frames), and set-up requests (models, registration, staging) are
// protobuf socket frames the ring announces. Views point into the daemon's arenas, which
// this side maps once when their fds arrive on the socket (memfds on the
// cpu device, CUDA allocations on a GPU: trainer_link.h, which also orders
// the trainer's stream against the daemon's). Whole-parameter
// data goes through a staging memfd the client shares with the daemon. No
// tensor bytes travel in the messages. Answers this side already holds
// (views, the loss scale, module and parameter info) cost no round trip.
#include "remote_client.h"

#include "error.h"
#include "launcher_env.h"
#include "script_file.h"
#include "sizes.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

namespace zerod::abi {

namespace remote {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  // The daemon refuses a world size above the same bound (wire::kMaxWorldSize).
  if (*end != 0 || x < 0 || x > wire::kMaxWorldSize)
    fail(ZD_ERR_INVALID_ARGUMENT, std::string(name) + "='" + v + "' is not a valid number (0 to " +
                                      std::to_string(wire::kMaxWorldSize) + ")");
  return static_cast<int>(x);
}

// Which rank this process is, when ZEROD_ENDPOINT names the daemon: what
// the launcher's variables say, zerod's own first (ZEROD_RANK,
// ZEROD_WORLD_SIZE, as `zerod run` and the Python integrations set them),
// then torchrun's, Open MPI's, Slurm's (launcher_env.h), so that a torchrun
// rank pointed at a `zerod serve` is never rank 0 of 1. The job key tells a
// daemon serving several jobs which one the rank is of. A job of one rank
// (ZEROD_WORLD_SIZE=1, or nothing said) keeps zerod's variables even where
// an enclosing launcher's say more.
RankIdentity identity_from_environment() {
  RankIdentity id;
  const auto launched = launcher_ranks();
  if (!launched || env_int("ZEROD_WORLD_SIZE", 2) <= 1) {
    id.rank = env_int("ZEROD_RANK", 0);
    id.world = env_int("ZEROD_WORLD_SIZE", 1);
    id.local_rank = env_int("ZEROD_LOCAL_RANK", id.rank);
    id.local_world = env_int("ZEROD_LOCAL_WORLD_SIZE", 0);
    const char* key = std::getenv("ZEROD_JOB_KEY");
    if (key && *key) {  // "" names no job (launcher_env.cpp)
      id.job_key = std::string("ZEROD_JOB_KEY=") + key + ";";
      // This process is its job's only rank: another process naming the job
      // while this one is connected is another launch (Server::join).
      id.launch_id = "pid=" + std::to_string(::getpid()) + ";";
    }
    return id;
  }
  id.rank = launched->rank;
  id.world = launched->world;
  id.local_rank = launched->local_rank;
  id.local_world = launched->local_world;
  id.job_key = launched->hello_job_key;
  id.launch_id = launched->launch_id;
  return id;
}

}  // namespace

RemoteClient::RemoteClient(const std::string& path, uint32_t timeout_ms, const RankIdentity* who)
    : conn_(transport::connect_unix(path, timeout_ms ? static_cast<int>(timeout_ms) : 5000)),
      timeout_ms_(timeout_ms) {
  const RankIdentity id = who ? *who : identity_from_environment();
  rank_ = id.rank;
  world_ = id.world;
  local_rank_ = id.local_rank;
  v1::Request req;
  v1::Hello* h = req.mutable_hello();
  h->set_abi_version(ZD_ABI_VERSION);
  h->set_role("rank");
  h->set_rank(rank_);
  h->set_world_size(world_);
  h->set_local_rank(local_rank_);
  h->set_job_key(id.job_key);
  h->set_launch_id(id.launch_id);
  h->set_local_world_size(id.local_world);
  h->set_stream_signal_page(true);
  h->set_arena_batches(true);  // a call that grows the pool by more than one frame's fds still answers
  const v1::Reply r = rpc(req);
  daemon_abi_ = r.hello().abi_version();
  daemon_version_ = r.hello().version();
  // Model calls are call records on either carrier; a daemon from before
  // that could not take save, load or optimizer_info through its ring.
  if (!r.hello().call_records())
    fail(ZD_ERR_VERSION, "the zerod daemon at " + path + " (" + r.hello().version() +
                             ") is older than this libzerod (" ZEROD_VERSION_STRING
                             "): it does not take model calls as call records; run the daemon of the same release");
  if (r.hello().ring() && std::getenv("ZEROD_NO_RING") == nullptr) set_up_ring();
  // A daemon that does not say it runs a deferred end would drop it.
  defer_end_ = defer_end_ && r.hello().deferred_end();
}

void RemoteClient::require_daemon_abi(uint32_t minor, const char* call) const {
  if ((daemon_abi_ >> 16) > ZD_ABI_VERSION_MAJOR || (daemon_abi_ & 0xffffu) >= minor) return;
  fail(ZD_ERR_VERSION, std::string(call) + " needs a zerod daemon of ABI 1." + std::to_string(minor) +
                           " or later; this one (" + daemon_version_ + ") provides " +
                           std::to_string(daemon_abi_ >> 16) + "." + std::to_string(daemon_abi_ & 0xffffu) +
                           ": run the daemon of this libzerod's release (" ZEROD_VERSION_STRING ")");
}

zd_client_info RemoteClient::info() const {
  zd_client_info i{};
  i.struct_size = sizeof i;
  i.rank = rank_;
  i.world_size = world_;
  i.local_rank = local_rank_;
  i.embedded = 0;
  return i;
}

std::unique_ptr<ModelBackend> RemoteClient::create_model(const ScriptOptions& s) {
  std::string text = s.text, name = s.name.empty() ? "job.lua" : s.name;
  if (!s.path.empty()) {
    // Read here: the daemon may not share this process's working directory.
    text = scripting::read_script_file(s.path);
    name = s.path;
  }
  v1::Request req;
  v1::CreateModel* c = req.mutable_create_model();
  c->set_script_text(text);
  c->set_script_name(name);
  c->set_allow_io(s.allow_io);
  {
    // The daemon resolves the script's relative paths where the trainer
    // would: beside the script file, else in this process's directory.
    std::error_code ec;
    const std::filesystem::path base =
        s.path.empty() ? std::filesystem::current_path(ec) : std::filesystem::absolute(s.path, ec).parent_path();
    if (!ec) c->set_script_dir(base.string());
  }
  c->set_device(s.device);
  // On a GPU, the one this trainer computes on, by the name every process
  // shares; the daemon refuses to serve the rank on another. The device
  // number this process uses for it is then its own, not the daemon's.
  int gpu = -1;
  std::string uuid;
  const bool named = s.device == "cuda" && current_gpu(&gpu, &uuid);
  if (named) c->set_gpu_uuid(uuid);
  std::vector<transport::UniqueFd> fds;
  const v1::Reply r = rpc(req, &fds);
  const v1::CreateModelReply& cm = r.create_model();
  const int32_t device_id = named && cm.device_type() == ZD_DEVICE_CUDA ? gpu : cm.device_id();
  try {
    // A GPU's page of stream signals, mapped by the model's TrainerLink
    // (the fd closes here once it has).
    StreamLink link;
    if (cm.signal_page()) {
      if (fds.size() != 1)
        fail(ZD_ERR_INTERNAL,
             "the daemon announced a page of stream signals but sent " + std::to_string(fds.size()) + " fds");
      link = StreamLink{fds[0].get()};
    }
    return std::make_unique<RemoteModel>(*this, cm.model(), cm.device_type(), device_id, link);
  } catch (...) {
    // This side cannot reach the device: the daemon's model goes again.
    v1::Request d;
    d.mutable_destroy_model()->set_model(cm.model());
    try {
      rpc(d);
    } catch (...) {
    }
    throw;
  }
}

}  // namespace remote

std::unique_ptr<ClientBackend> make_remote_client(const std::string& path, uint32_t timeout_ms,
                                                  const RankIdentity* who) {
  return std::make_unique<remote::RemoteClient>(path, timeout_ms, who);
}

}  // namespace zerod::abi
