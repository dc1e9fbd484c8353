// What another launcher's environment says about this process: torchrun
// (and the launchers built on torch.distributed: Lightning's, `accelerate
// launch`), mpirun and srun tell each process its rank and the world size.
// A process of several that connects to no daemon would train alone as
// rank 0 of 1 while its siblings do the same: two trainings where the user
// asked for one, silently. zd_connect refuses that by name.
#pragma once

#include <string>

namespace zerod::abi {

// "" when the environment says one process (or says nothing); else a
// sentence naming the launcher, the variable and the world size, e.g.
// "torchrun (or another torch.distributed launcher) started it as rank 1 of 2 (RANK=1, WORLD_SIZE=2)".
std::string several_ranks_launcher();

}  // namespace zerod::abi
