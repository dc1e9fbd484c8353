// What a comm plugin's create() checks before it builds anything: the out
// pointer, one value per hyperparameter spec, each value in its spec's range
// (whole where the spec is not a plain number: the host checks the specs
// too, but a plugin does not rely on it), and a config the plugin's header
// knows whose ranks are a block of the job's. The mpi and nccl plugins
// share it; the local plugin checks its one
// value between its own checks.
#ifndef ZEROD_COMM_COMMON_CREATE_CHECKS_H
#define ZEROD_COMM_COMMON_CREATE_CHECKS_H

#include "plugin_text.h"

#include <cmath>
#include <cstddef>

namespace zerod::comm {

inline zd_status check_create_args(const zd_hparam_spec* specs, size_t spec_count, const double* values,
                                   size_t value_count, const zd_comm_config* config, void** out_instance, char* err,
                                   size_t err_size) noexcept {
  if (out_instance == nullptr) {
    set_error(err, err_size, "out_instance is NULL");
    return ZD_ERR_INVALID_ARGUMENT;
  }
  *out_instance = nullptr;
  if (value_count != spec_count || values == nullptr) {
    set_error(err, err_size, "expected %zu hyperparameter values, got %zu", spec_count,
              values == nullptr ? size_t{0} : value_count);
    return ZD_ERR_INVALID_ARGUMENT;
  }
  for (size_t i = 0; i < spec_count; ++i) {
    const zd_hparam_spec& s = specs[i];
    const double v = values[i];
    const bool whole = s.type == ZD_HPARAM_NUMBER || v == std::floor(v);
    if (!std::isfinite(v) || v < s.min || v > s.max || !whole) {
      set_error(err, err_size, "%s = %g: must be %s in [%g, %g]", s.name, v,
                s.type == ZD_HPARAM_NUMBER ? "a number" : "a whole number", s.min, s.max);
      return ZD_ERR_CONFIG;
    }
  }
  if (config == nullptr || config->struct_size < sizeof(zd_comm_config)) {
    set_error(err, err_size, "config is %s", config == nullptr ? "NULL" : "shorter than zd_comm_config");
    return ZD_ERR_INVALID_ARGUMENT;
  }
  const zd_comm_config& c = *config;
  if (c.world_size < 1 || c.local_ranks < 1 || c.first_local_rank < 0 ||
      c.first_local_rank > c.world_size - c.local_ranks) {
    set_error(err, err_size, "world_size = %d, first_local_rank = %d, local_ranks = %d: not a block of ranks of the job",
              c.world_size, c.first_local_rank, c.local_ranks);
    return ZD_ERR_INVALID_ARGUMENT;
  }
  return ZD_OK;
}

}  // namespace zerod::comm

#endif  // ZEROD_COMM_COMMON_CREATE_CHECKS_H
