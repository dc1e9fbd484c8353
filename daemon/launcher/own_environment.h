// Variables the daemon sets for its own process only: the ranks it launches
// get the environment the user gave zerod, not these.
//
// Why: the daemon on a GPU orders its streams against its trainers' with
// stream memory operations (engine/device/cuda_shared.h), which the GPU's
// scheduler cannot see; a stream that waits on one holds every stream that
// shares its hardware queue, and CUDA maps a process's streams onto
// CUDA_DEVICE_MAX_CONNECTIONS queues (8 unless set). The daemon asks for
// more queues for itself; a trainer is the user's to tune (Megatron-LM sets
// that variable to 1 on purpose), so it must not inherit ours.
#pragma once

#include <map>
#include <string>

namespace zerod::launch {

// Sets name=value in this process's environment unless the user set the
// variable; returns whether it did. Call on the main thread before any
// other thread starts (setenv is not safe beside a getenv elsewhere).
bool set_for_this_process_only(const std::string& name, const std::string& value);

// Takes out of `env` (this process's environment as read) every variable
// set_for_this_process_only set, which the user had not.
void drop_own_variables(std::map<std::string, std::string>& env);

}  // namespace zerod::launch
