#include "gpu_identity.h"

#include <cstdio>

namespace zerod::server {

std::string format_gpu_uuid(const std::string& uuid) {
  std::string out = "GPU-";
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(uuid[i]));
    out += hex;
  }
  return out;
}

std::string gpu_mismatch(int rank, const std::string& trainer_uuid, const std::string& served_uuid,
                         int served_ordinal) {
  if (trainer_uuid.empty() || served_uuid.empty() || trainer_uuid == served_uuid) return {};
  const std::string r = std::to_string(rank);
  return "rank " + r + " computes on " + format_gpu_uuid(trainer_uuid) + " (its current GPU), but its daemon serves "
         "rank " + r + " on " + format_gpu_uuid(served_uuid) + " (GPU " + std::to_string(served_ordinal) +
         " as the daemon numbers them): its views would be another GPU's memory. The daemon puts local rank k on "
         "GPU k modulo the GPUs it sees; make that GPU current in the trainer before zd_model_create "
         "(torch.cuda.set_device(local_rank), the model on it), and give the daemon and its ranks the same "
         "CUDA_VISIBLE_DEVICES";
}

}  // namespace zerod::server
