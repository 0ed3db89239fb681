//! The interpreter's address windows (where shared, local and parameter
//! memory appear in generic addresses) and its per-thread and per-block limits.

/// Generic-address window of the per-thread local space.
pub const LOCAL_WINDOW: u64 = 0x1000_0000_0000;
/// Generic-address window of the per-block shared space.
pub const SHARED_WINDOW: u64 = 0x1100_0000_0000;
/// Generic-address window of the kernel parameter space.
pub const PARAM_WINDOW: u64 = 0x1200_0000_0000;
pub(super) const WINDOW_SIZE: u64 = 1 << 32;
/// Per-thread local memory limit (frames and call stack).
pub(super) const LOCAL_LIMIT: usize = 512 * 1024;
pub(super) const MAX_CALL_DEPTH: usize = 4096;
/// Registers plus local memory of all threads of one block (bytes).
pub(super) const BLOCK_MEMORY_LIMIT: usize = 256 << 20;
/// Reserved shared memory of a block whose module reads the
/// `%reserved_smem_offset_*` registers (sm_80+: 1 KiB), placed after its
/// dynamic shared memory; two halves for `_0` and `_1`.
pub(super) const RESERVED_SMEM: u64 = 1024;
/// Blocks of a cooperative launch, which all run at once (a host thread each).
pub const MAX_COOPERATIVE_BLOCKS: u64 = 1024;
/// Threads of a cooperative launch, all blocks together.
pub const MAX_COOPERATIVE_THREADS: u64 = 65536;
/// Registers plus local memory of all threads of a cooperative launch, whose
/// blocks are all resident at once (each thread's call stack is bounded by
/// its share: at least 16 KiB).
pub(super) const COOPERATIVE_MEMORY_LIMIT: usize = 1 << 30;
