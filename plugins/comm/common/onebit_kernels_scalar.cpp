// The scalar reference kernels, also the fallback on CPUs without AVX2.
#include "onebit_element.h"

namespace zerod::comm::onebit::detail::scalar {
namespace {

double worker_pack(const float* buf, const float* err, size_t n, uint8_t* out) {
  return worker_pack_loop(buf, err, 0, n, out);
}

void worker_commit(float* buf, float* err, size_t n, float s, const uint8_t* server, float t) {
  worker_commit_loop(buf, err, 0, n, s, server, t);
}

double server_pack(const ServerInput& in, const float* err, size_t n, uint8_t* out) {
  return server_pack_loop(in, err, 0, n, out);
}

void server_commit(const ServerInput& in, float* err, size_t n, float t) { server_commit_loop(in, err, 0, n, t); }

}  // namespace

const Kernels kTable = {worker_pack, worker_commit, server_pack, server_commit};

}  // namespace zerod::comm::onebit::detail::scalar
