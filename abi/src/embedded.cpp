// Embedded mode: the engine runs inside the trainer's process, as rank 0 of
// a one-rank job. The job script's sandbox lives as long as the model, so
// its lr() hook can be called at every step.
#include "backend.h"

#include "error.h"
#include "job_script.h"

namespace zerod::abi {

namespace {

class EmbeddedModel final : public ModelBackend {
 public:
  explicit EmbeddedModel(const ScriptOptions& s) {
    scripting::ScriptSource src;
    src.path = s.path;
    src.text = s.text;
    src.name = s.name;
    src.allow_io = s.allow_io;
    script_ = scripting::JobScript::load(src);
    JobConfig config = script_->config();
    if (!s.device.empty()) config.device = s.device;  // the trainer knows where it computes
    model_ = std::make_unique<Model>(std::move(config), script_->make_plugins(1), script_.get(), 1);
  }
  ~EmbeddedModel() override {
    model_->final_snapshot();  // the job ends here: its last snapshot, if it takes them
    model_.reset();            // before the script its policy points into
  }

  zd_param_id register_param(const std::string& name, const std::string& module, zd_dtype dtype,
                             std::vector<int64_t> shape, const void* init,
                             zd_dtype init_dtype) override {
    return model_->register_param(0, name, module, dtype, std::move(shape), init, init_dtype);
  }
  void finalize() override { model_->finalize(0); }
  const Registry& registry() const override { return model_->registry(); }

  void forward_begin(zd_module_id m) override { model_->forward_begin(0, m); }
  void forward_end(zd_module_id m) override { model_->forward_end(0, m); }
  void backward_begin(zd_module_id m) override { model_->backward_begin(0, m); }
  void backward_end(zd_module_id m) override { model_->backward_end(0, m); }
  ViewInfo param_view(zd_param_id p) override { return model_->param_view(0, p); }
  ViewInfo grad_view(zd_param_id p) override { return model_->grad_view(0, p); }
  StepFigures step() override { return model_->step(0); }
  double loss_scale() const override { return model_->loss_scale(0); }
  void set_stream(void* stream) override { model_->set_stream(0, stream); }

  void read_param(zd_param_id p, zd_dtype dt, void* dst, uint64_t bytes) override {
    model_->read_param(0, p, dt, dst, bytes);
  }
  void write_param(zd_param_id p, zd_dtype dt, const void* src, uint64_t bytes) override {
    model_->write_param(0, p, dt, src, bytes);
  }
  MemoryFigures memory(int rank, zd_tier tier, zd_mem_kind kind) const override {
    const MemoryLedger& l = model_->ledger(rank < 0 ? 0 : rank);
    return {l.current(tier, kind), l.peak(tier, kind), l.budget(tier)};
  }
  zd_comm_figures comm_figures(int rank) const override { return model_->comm().figures(rank < 0 ? 0 : rank); }

  OptimizerFigures optimizer() const override { return optimizer_figures(*model_, 0); }
  void read_state(zd_param_id p, int slot, zd_dtype dt, void* dst, uint64_t bytes) override {
    model_->read_state(0, p, slot, dt, dst, bytes);
  }
  void write_state(zd_param_id p, int slot, zd_dtype dt, const void* src, uint64_t bytes) override {
    model_->write_state(0, p, slot, dt, src, bytes);
  }
  void set_step(int64_t step) override { model_->set_applied_steps(0, step); }
  void save(const std::string& dir) override { model_->save_checkpoint(0, dir); }
  void load(const std::string& dir) override { model_->load_checkpoint(0, dir); }
  void report(uint64_t tokens, uint64_t samples, bool has_loss, double loss) override {
    model_->report(0, tokens, samples, has_loss, loss);
  }

 private:
  std::unique_ptr<scripting::JobScript> script_;
  std::unique_ptr<Model> model_;
};

class EmbeddedClient final : public ClientBackend {
 public:
  zd_client_info info() const override {
    zd_client_info i{};
    i.struct_size = sizeof i;
    i.rank = 0;
    i.world_size = 1;
    i.local_rank = 0;
    i.embedded = 1;
    return i;
  }
  std::unique_ptr<ModelBackend> create_model(const ScriptOptions& script) override {
    return std::make_unique<EmbeddedModel>(script);
  }
};

}  // namespace

std::unique_ptr<ClientBackend> make_embedded_client() { return std::make_unique<EmbeddedClient>(); }

OptimizerFigures optimizer_figures(const Model& m, int rank) {
  OptimizerFigures f;
  f.name = m.optimizer().plugin().name();
  for (uint32_t s = 0; s < m.optimizer().state_slots(); ++s) f.slots.push_back(m.optimizer().state_name(s));
  f.step = m.applied_steps(rank);
  return f;
}

}  // namespace zerod::abi
