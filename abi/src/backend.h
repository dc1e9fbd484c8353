// What a zd_client and a zd_model talk to. Embedded mode implements these
// with the engine in this process; daemon mode implements them over the
// socket. The C functions in zerod.cpp see only
// these interfaces, so the ABI behaves the same in both modes.
#pragma once

#include "model.h"
#include "registry.h"

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

struct OptimizerFigures {
  std::string name;
  std::vector<std::string> slots;
  int64_t step = 0;
};

struct MemoryFigures {
  uint64_t current = 0;
  uint64_t peak = 0;
  uint64_t budget = 0;
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;

  virtual zd_param_id register_param(const std::string& name, const std::string& module,
                                     zd_dtype dtype, std::vector<int64_t> shape, const void* init,
                                     zd_dtype init_dtype) = 0;
  virtual void finalize() = 0;
  // The parameters and modules, as registered (names, shapes, modules).
  virtual const Registry& registry() const = 0;

  virtual void forward_begin(zd_module_id m) = 0;
  virtual void forward_end(zd_module_id m) = 0;
  virtual void backward_begin(zd_module_id m) = 0;
  virtual void backward_end(zd_module_id m) = 0;
  virtual ViewInfo param_view(zd_param_id p) = 0;
  virtual ViewInfo grad_view(zd_param_id p) = 0;
  virtual StepFigures step() = 0;
  virtual double loss_scale() const = 0;
  virtual void set_stream(void* stream) = 0;

  virtual void read_param(zd_param_id p, zd_dtype dt, void* dst, uint64_t bytes) = 0;
  virtual void write_param(zd_param_id p, zd_dtype dt, const void* src, uint64_t bytes) = 0;
  // rank -1 is the caller's own rank.
  virtual MemoryFigures memory(int rank, zd_tier tier, zd_mem_kind kind) const = 0;
  virtual zd_comm_figures comm_figures(int rank) const = 0;

  virtual OptimizerFigures optimizer() const = 0;
  virtual void read_state(zd_param_id p, int slot, zd_dtype dt, void* dst, uint64_t bytes) = 0;
  virtual void write_state(zd_param_id p, int slot, zd_dtype dt, const void* src, uint64_t bytes) = 0;
  virtual void set_step(int64_t step) = 0;
  // Checkpoints: a collective of every rank (dir as the caller names it).
  virtual void save(const std::string& dir) = 0;
  virtual void load(const std::string& dir) = 0;
  // zd_model_report (ABI 1.3).
  virtual void report(uint64_t tokens, uint64_t samples, bool has_loss, double loss) = 0;
};

class ClientBackend {
 public:
  virtual ~ClientBackend() = default;
  virtual zd_client_info info() const = 0;
  virtual std::unique_ptr<ModelBackend> create_model(const ScriptOptions& script) = 0;
};

// What zd_model_optimizer_info reports for a rank of an engine model.
OptimizerFigures optimizer_figures(const Model& m, int rank);

// The engine in this process, one rank.
std::unique_ptr<ClientBackend> make_embedded_client();
// A zerod daemon at a unix socket; rank and world size from ZEROD_RANK and
// ZEROD_WORLD_SIZE (as `zerod run` sets them). timeout_ms 0 = no limit.
std::unique_ptr<ClientBackend> make_remote_client(const std::string& socket_path, uint32_t timeout_ms);

}  // namespace zerod::abi
