// Variables the daemon sets for its own process only: the ranks it launches
// get the environment the user gave zerod, not these.
//
// Why: the daemon on a GPU orders its streams against its trainers' with
// stream memory operations (engine/device/cuda_shared.h), which the GPU's
// scheduler cannot see; a stream that waits on one holds every stream that
// shares its hardware queue, and CUDA maps a process's streams onto
// CUDA_DEVICE_MAX_CONNECTIONS queues (8 unless set). The daemon asks for
// the most queues for itself, whatever the user's environment says: a
// trainer's value is the user's to tune (Megatron-LM sets it to 1 on
// purpose, for its own overlap), and it reaches the trainers unchanged,
// but a daemon started from that environment must not serialise every
// rank's copies and collectives behind one waiting stream.
#pragma once

#include <map>
#include <string>

namespace zerod::launch {

// Sets name=value in this process's environment, remembering the user's
// value (or its absence) for the processes it launches. Returns the user's
// value, "" when there was none. Call on the main thread before any other
// thread starts (setenv is not safe beside a getenv elsewhere), and before
// anything reads the variable (CUDA reads this one when a context is made).
std::string set_for_this_process_only(const std::string& name, const std::string& value);

// Puts back into `env` (this process's environment as read) the user's
// value of every variable set_for_this_process_only set, or takes it out
// where the user had none.
void restore_user_values(std::map<std::string, std::string>& env);

}  // namespace zerod::launch
