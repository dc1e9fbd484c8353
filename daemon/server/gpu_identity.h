// Whether a rank's trainer computes on the GPU its daemon serves it on. The
// daemon puts local rank k on GPU k modulo the GPUs it sees; a trainer says
// which GPU it has current by UUID, the one name of a GPU every process
// shares (CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER renumber GPUs per
// process). Served on another GPU, the trainer's views would be another
// GPU's memory: its kernels would fail on mixed devices or, where the GPUs
// reach each other, run slowly over the link. Refused at zd_model_create,
// in words, instead.
#pragma once

#include <string>

namespace zerod::server {

// "GPU-8f0a1c2e-...": the UUID as nvidia-smi -L prints it (16 raw bytes).
std::string format_gpu_uuid(const std::string& uuid);

// "" when the trainer named no GPU (an older libzerod, a device other than
// "cuda"), the daemon's device is not a GPU, or the two are the same GPU;
// else why the rank cannot be served, and what to do.
std::string gpu_mismatch(int rank, const std::string& trainer_uuid, const std::string& served_uuid,
                         int served_ordinal);

}  // namespace zerod::server
