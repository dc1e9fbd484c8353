// A model on the daemon, as this side holds it (remote_client.h): the
// calls answered here (views, the loss scale, the stream), the arenas and
// views the daemon's replies announce, and the ring call path of every
// other table call (a socket frame where there is no ring:
// remote_socket_codec.cpp).
#include "remote_client.h"

#include "error.h"

#include <cstring>
#include <string>
#include <utility>

namespace zerod::abi::remote {

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
    case calls::Op::optimizer_info: return optimizer_info();
    case calls::Op::save:
    case calls::Op::load: return path_call(a, data);
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
  link_.set_stream(stream);
  return {};
}

void RemoteModel::take_arenas(const google::protobuf::RepeatedPtrField<v1::ArenaInfo>& arenas,
                              std::vector<transport::UniqueFd>& fds) {
  if (static_cast<size_t>(arenas.size()) != fds.size())
    fail(ZD_ERR_INTERNAL, "the daemon announced " + std::to_string(arenas.size()) + " arenas but sent " +
                              std::to_string(fds.size()) + " fds");
  for (int i = 0; i < arenas.size(); ++i) {
    const v1::ArenaInfo& a = arenas.Get(i);
    const PoolExport e{a.id(), a.size(), fds[static_cast<size_t>(i)].get(), a.device_type(), a.device_id()};
    arenas_.insert_or_assign(a.id(), ImportedArena(e, "device-pool arena " + std::to_string(a.id()) + " from the daemon"));
  }
  fds.clear();  // the mappings keep the memory; the fds can go
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
  if (a.op == calls::Op::forward_end && client_.defers_end() && in_forward_.erase(a.module) != 0) {
    forget_views(a);
    client_.defer_end(id_, a);
    calls::Outcome o;
    o.loss_scale = loss_scale_;
    return o;
  }
  const bool writes = a.op == calls::Op::param_write || a.op == calls::Op::state_write;
  const bool reads = a.op == calls::Op::param_read || a.op == calls::Op::state_read;
  std::byte* st = (reads || writes) ? client_.staging(a.bytes) : nullptr;
  if (writes) std::memcpy(st, data, a.bytes);
  calls::Outcome o;
  std::vector<wire::RingView> views;
  link_.before_call();
  if (client_.has_ring()) {
    const wire::RingReply& r = client_.ring_call(id_, a, 0);
    const std::span<const std::byte> tail = client_.reply_tail();
    const std::string message = client_.message_of(r);  // checks the record's lengths against the slot
    std::vector<transport::Frame> frames = client_.take_stray_arenas(id_);
    if (r.arenas_follow) frames.push_back(client_.arena_frame());
    for (transport::Frame& f : frames) {
      v1::Reply ar;
      wire::parse(f, &ar, "arena announcement");
      take_arenas(ar.new_arenas(), f.fds);
    }
    if (r.status != ZD_OK) fail(r.status, message);
    static_cast<calls::Figures&>(o) = r.figures;
    for (uint32_t i = 0; i < r.view_count; ++i) {
      wire::RingView v;
      std::memcpy(&v, tail.data() + i * sizeof v, sizeof v);
      views.push_back(v);
    }
  } else {
    o = socket_call(a);  // a daemon without the ring
    views = std::move(socket_views_);
    socket_views_.clear();
  }
  for (const wire::RingView& v : views) take_view(v);
  if (a.op == calls::Op::forward_begin || a.op == calls::Op::backward_begin) link_.after_begin();
  if (a.op == calls::Op::forward_end || a.op == calls::Op::backward_end) forget_views(a);
  if (a.op == calls::Op::forward_begin) in_forward_.insert(a.module);
  if (a.op == calls::Op::forward_end) in_forward_.erase(a.module);
  if (reads) std::memcpy(data, st, a.bytes);
  loss_scale_ = o.loss_scale;
  return o;
}


}  // namespace zerod::abi::remote
