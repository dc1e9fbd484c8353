#include "traced_device.h"

namespace zerod::observe {

// On a GPU these are issued on zerod's stream and the span is the time the
// host spent issuing (copy_to_host: until the bytes are there); on the cpu
// device, the copy itself.
void TracedDevice::copy_to_device(void* dst, const void* src, uint64_t bytes) {
  EventArgs a;
  a.bytes = bytes;
  a.flags = kFlagWrite;
  Span s(probe_, "copy", "host to device", a);
  d_->copy_to_device(dst, src, bytes);
}

void TracedDevice::copy_to_host(void* dst, const void* src, uint64_t bytes) {
  EventArgs a;
  a.bytes = bytes;
  Span s(probe_, "copy", "device to host", a);
  d_->copy_to_host(dst, src, bytes);
}

// Transfers are queued, not done, when these return: their spans are the
// issue; the host's waits for them are spans of their own.
uint64_t TracedDevice::upload(void* dst, const void* src, uint64_t bytes) {
  EventArgs a;
  a.bytes = bytes;
  a.flags = kFlagWrite;
  Span s(probe_, "copy", "upload", a);
  return d_->upload(dst, src, bytes);
}

uint64_t TracedDevice::download(void* dst, const void* src, uint64_t bytes, uint64_t after) {
  EventArgs a;
  a.bytes = bytes;
  Span s(probe_, "copy", "download", a);
  return d_->download(dst, src, bytes, after);
}

void TracedDevice::transfer_wait(uint64_t ticket) {
  if (ticket == 0) return;
  Span s(probe_, "copy", "wait for transfer");
  d_->transfer_wait(ticket);
}

void TracedDevice::copy_within(void* dst, const void* src, uint64_t bytes) {
  EventArgs a;
  a.bytes = bytes;
  a.flags = kFlagWrite;
  Span s(probe_, "copy", "device to device", a);
  d_->copy_within(dst, src, bytes);
}

void TracedDevice::optimizer_update(const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) {
  EventArgs a;
  a.tier = ZD_TIER_DEVICE;
  a.value = static_cast<int64_t>(u.count);
  Span s(probe_, "optimizer", "device update", a);
  d_->optimizer_update(opt, u, zero_grad);
}

}  // namespace zerod::observe
