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
    // The job ends here: its last snapshot, if it takes them. zd_model_destroy
    // returns nothing, so a failed one is only the engine's error in the log
    // (which says that the run's final state was NOT saved, and what is kept).
    static_cast<void>(model_->final_snapshot());
    model_.reset();            // before the script its policy points into
  }

  zd_param_id register_param(const std::string& name, const std::string& module, zd_dtype dtype,
                             std::vector<int64_t> shape, const void* init,
                             zd_dtype init_dtype) override {
    return model_->register_param(0, name, module, dtype, std::move(shape), init, init_dtype);
  }
  const Registry& registry() const override { return model_->registry(); }
  calls::Outcome call(const calls::Args& a, void* data) override { return calls::dispatch(*model_, 0, a, data); }

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

}  // namespace zerod::abi
