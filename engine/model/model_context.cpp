#include "model/model_context.h"

#include <algorithm>

namespace zerod {

void ModelContext::owned_part(const ParamRecord& p, int rank, uint64_t* lo, uint64_t* hi) const {
  const ParamGroup& g = registry.groups()[static_cast<size_t>(p.group)];
  const uint64_t ob = owned_begin(g, rank);
  *lo = std::max(p.full_offset, ob);
  *hi = std::min(p.full_offset + static_cast<uint64_t>(p.numel), ob + owned_count(g));
}

ModelContext::OwnedSpan ModelContext::owned_span(const ParamRecord& p, int rank) const {
  OwnedSpan s;
  if (registry.partitioning() == Partitioning::Param) {
    s.at = p.flat_offset;
    s.from = static_cast<uint64_t>(rank) * p.stride;
    s.count = p.shard_real(rank);
    return s;
  }
  const ParamGroup& g = registry.groups()[static_cast<size_t>(p.group)];
  uint64_t lo, hi;
  owned_part(p, rank, &lo, &hi);
  if (lo >= hi) return s;
  s.at = lo - owned_begin(g, rank);
  s.from = lo - p.full_offset;
  s.count = hi - lo;
  return s;
}

zd_comm_call ModelContext::comm_call(int rank, uint64_t tag, const std::string& what) const {
  zd_comm_call c{};
  c.struct_size = sizeof c;
  c.rank = rank;
  c.tag = tag;
  const double t = config.comm_timeout_s;
  c.timeout_ms = t > 0 ? static_cast<uint32_t>(std::min(t * 1000.0, 4.0e9)) : 0;
  c.what = what.c_str();
  return c;
}

void ModelContext::wait(const CommStream::Ticket& t) const {
  try {
    t.wait();
  } catch (const Error& e) {
    failures_.broken_by(e);
  }
}

void ModelContext::drain(CommStream& s) const {
  try {
    s.drain();
  } catch (const Error& e) {
    failures_.broken_by(e);
  }
}

}  // namespace zerod
