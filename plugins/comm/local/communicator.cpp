#include "communicator.h"

namespace zerod::comm {

Communicator::Communicator(int world, double spin_us)
    : rv_(world, 0, world, spin_us),
      srcs_(new const void*[static_cast<size_t>(world) * static_cast<size_t>(world)]),
      dsts_(new void*[static_cast<size_t>(world) * static_cast<size_t>(world)]) {}

zd_status Communicator::started(const Rendezvous::Started& s) noexcept {
  const int world = rv_.world();
  const size_t offset = static_cast<size_t>(s.index) * static_cast<size_t>(world);
  do_share(s.calls, world, s.index, Scratch{srcs_.get() + offset, dsts_.get() + offset});
  const Call& me = s.calls[s.index];
  if (shares_buffers(me, world)) rv_.meet(s.index);
  // A step of a compressed all-reduce counts its bytes; the whole call
  // counts as one collective (compressed.cpp).
  rv_.count(s.index, ring_bytes(me, world, s.index), me.compressed ? 0 : 1);
  return ZD_OK;
}

zd_comm_figures Communicator::figures(int rank) const noexcept {
  zd_comm_figures f{};
  f.struct_size = sizeof f;
  f.bytes_sent = rv_.bytes_sent(rank);
  f.network_bytes_sent = 0;
  f.collectives = rv_.collectives(rank);
  return f;
}

}  // namespace zerod::comm
