// A model on the daemon, as this side holds it (remote_client.h): its
// registration and end (protobuf requests), the calls answered here (views,
// the loss scale, the stream), the arenas and views the daemon's replies
// announce, and every other call as a call record (ring_call.h), through the
// ring or a socket frame (RemoteClient::call_record).
#include "remote_client.h"

#include "error.h"
#include "runtime/dtype.h"
#include "sizes.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

namespace zerod::abi::remote {

RemoteModel::RemoteModel(RemoteClient& c, int id, int32_t device_type, int32_t device_id, const StreamLink& link)
    : client_(c), id_(id), registry_(1),
      link_(device_type, device_id, link, device_type == ZD_DEVICE_CUDA ? &c.hangup_watch() : nullptr,
            c.daemon_pid()) {}

RemoteModel::~RemoteModel() {
  try {
    // This model's deferred end goes first, on its own: its error must not
    // keep the destroy from going out. Another model's stays deferred: it
    // travels with the next call as it would have, and its error, if any,
    // is that call's (sent here, it would have been lost).
    client_.flush_deferred_of(id_);
  } catch (...) {
    // A broken job's end: the destroy below still detaches the model.
  }
  // The trainer's work on the views is done, and this side's mappings and
  // stream signals are gone, before the daemon frees what they refer to.
  link_.quiesce();
  arenas_.clear();
  client_.take_stray_arenas(id_);  // announced for this model, never to be mapped
  try {
    v1::Request req;
    req.mutable_destroy_model()->set_model(id_);
    client_.rpc(req, nullptr, {}, /*flush=*/false);
  } catch (...) {
    // The daemon may be gone already; nothing is left to free then.
  }
}

zd_param_id RemoteModel::register_param(const std::string& name, const std::string& module,
                                        zd_dtype dtype, std::vector<int64_t> shape, const void* init,
                                        zd_dtype init_dtype) {
  v1::Request req;
  v1::RegisterParam* r = req.mutable_register_param();
  r->set_model(id_);
  r->set_name(name);
  r->set_module(module);
  r->set_dtype(dtype);
  for (int64_t e : shape) r->add_shape(e);
  r->set_init_dtype(init_dtype);
  if (init) {
    // The bytes to copy, from a checked shape and dtype (what the engine
    // would refuse is refused here, in its words, before anything is read).
    const std::string what = "parameter '" + name + "'";
    const zd_dtype idt = init_dtype ? init_dtype : dtype;
    if (!dtype_valid(idt))
      fail(ZD_ERR_INVALID_ARGUMENT, what + " has an invalid init_dtype (" + std::to_string(idt) + ")");
    const uint64_t bytes = checked_bytes(wire::checked_numel(shape, what), idt, what);
    std::memcpy(client_.staging(bytes), init, bytes);
    r->set_has_init(true);
    r->set_staging_offset(0);
  }
  const v1::Reply reply = client_.rpc(req);
  const zd_param_id id = registry_.add(name, module, dtype, std::move(shape));
  if (id != reply.register_param().param())
    fail(ZD_ERR_INTERNAL, "the daemon numbered parameter '" + name + "' " +
                              std::to_string(reply.register_param().param()) + ", this client " +
                              std::to_string(id));
  return id;
}


calls::Outcome RemoteModel::call(const calls::Args& a, void* data) {
  switch (a.op) {
    case calls::Op::param_view:
    case calls::Op::grad_view: return view(a);
    case calls::Op::set_stream: return set_stream(data);
    case calls::Op::loss_scale: {
      calls::Outcome o;
      o.loss_scale = loss_scale_;
      return o;
    }
    case calls::Op::set_lr:
      client_.require_daemon_abi(7, calls::name(a.op));
      return remote(a, data);
    case calls::Op::save:
    case calls::Op::load: {
      // The directory made absolute: the daemon's working directory is not
      // this process's. Checked first, as the daemon checks it.
      calls::check(registry_, client_.info().world_size, a, data);
      std::string dir = std::filesystem::absolute(std::string(static_cast<const char*>(data), a.bytes))
                            .lexically_normal()
                            .string();
      calls::Args abs = a;
      abs.bytes = dir.size();
      return remote(abs, dir.data());
    }
    default: return remote(a, data);
  }
}


calls::Outcome RemoteModel::view(const calls::Args& a) {
  calls::check(registry_, 1, a, nullptr);
  const ParamRecord& p = registry_.param(a.param);
  const bool grad = a.op == calls::Op::grad_view;
  const auto& views = grad ? grad_views_ : param_views_;
  auto it = views.find(a.param);
  if (it == views.end()) {
    if (grad)
      fail(ZD_ERR_INVALID_STATE, "parameter '" + p.name + "' has no gradient buffer now: its " +
                                     module_label(p.module) + " is not between zd_backward_begin and zd_backward_end");
    fail(ZD_ERR_INVALID_STATE, "parameter '" + p.name + "' is not resident: its " + module_label(p.module) +
                                   " is not between a _begin and its _end call");
  }
  calls::Outcome o;
  o.view = it->second;
  o.loss_scale = loss_scale_;
  return o;
}

calls::Outcome RemoteModel::set_stream(void* stream) {
  // As embedded (Model::set_stream): work already ordered on the old
  // stream would not be on the new one.
  if (link_.device_type() == ZD_DEVICE_CUDA && (!in_forward_.empty() || !in_backward_.empty()))
    fail(ZD_ERR_INVALID_STATE, "zd_model_set_stream while modules are begun; set the stream between steps");
  link_.set_stream(stream);
  return {};
}

void RemoteModel::take_arenas(transport::Frame f) {
  v1::Reply announcement;
  wire::parse(f, &announcement, "arena announcement");
  const auto& arenas = announcement.new_arenas();
  std::vector<transport::UniqueFd>& fds = f.fds;
  if (static_cast<size_t>(arenas.size()) != fds.size())
    fail(ZD_ERR_INTERNAL, "the daemon announced " + std::to_string(arenas.size()) + " arenas but sent " +
                              std::to_string(fds.size()) + " fds");
  for (int i = 0; i < arenas.size(); ++i) {
    const v1::ArenaInfo& a = arenas.Get(i);
    // A GPU's region is mapped on this rank's GPU by this process's number
    // for it (the daemon's may differ: remote.cpp create_model).
    const int32_t device_id = a.device_type() == ZD_DEVICE_CUDA ? link_.device_id() : a.device_id();
    const PoolExport e{a.id(), a.size(), fds[static_cast<size_t>(i)].get(), a.device_type(), device_id};
    arenas_.insert_or_assign(a.id(), ImportedArena(e, "device-pool arena " + std::to_string(a.id()) + " from the daemon"));
  }
}  // the fds close here: the mappings keep the memory

void RemoteModel::take_announced_arenas(uint32_t frames) {
  // Each frame is mapped as it is read, so that at most one frame's fds
  // (kMaxFdsPerFrame) are open here at once, whatever the pool grew by.
  for (uint32_t i = 0; i < frames; ++i) {
    transport::Frame f = client_.arena_frame();
    try {
      take_arenas(std::move(f));
    } catch (...) {
      // The rest are read all the same: left on the socket, they would be
      // taken for the answer of a later call.
      while (++i < frames) static_cast<void>(client_.arena_frame());
      throw;
    }
  }
}

void RemoteModel::take_view(const wire::RingView& v) {
  auto a = arenas_.find(v.arena);
  if (a == arenas_.end() || v.offset > a->second.size() || v.bytes > a->second.size() - v.offset)
    fail(ZD_ERR_INTERNAL, "the daemon sent a view outside its arenas");
  const ParamRecord& p = registry_.param(v.param);
  ViewInfo info;
  info.data = a->second.data() + v.offset;
  info.bytes = v.bytes;
  info.arena = v.arena;
  info.offset = v.offset;
  info.dtype = p.dtype;
  info.shape = &p.shape;
  info.read_only = v.gradient == 0;
  info.device_type = link_.device_type();
  info.device_id = link_.device_id();
  (v.gradient != 0 ? grad_views_ : param_views_)[v.param] = info;
}

void RemoteModel::take_names(const std::string& text, calls::Outcome& o) {
  // The optimizer's name, then each state slot's, each ended by a NUL.
  if (text.empty() || text.back() != '\0') fail(ZD_ERR_INTERNAL, "the daemon's optimizer names are not NUL-ended");
  size_t at = 0;
  for (size_t end = text.find('\0'); end != std::string::npos; at = end + 1, end = text.find('\0', at)) {
    std::string name = text.substr(at, end - at);
    if (at == 0)
      o.optimizer = std::move(name);
    else
      o.slots.push_back(std::move(name));
  }
}

void RemoteModel::forget_views(const calls::Args& a) {
  for (zd_param_id p : registry_.module(a.module).params) {
    param_views_.erase(p);
    if (a.op == calls::Op::backward_end) grad_views_.erase(p);
  }
}


calls::Outcome RemoteModel::remote(const calls::Args& a, void* data) {
  // Checked here too (the same function the daemon runs) before anything
  // is copied into the staging memfd.
  calls::check(registry_, client_.info().world_size, a, data);
  // Everything the trainer's stream holds now happens before what this
  // call makes the daemon do: recorded here, at the call, also for a
  // zd_forward_end that travels later. That end may leave with a call that
  // records nothing first (a nested module's end, a staging resize's
  // request, another model's call, this model's destruction), and the
  // daemon's stream, waiting on an older record, would release the
  // module's gathered parameters while the trainer's kernels still read
  // them.
  link_.before_call();
  if (a.op == calls::Op::forward_end && client_.defers_end() && in_forward_.erase(a.module) != 0) {
    forget_views(a);
    client_.defer_end(id_, a);
    calls::Outcome o;
    o.loss_scale = loss_scale_;
    return o;
  }
  // Data through the staging memfd: a whole parameter or state slot, a
  // checkpoint directory's name.
  const bool writes = a.op == calls::Op::param_write || a.op == calls::Op::state_write ||
                      a.op == calls::Op::save || a.op == calls::Op::load;
  const bool reads = a.op == calls::Op::param_read || a.op == calls::Op::state_read;
  std::byte* st = (reads || writes) ? client_.staging(a.bytes) : nullptr;
  if (writes) std::memcpy(st, data, a.bytes);
  calls::Outcome o;
  std::vector<wire::RingView> views;
  const wire::RingReply& r = client_.call_record(id_, a, 0);
  if (a.op == calls::Op::forward_end || a.op == calls::Op::backward_end) {
    // The module's views and its begun state end whatever the answer: the
    // engine marks an end done before the work that can fail (a gradient
    // bucket refused for budget, ZD_ERR_BUDGET, which the trainer may
    // recover from), and releases what the views point into; an end it
    // refuses before that (not begun, a broken job) leaves nothing to view
    // either. Kept, they answered zd_param_view and zd_grad_view with
    // released blocks where embedded says ZD_ERR_INVALID_STATE, and a
    // stale in_backward_ refused zd_model_set_stream.
    forget_views(a);
    (a.op == calls::Op::forward_end ? in_forward_ : in_backward_).erase(a.module);
  }
  const std::span<const std::byte> tail = client_.reply_tail();
  const std::string text = client_.message_of(r);  // checks the record's lengths against the reply
  take_announced_arenas(r.arenas_follow);  // first: what is still on the socket
  for (transport::Frame& f : client_.take_stray_arenas(id_)) take_arenas(std::move(f));
  if (r.status != ZD_OK) fail(r.status, text);
  static_cast<calls::Figures&>(o) = r.figures;
  for (uint32_t i = 0; i < r.view_count; ++i) {
    wire::RingView v;
    std::memcpy(&v, tail.data() + i * sizeof v, sizeof v);
    views.push_back(v);
  }
  if (a.op == calls::Op::optimizer_info) take_names(text, o);
  for (const wire::RingView& v : views) take_view(v);
  if (a.op == calls::Op::forward_begin || a.op == calls::Op::backward_begin) link_.after_begin();
  if (a.op == calls::Op::forward_begin) in_forward_.insert(a.module);
  if (a.op == calls::Op::backward_begin) in_backward_.insert(a.module);
  if (reads) std::memcpy(data, st, a.bytes);
  loss_scale_ = o.loss_scale;
  return o;
}


}  // namespace zerod::abi::remote
