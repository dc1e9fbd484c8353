// The exported C functions of libzerod. Each one checks its arguments, calls
// the client or model backend, and turns any C++ exception into a status
// and a message (zd_last_error, zd_model_last_error): nothing thrown crosses
// this boundary.
#include "backend.h"

#include "runtime/dtype.h"
#include "error.h"
#include "launcher_env.h"
#include "node_daemon.h"
#include "memory/ledger.h"

#include <zerod/zerod.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <list>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#ifndef ZEROD_VERSION_STRING
#define ZEROD_VERSION_STRING "0.0.0"
#endif

using zerod::Error;
using zerod::fail;

struct zd_client {
  std::unique_ptr<zerod::abi::ClientBackend> backend;
  std::list<zd_model*> models;  // open models, freed with the client
};

struct zd_model {
  zd_client* client = nullptr;
  std::unique_ptr<zerod::abi::ModelBackend> backend;
  std::string last_error;
  // What zd_model_optimizer_info's strings point into (fixed once known).
  std::string optimizer_name;
  std::vector<std::string> slot_names;
};

namespace {

thread_local std::string tl_last_error;

void record_error(zd_model* model, const std::string& message) {
  tl_last_error = message;
  if (model) model->last_error = message;
}

// "call: message", unless the message already begins with the call's name
// (the engine's own checks name the call they refuse: "zd_param_read of
// 'w': ...", "zd_model_set_stream while modules are begun").
std::string prefixed(const char* call, const char* message) {
  const size_t n = std::strlen(call);
  if (std::strncmp(message, call, n) == 0 && (message[n] == ':' || message[n] == ' ')) return message;
  return std::string(call) + ": " + message;
}

// Runs f, mapping exceptions to a status and recording the message on this
// thread and on the model (if any).
template <typename F>
zd_status guard(const char* call, const zd_model* model, F&& f) noexcept {
  zd_model* m = const_cast<zd_model*>(model);
  try {
    f();
    return ZD_OK;
  } catch (const Error& e) {
    record_error(m, prefixed(call, e.what()));
    return e.code();
  } catch (const std::bad_alloc&) {
    record_error(m, std::string(call) + ": out of memory");
    return ZD_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    record_error(m, std::string(call) + ": internal error: " + e.what());
    return ZD_ERR_INTERNAL;
  } catch (...) {
    record_error(m, std::string(call) + ": internal error (unknown exception)");
    return ZD_ERR_INTERNAL;
  }
}

void require(bool ok, const std::string& message) {
  if (!ok) fail(ZD_ERR_INVALID_ARGUMENT, message);
}

// Where each field of a size-prefixed struct lies. A caller's struct_size
// must end on a field boundary: every released version of a struct ended
// on one (1.0's zd_model_options ends where `device` begins), and a size
// that ends inside a field would copy half a pointer from the caller and
// half from the defaults (a struct_size of 20 made script_text such a
// pointer, and zd_model_create crashed on it).
struct Field {
  size_t offset;
  size_t size;
  const char* name;
};

template <typename T>
struct Layout;

#define ZD_FIELD(T, f) Field{offsetof(T, f), sizeof(std::declval<T&>().f), #f}
#define ZD_LAYOUT(T, ...)                                         \
  template <>                                                     \
  struct Layout<T> {                                              \
    static constexpr const char* name = #T;                       \
    static constexpr Field fields[] = {__VA_ARGS__};              \
  };

ZD_LAYOUT(zd_connect_options, ZD_FIELD(zd_connect_options, struct_size), ZD_FIELD(zd_connect_options, abi_version),
          ZD_FIELD(zd_connect_options, timeout_ms), ZD_FIELD(zd_connect_options, reserved))
ZD_LAYOUT(zd_client_info, ZD_FIELD(zd_client_info, struct_size), ZD_FIELD(zd_client_info, rank),
          ZD_FIELD(zd_client_info, world_size), ZD_FIELD(zd_client_info, local_rank),
          ZD_FIELD(zd_client_info, embedded))
ZD_LAYOUT(zd_model_options, ZD_FIELD(zd_model_options, struct_size), ZD_FIELD(zd_model_options, flags),
          ZD_FIELD(zd_model_options, script_path), ZD_FIELD(zd_model_options, script_text),
          ZD_FIELD(zd_model_options, script_name), ZD_FIELD(zd_model_options, device))
ZD_LAYOUT(zd_param_desc, ZD_FIELD(zd_param_desc, struct_size), ZD_FIELD(zd_param_desc, dtype),
          ZD_FIELD(zd_param_desc, name), ZD_FIELD(zd_param_desc, module), ZD_FIELD(zd_param_desc, ndim),
          ZD_FIELD(zd_param_desc, shape), ZD_FIELD(zd_param_desc, init), ZD_FIELD(zd_param_desc, init_dtype))
ZD_LAYOUT(zd_param_info, ZD_FIELD(zd_param_info, struct_size), ZD_FIELD(zd_param_info, dtype),
          ZD_FIELD(zd_param_info, name), ZD_FIELD(zd_param_info, module), ZD_FIELD(zd_param_info, ndim),
          ZD_FIELD(zd_param_info, shape), ZD_FIELD(zd_param_info, numel))
ZD_LAYOUT(zd_view, ZD_FIELD(zd_view, struct_size), ZD_FIELD(zd_view, flags), ZD_FIELD(zd_view, data),
          ZD_FIELD(zd_view, nbytes), ZD_FIELD(zd_view, dtype), ZD_FIELD(zd_view, ndim), ZD_FIELD(zd_view, shape),
          ZD_FIELD(zd_view, device_type), ZD_FIELD(zd_view, device_id), ZD_FIELD(zd_view, arena),
          ZD_FIELD(zd_view, reserved), ZD_FIELD(zd_view, offset))
ZD_LAYOUT(zd_step_result, ZD_FIELD(zd_step_result, struct_size), ZD_FIELD(zd_step_result, flags),
          ZD_FIELD(zd_step_result, step), ZD_FIELD(zd_step_result, micro_step), ZD_FIELD(zd_step_result, lr),
          ZD_FIELD(zd_step_result, loss_scale), ZD_FIELD(zd_step_result, grad_norm))
ZD_LAYOUT(zd_progress, ZD_FIELD(zd_progress, struct_size), ZD_FIELD(zd_progress, flags),
          ZD_FIELD(zd_progress, tokens), ZD_FIELD(zd_progress, samples), ZD_FIELD(zd_progress, loss),
          ZD_FIELD(zd_progress, reserved))
ZD_LAYOUT(zd_optimizer_info, ZD_FIELD(zd_optimizer_info, struct_size), ZD_FIELD(zd_optimizer_info, state_slots),
          ZD_FIELD(zd_optimizer_info, step), ZD_FIELD(zd_optimizer_info, name),
          ZD_FIELD(zd_optimizer_info, slot_names))
ZD_LAYOUT(zd_memory_figures, ZD_FIELD(zd_memory_figures, struct_size), ZD_FIELD(zd_memory_figures, reserved),
          ZD_FIELD(zd_memory_figures, current), ZD_FIELD(zd_memory_figures, peak),
          ZD_FIELD(zd_memory_figures, budget))
ZD_LAYOUT(zd_comm_figures, ZD_FIELD(zd_comm_figures, struct_size), ZD_FIELD(zd_comm_figures, reserved),
          ZD_FIELD(zd_comm_figures, bytes_sent), ZD_FIELD(zd_comm_figures, network_bytes_sent),
          ZD_FIELD(zd_comm_figures, collectives))

#undef ZD_LAYOUT
#undef ZD_FIELD

// The sizes below sizeof(T) that end on a field boundary (where a field
// ends or the next begins: an older struct ending at a 4-byte field is
// padded to the next 8-byte one), from sizeof(struct_size) up.
template <typename T>
std::vector<size_t> boundary_sizes() {
  std::vector<size_t> out;
  for (const Field& f : Layout<T>::fields)
    for (const size_t at : {f.offset, f.offset + f.size})
      if (at >= sizeof(uint32_t) && at < sizeof(T)) out.push_back(at);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Refuses a struct_size that is too small to hold struct_size itself, or
// that ends inside a field. Sizes of sizeof(T) and more are a caller built
// against this version or a newer minor one (whose fields this library
// does not know and leaves alone).
// Whether Layout<T> reaches the end of T: a field added to zerod.h and not
// to its layout here fails the build.
template <typename T>
constexpr bool covers_struct() {
  const Field& last = Layout<T>::fields[std::size(Layout<T>::fields) - 1];
  return (last.offset + last.size + alignof(T) - 1) / alignof(T) * alignof(T) == sizeof(T);
}

template <typename T>
void check_struct_size(uint32_t size) {
  static_assert(covers_struct<T>(), "Layout<T> must list every field of T, the last one too");
  const std::string what = Layout<T>::name;
  const std::string set = "sizeof(" + what + ") = " + std::to_string(sizeof(T)) + " (the _INIT macro sets that)";
  require(size >= sizeof(uint32_t), what + ".struct_size is " + std::to_string(size) + "; set it to " + set);
  if (size >= sizeof(T)) return;
  const std::vector<size_t> sizes = boundary_sizes<T>();
  if (std::find(sizes.begin(), sizes.end(), size) != sizes.end()) return;
  std::string inside;
  for (const Field& f : Layout<T>::fields)
    if (f.offset < size && size < f.offset + f.size)
      inside = ", which ends inside its field '" + std::string(f.name) + "' (bytes " + std::to_string(f.offset) +
               ".." + std::to_string(f.offset + f.size - 1) + ")";
  std::string accepted;
  for (size_t i = 0; i < sizes.size(); ++i)
    accepted += (i == 0 ? "" : i + 1 == sizes.size() ? " or " : ", ") + std::to_string(sizes[i]);
  fail(ZD_ERR_INVALID_ARGUMENT, what + ".struct_size is " + std::to_string(size) + inside +
                                    "; it must end on a field boundary (" + accepted +
                                    ": a caller that knows only the fields before it) or be at least " + set);
}

// Copies a caller's struct that begins with its own size: the fields the
// caller knows, defaults for the rest.
template <typename T>
T read_struct(const T* in, T defaults) {
  if (!in) return defaults;
  check_struct_size<T>(in->struct_size);
  std::memcpy(&defaults, in, std::min<size_t>(in->struct_size, sizeof(T)));
  defaults.struct_size = sizeof(T);
  return defaults;
}

// Writes the fields of value that fit the caller's struct.
template <typename T>
void write_struct(T* out, T value) {
  require(out != nullptr, std::string(Layout<T>::name) + " output is NULL");
  const uint32_t caller_size = out->struct_size;
  check_struct_size<T>(caller_size);
  value.struct_size = caller_size;
  std::memcpy(out, &value, std::min<size_t>(caller_size, sizeof(T)));
}

zd_model* checked(zd_model* model) {
  if (!model) fail(ZD_ERR_INVALID_ARGUMENT, "model is NULL");
  return model;
}

std::string str_or_empty(const char* s) { return s ? s : ""; }

// One table call on the model's backend (embedded or daemon).
zerod::calls::Outcome run(zd_model* model, const zerod::calls::Args& a, void* data = nullptr) {
  return checked(model)->backend->call(a, data);
}

// Names the NULL argument of a lookup.
void require_lookup(const zd_model* model, const char* name, const void* out_id) {
  require(model != nullptr, "model is NULL");
  require(name != nullptr, "name is NULL");
  require(out_id != nullptr, "out_id is NULL");
}

// zd_model_set_step's bound: 2^53, the last update number a double holds
// exactly.
constexpr int64_t kMaxStep = int64_t{1} << 53;

zerod::calls::Args args(zerod::calls::Op op) {
  zerod::calls::Args a;
  a.op = op;
  return a;
}

void fill_view(zd_view* out, const zerod::ViewInfo& v) {
  zd_view view{};
  view.struct_size = sizeof view;
  view.flags = v.read_only ? uint32_t{ZD_VIEW_READ_ONLY} : 0u;
  view.data = v.data;
  view.nbytes = v.bytes;
  view.dtype = v.dtype;
  view.ndim = static_cast<int32_t>(v.shape->size());
  for (size_t i = 0; i < v.shape->size(); ++i) view.shape[i] = (*v.shape)[i];
  view.device_type = v.device_type;
  view.device_id = v.device_id;
  view.arena = v.arena;
  view.offset = v.offset;
  write_struct(out, view);
}

// A rank another launcher started (torchrun, accelerate launch, Lightning's
// launcher, mpirun, srun): its node's daemon, started on demand
// (node_daemon.h). Alone it would train as rank 0 of 1 while the others do
// the same, so whatever cannot be served is refused, naming why.
std::unique_ptr<zerod::abi::ClientBackend> connect_launched_rank(const zerod::abi::LauncherRanks& r,
                                                                 uint32_t timeout_ms) {
  const std::string who = r.launcher + " started this process as rank " + std::to_string(r.rank) + " of " +
                          std::to_string(r.world) + " (" + r.where + ")";
  const std::string alone = " (ZEROD_ENDPOINT=embedded: trains each process on its own, on purpose)";
  if (const char* off = std::getenv("ZEROD_NO_NODE_DAEMON"); off && *off)
    fail(ZD_ERR_CONFIG, who + ", no zerod daemon was named (ZEROD_ENDPOINT is unset) and ZEROD_NO_NODE_DAEMON "
                              "forbids starting one: start the ranks with `zerod run --nproc N -- <command>`" + alone);
  if (r.rank < 0 || r.rank >= r.world)
    fail(ZD_ERR_CONFIG, who + ", but its rank is missing or out of range");
  if (r.local_world == 0)
    fail(ZD_ERR_CONFIG, who + ", but not how many of them run on this node, so no daemon can be started for "
                              "them; set ZEROD_LOCAL_WORLD_SIZE (and ZEROD_RANK, ZEROD_LOCAL_RANK, ZEROD_WORLD_SIZE), "
                              "or start the ranks with `zerod run --nproc N -- <command>`" + alone);
  const char* job = std::getenv("ZEROD_JOB");
  if (!job || !*job)
    fail(ZD_ERR_CONFIG, who + ": the node's zerod daemon, which these ranks start on demand, needs the job script "
                              "before any rank connects; set ZEROD_JOB=job.lua (zerod.torch.initialize(job=...) and "
                              "the Python integrations set it from their argument)" + alone);
  const std::string socket = zerod::abi::node_daemon_socket(r, job, static_cast<int>(timeout_ms));
  const zerod::abi::RankIdentity id{r.rank, r.world, r.local_rank, r.local_world, r.hello_job_key, r.launch_id};
  return zerod::abi::make_remote_client(socket, timeout_ms, &id);
}

}  // namespace

extern "C" {

uint32_t zd_abi_version(void) { return ZD_ABI_VERSION; }

const char* zd_version(void) { return ZEROD_VERSION_STRING; }

const char* zd_status_str(zd_status status) { return zerod::status_name(status); }

const char* zd_last_error(void) { return tl_last_error.c_str(); }

zd_status zd_connect(const char* uri, const zd_connect_options* options, zd_client** out) {
  return guard("zd_connect", nullptr, [&] {
    require(out != nullptr, "out is NULL");
    *out = nullptr;
    const zd_connect_options opts =
        read_struct(options, zd_connect_options{sizeof(zd_connect_options), 0, 0, 0});
    const uint32_t caller_major = opts.abi_version >> 16;
    if (opts.abi_version != 0 && caller_major > ZD_ABI_VERSION_MAJOR)
      fail(ZD_ERR_VERSION, "the caller was built against zerod ABI " + std::to_string(caller_major) +
                               "." + std::to_string(opts.abi_version & 0xffffu) +
                               ", but this libzerod provides " +
                               std::to_string(ZD_ABI_VERSION_MAJOR) + "." +
                               std::to_string(ZD_ABI_VERSION_MINOR) + "; install a newer libzerod");
    std::string target = str_or_empty(uri);
    std::string from;  // where the endpoint came from, for the errors
    if (target.empty()) {
      const char* env = std::getenv("ZEROD_ENDPOINT");
      target = env && *env ? env : "";
      if (!target.empty()) from = " (from ZEROD_ENDPOINT)";
    }
    std::unique_ptr<zerod::abi::ClientBackend> backend;
    if (target.empty()) {
      // Nothing names an endpoint: embedded, unless another launcher made
      // this process one of several; then the ranks of that launch on this
      // node share a daemon, started by the first of them to get here.
      if (const auto ranks = zerod::abi::launcher_ranks())
        backend = connect_launched_rank(*ranks, opts.timeout_ms);
      else
        target = "embedded:";
    }
    if (backend) {
      // the node's daemon
    } else if (target == "embedded:" || target == "embedded") {
      backend = zerod::abi::make_embedded_client();
    } else if (target.rfind("unix:", 0) == 0) {
      const std::string path = target.substr(5);
      require(!path.empty(), "'" + target + "'" + from + ": the unix: endpoint needs a socket path");
      backend = zerod::abi::make_remote_client(path, opts.timeout_ms);
    } else {
      fail(ZD_ERR_INVALID_ARGUMENT, "unknown endpoint '" + target + "'" + from +
                                        ": expected \"embedded:\" or \"unix:/path/to.sock\"");
    }
    auto* c = new zd_client();
    c->backend = std::move(backend);
    *out = c;
  });
}

void zd_disconnect(zd_client* client) {
  if (!client) return;
  for (zd_model* m : client->models) delete m;
  delete client;
}

zd_status zd_client_get_info(const zd_client* client, zd_client_info* out) {
  return guard("zd_client_get_info", nullptr, [&] {
    require(client != nullptr, "client is NULL");
    write_struct(out, client->backend->info());
  });
}

zd_status zd_model_create(zd_client* client, const zd_model_options* options, zd_model** out) {
  return guard("zd_model_create", nullptr, [&] {
    require(out != nullptr, "out is NULL");
    *out = nullptr;
    require(client != nullptr, "client is NULL");
    require(options != nullptr, "options is NULL: pass a zd_model_options naming the job script");
    zd_model_options o =
        read_struct(options, zd_model_options{sizeof(zd_model_options), 0, nullptr, nullptr, nullptr, nullptr});
    require(!(o.script_path && o.script_text), "give one of script_path and script_text, not both");
    zerod::abi::ScriptOptions s;
    if (!o.script_path && !o.script_text) {
      // `zerod run --job job.lua` names the job for every rank.
      const char* job = std::getenv("ZEROD_JOB");
      // Fields the caller's struct_size leaves out are NULL here: say so.
      const uint32_t size = options->struct_size;
      const std::string cut =
          size <= offsetof(zd_model_options, script_path)   ? "script_path and script_text"
          : size <= offsetof(zd_model_options, script_text) ? "script_text"
                                                            : "";
      require(job && *job, std::string("no job script: set script_path or script_text (or run under "
                                       "`zerod run --job job.lua`, which sets ZEROD_JOB)") +
                               (cut.empty() ? std::string()
                                            : "; options.struct_size is " + std::to_string(size) +
                                                  ", which ends before " + cut +
                                                  ": set it to sizeof(zd_model_options)"));
      o.script_path = job;
    }
    s.path = str_or_empty(o.script_path);
    s.text = str_or_empty(o.script_text);
    s.name = str_or_empty(o.script_name);
    s.allow_io = (o.flags & ZD_MODEL_ALLOW_SCRIPT_IO) != 0;
    s.device = str_or_empty(o.device);
    require(o.device == nullptr || s.device == "cpu" || s.device == "cuda" || s.device == "auto",
            "options.device is \"" + s.device + "\"; use \"cpu\", \"cuda\", \"auto\" or NULL (the job script's)");
    require(o.script_path == nullptr || !s.path.empty(), "script_path is empty");
    auto m = std::make_unique<zd_model>();
    m->client = client;
    m->backend = client->backend->create_model(s);
    client->models.push_back(m.get());
    *out = m.release();
  });
}

void zd_model_destroy(zd_model* model) {
  if (!model) return;
  model->client->models.remove(model);
  delete model;
}

const char* zd_model_last_error(const zd_model* model) {
  return model ? model->last_error.c_str() : "";
}

zd_status zd_model_register_param(zd_model* model, const zd_param_desc* desc, zd_param_id* out_id) {
  return guard("zd_model_register_param", model, [&] {
    checked(model);
    require(desc != nullptr, "desc is NULL");
    const zd_param_desc d = read_struct(desc, zd_param_desc{sizeof(zd_param_desc), ZD_DTYPE_F32,
                                                            nullptr, nullptr, 0, nullptr, nullptr, 0});
    // Fields every parameter needs: a struct_size that stops before one of
    // them is the caller's mistake, not a NULL it passed.
    for (const auto& [end, field] : {std::pair{offsetof(zd_param_desc, name), "name"},
                                     std::pair{offsetof(zd_param_desc, module), "module"},
                                     std::pair{offsetof(zd_param_desc, ndim), "ndim"},
                                     std::pair{offsetof(zd_param_desc, shape), "shape"}})
      require(desc->struct_size > end,
              "zd_param_desc.struct_size is " + std::to_string(desc->struct_size) + ", which ends before desc." +
                  field + ", a field every parameter needs (name, module, ndim, shape); set it to "
                  "sizeof(zd_param_desc) = " + std::to_string(sizeof(zd_param_desc)) + " (ZD_PARAM_DESC_INIT does)");
    require(d.name != nullptr, "desc.name is NULL");
    const std::string name = d.name;
    require(d.module != nullptr, "parameter '" + name + "': desc.module is NULL");
    require(d.ndim >= 1 && d.ndim <= ZD_MAX_DIMS,
            "parameter '" + name + "': ndim is " + std::to_string(d.ndim) + "; 1.." +
                std::to_string(ZD_MAX_DIMS) + " are allowed");
    require(d.shape != nullptr, "parameter '" + name + "': desc.shape is NULL");
    std::vector<int64_t> shape(d.shape, d.shape + d.ndim);
    const zd_param_id id = model->backend->register_param(name, d.module, d.dtype, std::move(shape),
                                                          d.init, d.init_dtype);
    if (out_id) *out_id = id;
  });
}

zd_status zd_model_finalize(zd_model* model) {
  return guard("zd_model_finalize", model, [&] { run(model, args(zerod::calls::Op::finalize)); });
}

zd_status zd_model_find_module(const zd_model* model, const char* name, zd_module_id* out_id) {
  return guard("zd_model_find_module", model, [&] {
    require_lookup(model, name, out_id);
    const zd_module_id id = model->backend->registry().find_module(name);
    if (id < 0) fail(ZD_ERR_NOT_FOUND, std::string("no module named '") + name + "'");
    *out_id = id;
  });
}

zd_status zd_model_find_param(const zd_model* model, const char* name, zd_param_id* out_id) {
  return guard("zd_model_find_param", model, [&] {
    require_lookup(model, name, out_id);
    const zd_param_id id = model->backend->registry().find_param(name);
    if (id < 0) fail(ZD_ERR_NOT_FOUND, std::string("no parameter named '") + name + "'");
    *out_id = id;
  });
}

zd_status zd_model_param_count(const zd_model* model, int32_t* out_count) {
  return guard("zd_model_param_count", model, [&] {
    require(model != nullptr, "model is NULL");
    require(out_count != nullptr, "out_count is NULL");
    *out_count = static_cast<int32_t>(model->backend->registry().params().size());
  });
}

zd_status zd_model_module_count(const zd_model* model, int32_t* out_count) {
  return guard("zd_model_module_count", model, [&] {
    require(model != nullptr, "model is NULL");
    require(out_count != nullptr, "out_count is NULL");
    *out_count = static_cast<int32_t>(model->backend->registry().modules().size());
  });
}

zd_status zd_model_param_info(const zd_model* model, zd_param_id id, zd_param_info* out) {
  return guard("zd_model_param_info", model, [&] {
    require(model != nullptr, "model is NULL");
    const zerod::ParamRecord& p = model->backend->registry().param(id);
    zd_param_info info{};
    info.struct_size = sizeof info;
    info.dtype = p.dtype;
    info.name = p.name.c_str();
    info.module = p.module;
    info.ndim = static_cast<int32_t>(p.shape.size());
    for (size_t i = 0; i < p.shape.size(); ++i) info.shape[i] = p.shape[i];
    info.numel = p.numel;
    write_struct(out, info);
  });
}

zd_status zd_model_module_info(const zd_model* model, zd_module_id id, const char** out_name,
                               zd_param_id* ids, int32_t* inout_count) {
  return guard("zd_model_module_info", model, [&] {
    require(model != nullptr, "model is NULL");
    const zerod::ModuleRecord& m = model->backend->registry().module(id);
    if (out_name) *out_name = m.name.c_str();
    if (!inout_count) return;
    const auto n = static_cast<int32_t>(m.params.size());
    const int32_t capacity = *inout_count;
    *inout_count = n;
    if (!ids) return;
    if (capacity < n)
      fail(ZD_ERR_BUFFER_TOO_SMALL, "module '" + m.name + "' has " + std::to_string(n) +
                                        " parameters; ids holds " + std::to_string(capacity));
    for (int32_t i = 0; i < n; ++i) ids[i] = m.params[static_cast<size_t>(i)];
  });
}

zd_status zd_forward_begin(zd_model* model, zd_module_id module) {
  return guard("zd_forward_begin", model, [&] {
    zerod::calls::Args a = args(zerod::calls::Op::forward_begin);
    a.module = module;
    run(model, a);
  });
}

zd_status zd_forward_end(zd_model* model, zd_module_id module) {
  return guard("zd_forward_end", model, [&] {
    zerod::calls::Args a = args(zerod::calls::Op::forward_end);
    a.module = module;
    run(model, a);
  });
}

zd_status zd_backward_begin(zd_model* model, zd_module_id module) {
  return guard("zd_backward_begin", model, [&] {
    zerod::calls::Args a = args(zerod::calls::Op::backward_begin);
    a.module = module;
    run(model, a);
  });
}

zd_status zd_backward_end(zd_model* model, zd_module_id module) {
  return guard("zd_backward_end", model, [&] {
    zerod::calls::Args a = args(zerod::calls::Op::backward_end);
    a.module = module;
    run(model, a);
  });
}

zd_status zd_param_view(zd_model* model, zd_param_id param, zd_view* out) {
  return guard("zd_param_view", model, [&] {
    require(out != nullptr, "out is NULL");
    zerod::calls::Args a = args(zerod::calls::Op::param_view);
    a.param = param;
    fill_view(out, run(model, a).view);
  });
}

zd_status zd_grad_view(zd_model* model, zd_param_id param, zd_view* out) {
  return guard("zd_grad_view", model, [&] {
    require(out != nullptr, "out is NULL");
    zerod::calls::Args a = args(zerod::calls::Op::grad_view);
    a.param = param;
    fill_view(out, run(model, a).view);
  });
}

zd_status zd_step(zd_model* model, zd_step_result* out) {
  return guard("zd_step", model, [&] {
    // The output struct is checked before the step runs, so a bad one
    // cannot leave a step applied but unreported.
    if (out) check_struct_size<zd_step_result>(out->struct_size);
    const zerod::StepFigures f = run(model, args(zerod::calls::Op::step)).step;
    if (!out) return;
    zd_step_result r{};
    r.struct_size = sizeof r;
    r.flags = (f.boundary ? uint32_t{ZD_STEP_BOUNDARY} : 0u) | (f.applied ? uint32_t{ZD_STEP_APPLIED} : 0u) |
              (f.skipped ? uint32_t{ZD_STEP_SKIPPED} : 0u);
    r.step = f.step;
    r.micro_step = f.micro_step;
    r.lr = f.lr;
    r.loss_scale = f.loss_scale;
    r.grad_norm = f.grad_norm;
    write_struct(out, r);
  });
}

zd_status zd_model_loss_scale(const zd_model* model, double* out) {
  return guard("zd_model_loss_scale", model, [&] {
    require(model != nullptr, "model is NULL");
    require(out != nullptr, "out is NULL");
    *out = run(const_cast<zd_model*>(model), args(zerod::calls::Op::loss_scale)).loss_scale;
  });
}

zd_status zd_model_save(zd_model* model, const char* dir) {
  return guard("zd_model_save", model, [&] {
    checked(model);
    require(dir != nullptr && *dir, "dir is NULL or empty: name the checkpoint directory");
    std::string d(dir);
    zerod::calls::Args a = args(zerod::calls::Op::save);
    a.bytes = d.size();
    run(model, a, d.data());
  });
}

zd_status zd_model_load(zd_model* model, const char* dir) {
  return guard("zd_model_load", model, [&] {
    checked(model);
    require(dir != nullptr && *dir, "dir is NULL or empty: name the checkpoint directory");
    std::string d(dir);
    zerod::calls::Args a = args(zerod::calls::Op::load);
    a.bytes = d.size();
    run(model, a, d.data());
  });
}

zd_status zd_model_set_stream(zd_model* model, void* stream) {
  return guard("zd_model_set_stream", model, [&] { run(model, args(zerod::calls::Op::set_stream), stream); });
}

zd_status zd_param_read(zd_model* model, zd_param_id param, zd_dtype dtype, void* dst,
                        uint64_t bytes) {
  return guard("zd_param_read", model, [&] {
    zerod::calls::Args a = args(zerod::calls::Op::param_read);
    a.param = param;
    a.dtype = dtype;
    a.bytes = bytes;
    run(model, a, dst);
  });
}

zd_status zd_param_write(zd_model* model, zd_param_id param, zd_dtype dtype, const void* src,
                         uint64_t bytes) {
  return guard("zd_param_write", model, [&] {
    zerod::calls::Args a = args(zerod::calls::Op::param_write);
    a.param = param;
    a.dtype = dtype;
    a.bytes = bytes;
    run(model, a, const_cast<void*>(src));  // only read
  });
}

zd_status zd_model_memory(const zd_model* model, int32_t rank, zd_tier tier, zd_mem_kind kind,
                          zd_memory_figures* out) {
  return guard("zd_model_memory", model, [&] {
    require(model != nullptr, "model is NULL");
    zerod::calls::Args a = args(zerod::calls::Op::memory);
    a.rank = rank;
    a.tier = tier;
    a.kind = kind;
    const zerod::calls::Outcome f = run(const_cast<zd_model*>(model), a);
    zd_memory_figures m{};
    m.struct_size = sizeof m;
    m.current = f.current;
    m.peak = f.peak;
    m.budget = f.budget;
    write_struct(out, m);
  });
}

}  // extern "C"

namespace {

// The optimizer's name and slot names, asked once: the plugin and its
// slots never change (through the daemon each ask is a round trip).
void remember_optimizer(zd_model* m, const zerod::calls::Outcome& o) {
  if (!m->optimizer_name.empty()) return;
  m->optimizer_name = o.optimizer;
  m->slot_names = o.slots;
}

zd_status state_call(const char* call, zerod::calls::Op op, zd_model* model, zd_param_id param, int32_t slot,
                     zd_dtype dtype, void* data, uint64_t bytes) {
  return guard(call, model, [&] {
    zerod::calls::Args a = args(op);
    a.param = param;
    a.slot = slot;
    a.dtype = dtype;
    a.bytes = bytes;
    run(model, a, data);
  });
}

}  // namespace

extern "C" {

zd_status zd_model_comm_figures(const zd_model* model, int32_t rank, zd_comm_figures* out) {
  return guard("zd_model_comm_figures", model, [&] {
    require(model != nullptr, "model is NULL");
    zerod::calls::Args a = args(zerod::calls::Op::comm_figures);
    a.rank = rank;
    const zerod::calls::Outcome o = run(const_cast<zd_model*>(model), a);
    zd_comm_figures f = ZD_COMM_FIGURES_INIT;
    f.bytes_sent = o.bytes_sent;
    f.network_bytes_sent = o.network_bytes_sent;
    f.collectives = o.collectives;
    write_struct(out, f);
  });
}

zd_status zd_model_optimizer_info(const zd_model* model, zd_optimizer_info* out) {
  return guard("zd_model_optimizer_info", model, [&] {
    zd_model* m = checked(const_cast<zd_model*>(model));
    const zerod::calls::Outcome o = run(m, args(zerod::calls::Op::optimizer_info));  // the step changes: asked every time
    remember_optimizer(m, o);
    zd_optimizer_info i{};
    i.struct_size = sizeof i;
    i.state_slots = static_cast<int32_t>(m->slot_names.size());
    i.step = o.applied_steps;
    i.name = m->optimizer_name.c_str();
    for (size_t s = 0; s < m->slot_names.size() && s < ZD_MAX_STATE_SLOTS; ++s)
      i.slot_names[s] = m->slot_names[s].c_str();
    write_struct(out, i);
  });
}

zd_status zd_optimizer_state_read(zd_model* model, zd_param_id param, int32_t slot, zd_dtype dtype, void* dst,
                                  uint64_t bytes) {
  return state_call("zd_optimizer_state_read", zerod::calls::Op::state_read, model, param, slot, dtype, dst, bytes);
}

zd_status zd_optimizer_state_write(zd_model* model, zd_param_id param, int32_t slot, zd_dtype dtype,
                                   const void* src, uint64_t bytes) {
  return state_call("zd_optimizer_state_write", zerod::calls::Op::state_write, model, param, slot, dtype,
                    const_cast<void*>(src), bytes);  // only read
}

zd_status zd_model_report(zd_model* model, const zd_progress* progress) {
  return guard("zd_model_report", model, [&] {
    checked(model);
    require(progress != nullptr, "progress is NULL: pass a zd_progress (ZD_PROGRESS_INIT)");
    const zd_progress p = read_struct(progress, zd_progress{sizeof(zd_progress), 0, 0, 0, 0.0, 0});
    require((p.flags & ~static_cast<uint32_t>(ZD_PROGRESS_HAS_LOSS)) == 0,
            "progress.flags has unknown bits set: " + std::to_string(p.flags) + " (only ZD_PROGRESS_HAS_LOSS = 1)");
    require(p.reserved == 0, "progress.reserved must be 0");
    zerod::calls::Args a = args(zerod::calls::Op::report);
    a.tokens = p.tokens;
    a.samples = p.samples;
    a.has_loss = (p.flags & ZD_PROGRESS_HAS_LOSS) != 0 ? 1 : 0;
    a.value = p.loss;
    run(model, a);
  });
}

zd_status zd_model_set_step(zd_model* model, int64_t step) {
  return guard("zd_model_set_step", model, [&] {
    checked(model);
    // The next update is step + 1, and the optimizers (Adam's bias
    // correction) and the job's lr() see update numbers as doubles: up to
    // 2^53 every one is exact and step + 1 cannot overflow. A step past
    // that is no count of applied updates, only a wrapped or garbage value
    // (INT64_MAX made every later step fail, its step + 1 overflowed).
    require(step >= 0 && step < kMaxStep, "the step is " + std::to_string(step) + "; a count of applied updates is 0.." +
                                              std::to_string(kMaxStep - 1) + " (2^53 - 1)");
    zerod::calls::Args a = args(zerod::calls::Op::set_step);
    a.step = step;
    run(model, a);
  });
}

zd_status zd_model_set_lr(zd_model* model, double lr) {
  return guard("zd_model_set_lr", model, [&] {
    // The value is the engine's to check (finite, >= 0), in its words,
    // embedded or in the daemon alike.
    zerod::calls::Args a = args(zerod::calls::Op::set_lr);
    a.value = lr;
    run(model, a);
  });
}

}  // extern "C"
