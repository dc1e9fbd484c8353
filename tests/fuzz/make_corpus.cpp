// Writes the seed corpora of the binary fuzz targets from real protocol
// messages: `zerod_fuzz_make_corpus <tests/fuzz/corpus>` fills frame_reader/
// and request_handler/ (docs/fuzzing.md says when to run it again). Each
// seed is a short conversation a client could really have, or a known way
// to get one wrong, so the fuzzer starts from deep inside the protocol.
#include "transport/frame.h"
#include "wire.h"

#include <zerod/zerod.h>

#include <cstdint>
#include <cstdio>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace zerod;

namespace {

std::string frame(const std::string& body, uint32_t id, uint16_t flags = 0, uint16_t type = wire::kRequest,
                  uint32_t magic = transport::kFrameMagic, int64_t length = -1) {
  transport::FrameHeader h;
  h.magic = magic;
  h.length = length < 0 ? static_cast<uint32_t>(body.size()) : static_cast<uint32_t>(length);
  h.request_id = id;
  h.type = type;
  h.flags = flags;
  const auto raw = transport::encode_header(h);
  return std::string(reinterpret_cast<const char*>(raw.data()), raw.size()) + body;
}

std::string msg(const v1::Request& r) {
  std::string s;
  r.SerializeToString(&s);
  return s;
}

// A conversation: requests numbered from 1, each with its fd flags.
struct Talk {
  std::string bytes;
  uint32_t id = 1;
  Talk& add(const v1::Request& r, uint16_t flags = 0) {
    bytes += frame(msg(r), id++, flags);
    return *this;
  }
};

v1::Request hello(const char* role = "rank") {
  v1::Request r;
  r.mutable_hello()->set_abi_version(ZD_ABI_VERSION);
  r.mutable_hello()->set_role(role);
  r.mutable_hello()->set_rank(0);
  r.mutable_hello()->set_world_size(1);
  return r;
}

v1::Request create(const std::string& script) {
  v1::Request r;
  r.mutable_create_model()->set_script_text(script);
  r.mutable_create_model()->set_script_name("seed.lua");
  return r;
}

v1::Request reg(const std::string& name, const std::string& module, std::vector<int64_t> shape,
                bool init = false, int32_t dtype = ZD_DTYPE_F32, uint64_t offset = 0) {
  v1::Request r;
  v1::RegisterParam* p = r.mutable_register_param();
  p->set_model(0);
  p->set_name(name);
  p->set_module(module);
  p->set_dtype(dtype);
  for (int64_t e : shape) p->add_shape(e);
  p->set_has_init(init);
  p->set_init_dtype(ZD_DTYPE_F32);
  p->set_staging_offset(offset);
  return r;
}

v1::Request call(v1::ModelCall::Op op, int32_t module = 0, int64_t step = 0) {
  v1::Request r;
  r.mutable_call()->set_model(0);
  r.mutable_call()->set_op(op);
  r.mutable_call()->set_module(module);
  r.mutable_call()->set_step(step);
  r.mutable_call()->set_rank(-1);
  return r;
}

v1::Request staging(uint64_t size) {
  v1::Request r;
  r.mutable_staging()->set_size(size);
  return r;
}

v1::Request data(bool write, bool state, int32_t param, uint64_t bytes, uint64_t offset = 0, int32_t slot = 0) {
  v1::Request r;
  v1::ParamData* d = state ? (write ? r.mutable_state_write() : r.mutable_state_read())
                           : (write ? r.mutable_param_write() : r.mutable_param_read());
  d->set_model(0);
  d->set_param(param);
  d->set_dtype(ZD_DTYPE_F32);
  d->set_bytes(bytes);
  d->set_staging_offset(offset);
  d->set_slot(slot);
  return r;
}

v1::Request memory(int32_t tier, int32_t kind) {
  v1::Request r;
  r.mutable_memory()->set_model(0);
  r.mutable_memory()->set_rank(-1);
  r.mutable_memory()->set_tier(tier);
  r.mutable_memory()->set_kind(kind);
  return r;
}

v1::Request status() {
  v1::Request r;
  r.mutable_status();
  return r;
}

// A model call as today's libzerod sends it without a ring: the call
// ring's record in a type 3 frame.
std::string record(uint32_t id, calls::Op op, int32_t module = 0, double value = 0.0) {
  // Its fields copied into zeroed bytes, so padding is zero too: the seed
  // is the same bytes on every run (fuzz.seed_corpus_is_current compares
  // them). The fields not written are zero; those whose defaults are not
  // (calls::Args's op and rank) are written as a value-initialized record
  // holds them.
  std::string raw(sizeof(wire::RingRequest), '\0');
  const auto put = [&raw](size_t at, const auto& v) { std::memcpy(raw.data() + at, &v, sizeof v); };
  const calls::Args defaults{};
  for (const size_t at : {offsetof(wire::RingRequest, args), offsetof(wire::RingRequest, deferred)}) {
    put(at + offsetof(calls::Args, op), defaults.op);
    put(at + offsetof(calls::Args, rank), defaults.rank);
  }
  const size_t args = offsetof(wire::RingRequest, args);
  put(offsetof(wire::RingRequest, kind), wire::RingKind::call);
  put(args + offsetof(calls::Args, op), op);
  put(args + offsetof(calls::Args, module), module);
  put(args + offsetof(calls::Args, value), value);
  return frame(raw, id, 0, wire::kCall);
}

// One training step over the modules 0..n-1.
void step(Talk& t, int modules) {
  for (int m = 0; m < modules; ++m) t.add(call(v1::ModelCall::FORWARD_BEGIN, m)).add(call(v1::ModelCall::FORWARD_END, m));
  for (int m = modules - 1; m >= 0; --m)
    t.add(call(v1::ModelCall::BACKWARD_BEGIN, m)).add(call(v1::ModelCall::BACKWARD_END, m));
  t.add(call(v1::ModelCall::STEP));
}

// Flags for the request handler's harness (request_handler_fuzz.cpp).
constexpr uint16_t kSealed = 1, kUnsealed = 2, kPipe = 3;
constexpr uint16_t k4K = 0 << 2, k64K = 1 << 2, k1M = 2 << 2, kTwice = 16;

void write(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out << bytes;
  if (!out) {
    std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name.c_str());
    std::exit(1);
  }
}

// A target's folder under the corpus root, made if it is not there: the
// writer is run into a fresh folder too (a scratch copy to compare).
std::string target_dir(const std::string& root, const char* target) {
  const std::string dir = root + "/" + target;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "cannot make the folder %s: %s\n", dir.c_str(), ec.message().c_str());
    std::exit(1);
  }
  return dir;
}

void usage(FILE* out, const char* program) {
  std::fprintf(out,
               "usage: %s <corpus dir>\n"
               "  Writes the seed corpora of the binary fuzz targets, <corpus dir>/frame_reader/ and\n"
               "  <corpus dir>/request_handler/, making the folders; the committed ones are tests/fuzz/corpus.\n",
               program);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string arg = argc == 2 ? argv[1] : "";
  if (arg == "-h" || arg == "--help") {
    usage(stdout, argv[0]);
    return 0;
  }
  // An option is never a folder here (a folder named so is written ./-x).
  if (argc != 2 || arg.empty() || arg[0] == '-') {
    usage(stderr, argv[0]);
    return 2;
  }
  const std::string& root = arg;
  const std::string adamw = "return { optimizer = { type = 'adamw', lr = 0.01 }, zero = { stage = 0 } }";
  const std::string stage3 =
      "return { optimizer = { type = 'adam', lr = 0.01 }, zero = { stage = 3, param_persistence_threshold = 0 } }";

  // --- request_handler: conversations ------------------------------------
  const std::string rh = target_dir(root, "request_handler");
  write(rh, "01-hello", Talk().add(hello()).bytes);
  write(rh, "02-observer-status", Talk().add(hello("observer")).add(status()).bytes);
  {
    Talk t;
    t.add(hello()).add(create(adamw)).add(reg("w1", "m1", {4, 8})).add(reg("w2", "m2", {8}));
    t.add(call(v1::ModelCall::FINALIZE));
    step(t, 2);
    t.add(call(v1::ModelCall::OPTIMIZER_INFO)).add(call(v1::ModelCall::COMM_FIGURES)).add(memory(0, 0));
    write(rh, "03-train-one-step", t.bytes);
  }
  {
    Talk t;
    t.add(hello()).add(create(adamw)).add(staging(65536), kSealed | k64K).add(reg("w", "m", {16}, true));
    t.add(call(v1::ModelCall::FINALIZE));
    step(t, 1);
    t.add(data(false, false, 0, 64)).add(data(true, false, 0, 64)).add(data(false, true, 0, 64, 0, 0));
    t.add(data(true, true, 0, 64, 0, 1)).add(call(v1::ModelCall::SET_STEP, 0, 7));
    v1::Request destroy;
    destroy.mutable_destroy_model()->set_model(0);
    t.add(destroy);
    write(rh, "04-staging-read-write-state", t.bytes);
  }
  write(rh, "05-short-memfd", Talk().add(hello()).add(create(adamw)).add(staging(4 << 20), kSealed | k1M)
                                   .add(reg("w", "m", {1000}, true, ZD_DTYPE_F32, 65536)).bytes);
  write(rh, "06-unsealed-memfd", Talk().add(hello()).add(create(adamw)).add(staging(65536), kUnsealed | k64K)
                                       .add(reg("w", "m", {16}, true)).bytes);
  write(rh, "07-pipe-and-two-fds", Talk().add(hello()).add(staging(4096), kPipe | k4K).add(staging(4096), kSealed | kTwice)
                                         .add(staging(0), kSealed).bytes);
  {
    Talk t;
    t.add(hello()).add(create(stage3)).add(reg("a", "m1", {33})).add(reg("b", "m2", {2, 3, 5}));
    t.add(call(v1::ModelCall::FINALIZE));
    step(t, 2);
    step(t, 2);
    write(rh, "08-stage3-two-steps", t.bytes);
  }
  {
    Talk t;
    t.add(hello()).add(create(adamw)).add(reg("w", "m", {-1})).add(reg("w", "m", {int64_t{1} << 40, int64_t{1} << 40}, true));
    t.add(reg("w", "m", {4}, true, 77)).add(call(static_cast<v1::ModelCall::Op>(99))).add(memory(9, -3));
    t.add(data(false, false, 5, UINT64_MAX, UINT64_MAX));
    write(rh, "09-absurd-numbers", t.bytes);
  }
  write(rh, "10-bf16", Talk().add(hello()).add(create("return { precision = 'bf16', optimizer = { type = 'sgd', lr = 0.1 } }"))
                           .add(reg("w", "m", {64}, false, ZD_DTYPE_BF16)).add(call(v1::ModelCall::FINALIZE)).bytes);
  {
    Talk t;
    t.add(hello()).add(create("return { optimizer = { type = 'sgd' }, daemon = { keep_state = true } }"));
    t.add(reg("w", "m", {8})).add(call(v1::ModelCall::FINALIZE));
    step(t, 1);
    write(rh, "11-keep-state", t.bytes);
  }
  {
    Talk t;  // not requests at all: replies, junk, a body the header overstates
    t.bytes += frame(msg(hello()), 1, 0, wire::kReply);
    t.bytes += frame("\xff\xff\xff\xff", 2);
    t.bytes += frame(msg(status()), 3, 0, wire::kRequest, transport::kFrameMagic, 1000);
    write(rh, "12-not-requests", t.bytes);
  }
  {
    Talk t;  // a step as call records in frames (and the lr set), then a short record and an unknown op
    t.add(hello()).add(create(adamw)).add(reg("w1", "m1", {4, 8})).add(reg("w2", "m2", {8}));
    t.bytes += record(t.id++, calls::Op::finalize);
    for (int m = 0; m < 2; ++m) {
      t.bytes += record(t.id++, calls::Op::forward_begin, m);
      t.bytes += record(t.id++, calls::Op::forward_end, m);
    }
    for (int m = 1; m >= 0; --m) {
      t.bytes += record(t.id++, calls::Op::backward_begin, m);
      t.bytes += record(t.id++, calls::Op::backward_end, m);
    }
    t.bytes += record(t.id++, calls::Op::step);
    t.bytes += record(t.id++, calls::Op::optimizer_info);
    t.bytes += record(t.id++, calls::Op::set_lr, 0, 0.001);
    t.bytes += record(t.id++, calls::Op::memory);
    t.bytes += record(t.id++, calls::Op::step).substr(0, 40);
    write(rh, "13-call-records", t.bytes + record(t.id++, static_cast<calls::Op>(77)));
  }

  // --- frame_reader: byte 0 is the harness's control byte ----------------
  const std::string fr = target_dir(root, "frame_reader");
  const std::string c0(1, '\0');
  write(fr, "01-one-frame", c0 + frame(msg(hello()), 1));
  write(fr, "02-three-frames", c0 + frame(msg(hello()), 1) + frame(msg(status()), 2) + frame(msg(create(adamw)), 3));
  write(fr, "03-oversize-then-good", std::string(1, '\x80') + frame(std::string(200, 'x'), 1) + frame(msg(status()), 2));
  write(fr, "04-http", c0 + "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  write(fr, "05-other-version", c0 + frame(msg(hello()), 1, 0, wire::kRequest, 0x3246445AU));
  write(fr, "06-torn-header", c0 + frame(msg(hello()), 1).substr(0, 10));
  write(fr, "07-torn-body", c0 + frame(msg(create(adamw)), 1).substr(0, 30));
  write(fr, "08-fds-on-first-byte", std::string(1, '\x01') + frame(msg(staging(4096)), 1));
  write(fr, "09-fds-and-frames", std::string(1, '\x03') + frame(msg(staging(4096)), 1) + frame("", 2));
  write(fr, "10-empty-body", c0 + frame("", 7));
  write(fr, "11-absurd-length", c0 + frame("abc", 1, 0, wire::kRequest, transport::kFrameMagic, 0xFFFFFFFFLL));
  write(fr, "12-small-limit-mix",
        std::string(1, '\x82') + frame(std::string(64, 'y'), 1) + frame(std::string(65, 'z'), 2) + frame("q", 3));
  std::printf("wrote the seed corpora under %s\n", root.c_str());
  return 0;
}
