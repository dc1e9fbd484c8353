//! Memory accounting: tiers, kinds of bytes, and the figures of one pair.

use crate::ffi;

/// A memory tier, fastest first. On a CPU rank the device tier is a bounded
/// shared-memory pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    Device,
    Host,
    Nvme,
}

impl Tier {
    pub fn raw(self) -> ffi::zd_tier {
        match self {
            Tier::Device => ffi::ZD_TIER_DEVICE,
            Tier::Host => ffi::ZD_TIER_HOST,
            Tier::Nvme => ffi::ZD_TIER_NVME,
        }
    }
}

/// What the bytes of a tier hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemKind {
    /// The sum over every kind.
    All,
    /// Working copies the trainer computes with.
    Params,
    /// Accumulated gradients.
    Grads,
    /// fp32 master copies.
    Master,
    /// Optimizer state (momentum, variance, ...).
    Optimizer,
    /// Transient buffers: gradient views, staging.
    Buffers,
}

impl MemKind {
    pub fn raw(self) -> ffi::zd_mem_kind {
        match self {
            MemKind::All => ffi::ZD_MEM_ALL,
            MemKind::Params => ffi::ZD_MEM_PARAMS,
            MemKind::Grads => ffi::ZD_MEM_GRADS,
            MemKind::Master => ffi::ZD_MEM_MASTER,
            MemKind::Optimizer => ffi::ZD_MEM_OPTIMIZER,
            MemKind::Buffers => ffi::ZD_MEM_BUFFERS,
        }
    }
}

/// Bytes of one kind in one tier, for one rank (`zd_memory_figures`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryFigures {
    /// Held now.
    pub current: u64,
    /// The most held at once since finalize.
    pub peak: u64,
    /// The tier's budget for this rank; None when the job sets none.
    pub budget: Option<u64>,
}

impl MemoryFigures {
    pub(crate) fn from_raw(raw: &ffi::zd_memory_figures) -> MemoryFigures {
        MemoryFigures {
            current: raw.current,
            peak: raw.peak,
            budget: if raw.budget == u64::MAX {
                None
            } else {
                Some(raw.budget)
            },
        }
    }
}
