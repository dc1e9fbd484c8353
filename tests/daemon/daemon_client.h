// A client of a daemon in the test process (server::Server) that speaks the
// protocol by hand: protobuf requests on the socket, and the protobuf model
// calls an older libzerod sends (finalize, whole-parameter data through a
// staging memfd), which the daemon still answers, and the call records of
// calls that have no protobuf form (zd_model_set_lr). Enough to register,
// train nothing, write and read parameters and destroy a model without
// libzerod, whose engine would be a second copy in this process.
#pragma once

#include "ring_call.h"
#include "transport/client.h"
#include "transport/shared_memory.h"
#include "wire.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace zerod::test {

class DaemonClient {
 public:
  explicit DaemonClient(const std::string& socket) : c_(transport::connect_unix(socket, 5000)) {}

  // One request and its reply (a failed one is returned, not thrown).
  v1::Reply rpc(const v1::Request& req, std::span<const int> fds = {}) {
    const uint32_t id = next_id_++;
    wire::send(c_, wire::kRequest, id, req, fds);
    transport::Frame f = c_.receive(wire::kMaxBody, 30000);
    EXPECT_EQ(f.header.request_id, id);
    v1::Reply r;
    wire::parse(f, &r, "reply");
    return r;
  }

  // launch_id: which launch of the job this rank is of ("" as an older
  // libzerod sends: not checked).
  v1::Reply hello(const char* role = "rank", int rank = 0, int world = 1, const std::string& key = "",
                  const std::string& launch_id = "") {
    v1::Request r;
    r.mutable_hello()->set_abi_version(ZD_ABI_VERSION);
    r.mutable_hello()->set_role(role);
    r.mutable_hello()->set_rank(rank);
    r.mutable_hello()->set_world_size(world);
    r.mutable_hello()->set_job_key(key);
    r.mutable_hello()->set_launch_id(launch_id);
    return rpc(r);
  }

  // A model of the script: its id, or -1 (a failure is the test's).
  int create(const std::string& script) {
    const v1::Reply rep = create_reply(script);
    EXPECT_FALSE(rep.has_error()) << rep.error().message();
    return rep.has_error() ? -1 : rep.create_model().model();
  }
  // The same, the reply as it came (a refused create is the test's to check).
  v1::Reply create_reply(const std::string& script) {
    v1::Request r;
    r.mutable_create_model()->set_script_text(script);
    r.mutable_create_model()->set_script_name("kept.lua");
    return rpc(r);
  }

  // A call of the model's that carries no data (backward_begin, step, ...).
  v1::Reply call(int model, v1::ModelCall::Op op, int module = 0) {
    v1::Request r;
    r.mutable_call()->set_model(model);
    r.mutable_call()->set_op(op);
    r.mutable_call()->set_module(module);
    return rpc(r);
  }

  // An f32 parameter of shape {n} in module `module`; with init, its initial
  // values come through the staging memfd.
  v1::Reply register_param(int model, const std::string& name, const std::string& module, int64_t n,
                           const std::vector<float>* init = nullptr) {
    v1::Request r;
    v1::RegisterParam* p = r.mutable_register_param();
    p->set_model(model);
    p->set_name(name);
    p->set_module(module);
    p->set_dtype(ZD_DTYPE_F32);
    p->add_shape(n);
    if (init) {
      stage(init->data(), init->size() * sizeof(float));
      p->set_has_init(true);
      p->set_staging_offset(0);
    }
    return rpc(r);
  }

  // A call as today's libzerod sends it without a ring: its record in a
  // kCall frame, answered by a kCallReply frame whose first bytes are the
  // reply record (ring_call.h), returned (its status says how it went).
  wire::RingReply call_record(int model, const calls::Args& a) {
    wire::RingRequest req{};
    req.kind = wire::RingKind::call;
    req.model = model;
    req.args = a;
    const uint32_t id = next_id_++;
    wire::send_bytes(c_, wire::kCall, id, std::as_bytes(std::span(&req, 1)));
    transport::Frame f = c_.receive(wire::kMaxBody, 30000);
    EXPECT_EQ(f.header.type, wire::kCallReply);
    EXPECT_EQ(f.header.request_id, id);
    wire::RingReply r{};
    std::memcpy(&r, f.body.data(), std::min(sizeof r, f.body.size()));
    return r;
  }

  v1::Reply finalize(int model) {
    v1::Request r;
    r.mutable_call()->set_model(model);
    r.mutable_call()->set_op(v1::ModelCall::FINALIZE);
    return rpc(r);
  }

  v1::Reply write(int model, int param, const std::vector<float>& values) {
    stage(values.data(), values.size() * sizeof(float));
    v1::Request r;
    fill(r.mutable_param_write(), model, param, values.size());
    return rpc(r);
  }

  // The parameter's n values, or nothing (a failure is the test's).
  std::vector<float> read(int model, int param, size_t n) {
    stage(nullptr, n * sizeof(float));
    v1::Request r;
    fill(r.mutable_param_read(), model, param, n);
    const v1::Reply rep = rpc(r);
    EXPECT_FALSE(rep.has_error()) << rep.error().message();
    if (rep.has_error()) return {};
    std::vector<float> out(n);
    std::memcpy(out.data(), staging_.data(), n * sizeof(float));
    return out;
  }

  v1::Reply destroy(int model) {
    v1::Request r;
    r.mutable_destroy_model()->set_model(model);
    return rpc(r);
  }

  v1::Reply status() {
    v1::Request r;
    r.mutable_status();
    return rpc(r);
  }

  transport::Connection& connection() { return c_; }

 private:
  static constexpr uint64_t kStagingBytes = 1 << 20;

  // Copies bytes (none: only makes sure there is room) to the start of the
  // staging memfd, sent to the daemon once.
  void stage(const void* bytes, size_t n) {
    ASSERT_LE(n, kStagingBytes);
    if (!staging_) {
      const transport::UniqueFd fd = transport::create_sealed_memfd("test-staging", kStagingBytes);
      staging_ = transport::SharedMapping(fd.get(), kStagingBytes, kStagingBytes, "the test's staging memfd");
      v1::Request r;
      r.mutable_staging()->set_size(kStagingBytes);
      const int fds[1] = {fd.get()};
      const v1::Reply rep = rpc(r, fds);
      ASSERT_FALSE(rep.has_error()) << rep.error().message();
    }
    if (bytes) std::memcpy(staging_.data(), bytes, n);
  }
  static void fill(v1::ParamData* d, int model, int param, size_t n) {
    d->set_model(model);
    d->set_param(param);
    d->set_dtype(ZD_DTYPE_F32);
    d->set_bytes(n * sizeof(float));
    d->set_staging_offset(0);
  }

  transport::Connection c_;
  transport::SharedMapping staging_;
  uint32_t next_id_ = 1;
};

}  // namespace zerod::test
