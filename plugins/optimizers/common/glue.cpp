#include "glue.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace zerod::optim::glue {
namespace {

static_assert(static_cast<int32_t>(Dtype::f32) == ZD_DTYPE_F32 &&
              static_cast<int32_t>(Dtype::bf16) == ZD_DTYPE_BF16 &&
              static_cast<int32_t>(Dtype::f16) == ZD_DTYPE_F16);
static_assert(static_cast<int32_t>(Isa::scalar) == ZD_ISA_SCALAR && static_cast<int32_t>(Isa::avx2) == ZD_ISA_AVX2 &&
              static_cast<int32_t>(Isa::avx512) == ZD_ISA_AVX512);

// "name" for a scalar spec, "name[i]" for an element of a list.
void spec_label(char* out, size_t size, const zd_hparam_spec& s, int32_t i) {
  if (s.count > 1) std::snprintf(out, size, "%s[%d]", s.name, i);
  else std::snprintf(out, size, "%s", s.name);
}

bool below_min(const zd_hparam_spec& s, double x) {
  return (s.flags & ZD_HPARAM_MIN_EXCLUSIVE) ? !(x > s.min) : !(x >= s.min);
}

bool above_max(const zd_hparam_spec& s, double x) {
  return (s.flags & ZD_HPARAM_MAX_EXCLUSIVE) ? !(x < s.max) : !(x <= s.max);
}

}  // namespace

size_t value_count(const zd_hparam_spec* specs, uint32_t count) {
  size_t n = 0;
  for (uint32_t i = 0; i < count; ++i) n += static_cast<size_t>(specs[i].count);
  return n;
}

zd_status check_values(const zd_hparam_spec* specs, uint32_t count, const double* values,
                       size_t n_values, char* err, size_t err_size) {
  const size_t want = value_count(specs, count);
  if (n_values != want) {
    set_error(err, err_size, "expected %zu hyperparameter values, got %zu", want, n_values);
    return ZD_ERR_INVALID_ARGUMENT;
  }
  if (values == nullptr && want > 0) {
    set_error(err, err_size, "hyperparameter values are NULL");
    return ZD_ERR_INVALID_ARGUMENT;
  }
  size_t k = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const zd_hparam_spec& s = specs[i];
    for (int32_t j = 0; j < s.count; ++j, ++k) {
      const double x = values[k];
      char label[96];
      spec_label(label, sizeof label, s, j);
      if (s.type == ZD_HPARAM_BOOL) {
        if (x != 0.0 && x != 1.0) {
          set_error(err, err_size, "%s = %g: must be a bool (0 or 1)", label, x);
          return ZD_ERR_CONFIG;
        }
        continue;
      }
      if (!std::isfinite(x)) {
        set_error(err, err_size, "%s = %g: must be a finite number", label, x);
        return ZD_ERR_CONFIG;
      }
      if (s.type == ZD_HPARAM_INTEGER && x != std::trunc(x)) {
        set_error(err, err_size, "%s = %g: must be an integer", label, x);
        return ZD_ERR_CONFIG;
      }
      if (below_min(s, x)) {
        set_error(err, err_size, "%s = %g: must be %s %g", label, x,
                  (s.flags & ZD_HPARAM_MIN_EXCLUSIVE) ? ">" : ">=", s.min);
        return ZD_ERR_CONFIG;
      }
      if (above_max(s, x)) {
        set_error(err, err_size, "%s = %g: must be %s %g", label, x,
                  (s.flags & ZD_HPARAM_MAX_EXCLUSIVE) ? "<" : "<=", s.max);
        return ZD_ERR_CONFIG;
      }
    }
  }
  return ZD_OK;
}

Host copy_host(const zd_host_services* services) {
  Host h;
  if (services == nullptr) return h;
  const size_t need = offsetof(zd_host_services, log) + sizeof(services->log);
  if (services->struct_size < need) return h;
  h.host = services->host;
  h.log = services->log;
  return h;
}

void log(const Host& host, zd_log_level level, const char* plugin, const char* fmt, ...) {
  if (host.log == nullptr) return;
  char message[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  host.log(host.host, level, plugin, message);
}

zd_status read_update(const zd_optimizer_update* u, uint32_t slots, Range* r, Needs needs) {
  if (u == nullptr || u->struct_size < sizeof(zd_optimizer_update)) return ZD_ERR_INVALID_ARGUMENT;
  const Dtype grad_dtype = static_cast<Dtype>(u->grad_dtype);
  const Dtype work_dtype = static_cast<Dtype>(u->work_dtype);
  if (needs.grad && !dtype_valid(grad_dtype)) return ZD_ERR_INVALID_ARGUMENT;
  if (u->work != nullptr && !dtype_valid(work_dtype)) return ZD_ERR_INVALID_ARGUMENT;
  if (u->step < 1 || !std::isfinite(u->lr) || u->lr < 0.0 || !std::isfinite(u->grad_scale)) {
    return ZD_ERR_INVALID_ARGUMENT;
  }
  if (slots > ZD_OPTIMIZER_MAX_STATE) return ZD_ERR_INTERNAL;
  if (u->count > 0) {
    if ((needs.master && u->master == nullptr) || (needs.grad && u->grad == nullptr)) {
      return ZD_ERR_INVALID_ARGUMENT;
    }
    for (uint32_t k = 0; k < slots; ++k) {
      if (u->state[k] == nullptr) return ZD_ERR_INVALID_ARGUMENT;
    }
  }
  r->count = static_cast<size_t>(u->count);
  r->master = u->master;
  r->grad = needs.grad ? u->grad : nullptr;
  r->grad_dtype = needs.grad ? grad_dtype : Dtype::f32;
  r->work = u->work;
  r->work_dtype = work_dtype;
  return ZD_OK;
}

zd_status read_state_dtype(const zd_optimizer_update* u, Dtype* out) {
  if (u == nullptr) return ZD_ERR_INVALID_ARGUMENT;
  switch (u->state_dtype) {
    case 0:
    case ZD_DTYPE_F32: *out = Dtype::f32; return ZD_OK;
    case ZD_DTYPE_BF16: *out = Dtype::bf16; return ZD_OK;
    default: return ZD_ERR_INVALID_ARGUMENT;
  }
}

namespace plain {

zd_status plan(const void*, int64_t step, int32_t, int32_t, zd_optimizer_plan* out) noexcept {
  if (step < 1 || out == nullptr) return ZD_ERR_INVALID_ARGUMENT;
  *out = zd_optimizer_plan{};
  out->struct_size = sizeof *out;
  out->grads = ZD_GRADS_AVERAGED;
  out->ops[0] = ZD_OP_PASS_GRAD;
  return ZD_OK;
}
uint32_t none(const void*) noexcept { return 0; }
zd_stat_op sum(const void*, uint32_t) noexcept { return ZD_STAT_SUM; }
zd_status any_partitions(const void*, uint32_t, char*, size_t) noexcept { return ZD_OK; }
int32_t never(const void*) noexcept { return 0; }

}  // namespace plain

zd_status resolve_isa(zd_isa isa, Isa* out) {
  if (isa == ZD_ISA_AUTO) {
    *out = best_isa();
    return ZD_OK;
  }
  if (isa != ZD_ISA_SCALAR && isa != ZD_ISA_AVX2 && isa != ZD_ISA_AVX512) return ZD_ERR_NOT_IMPLEMENTED;
  const Isa k = static_cast<Isa>(isa);
  if (!isa_supported(k)) return ZD_ERR_NOT_IMPLEMENTED;
  *out = k;
  return ZD_OK;
}

int32_t supports_isa(zd_isa isa) noexcept {
  Isa k;
  return resolve_isa(isa, &k) == ZD_OK ? 1 : 0;
}

zd_status resolve_isa_up_to_avx2(zd_isa isa, Isa* out) {
  if (isa == ZD_ISA_AVX512) return ZD_ERR_NOT_IMPLEMENTED;
  if (const zd_status st = resolve_isa(isa, out); st != ZD_OK) return st;
  if (*out == Isa::avx512) *out = Isa::avx2;
  return ZD_OK;
}

int32_t supports_isa_up_to_avx2(zd_isa isa) noexcept {
  Isa k;
  return resolve_isa_up_to_avx2(isa, &k) == ZD_OK ? 1 : 0;
}

}  // namespace zerod::optim::glue
