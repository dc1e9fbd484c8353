// zd_comm_v2::compressed_all_reduce for a plugin built on the Rendezvous:
// the shared 1-bit driver (plugins/comm/common/onebit.h) over the plugin's
// own u8 all_to_all and all_gather. Each exchange is a collective of its own
// to the rendezvous, marked as a step of this call (Call::compressed), so a
// rank elsewhere fails it with a message that says so; together they count
// as one completed collective, and their bytes as what they send.
#ifndef ZEROD_COMM_LOCAL_COMPRESSED_H
#define ZEROD_COMM_LOCAL_COMPRESSED_H

#include <zerod/zerod_plugin.h>

#include "call.h"
#include "rendezvous.h"

namespace zerod::comm {

// What runs one rank's side of a collective (the plugin's instance).
class Runner {
 public:
  virtual zd_status run(const zd_comm_call* call, Call c) noexcept = 0;

 protected:
  ~Runner() = default;
};

// A call the rendezvous refuses (NULL, short, a rank it does not serve) or
// invalid arguments fail it as for any collective, on every rank.
zd_status compressed_all_reduce(Runner& runner, Rendezvous& rv, const zd_comm_call* call, float* buf, uint64_t count,
                                float* worker_error, float* server_error) noexcept;

}  // namespace zerod::comm

#endif  // ZEROD_COMM_LOCAL_COMPRESSED_H
