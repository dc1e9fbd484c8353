#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the C example
# (examples/c/train_mlp.c) through zerod in embedded mode.
set -euo pipefail
source "$(dirname "$0")/common.sh"
zerod_install_packages "${ZEROD_PACKAGES[@]}"
zerod_build train_mlp zerod_cli zd_optimizer_adamw zd_optimizer_adam zd_optimizer_sgd
cd "$ZEROD_ROOT"
zerod_log "checking the job script"
"$ZEROD_BUILD_DIR/bin/zerod" check examples/c/job.lua --lr-steps 0
zerod_log "training"
"$ZEROD_BUILD_DIR/bin/train_mlp" --job examples/c/job.lua "$@"
