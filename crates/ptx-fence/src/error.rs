//! Why a module cannot be fenced: the one error of the pass, shared by
//! the scan of a module and the rewriting of each instruction.

/// Names the pass declares start so; a text that mentions it is refused.
pub const RESERVED_PREFIX: &str = "__cumux_";

/// Why a module cannot be fenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceError {
    /// The text already uses names the pass reserves.
    ReservedName,
    /// Braces do not balance, or no `.target` line to put the fence after.
    Malformed,
    /// An instruction whose memory operands the pass cannot bound
    /// (`cp.async.bulk`, `wmma.load.global`, `multimem`, …).
    Unfenceable { line: usize, opcode: String },
    /// The module calls device-side `malloc`, whose heap lies outside any
    /// partition.
    DeviceHeap,
}

impl std::fmt::Display for FenceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FenceError::ReservedName => {
                write!(f, "PTX uses the reserved prefix {}", RESERVED_PREFIX)
            }
            FenceError::Malformed => write!(f, "PTX is malformed (braces or no .target)"),
            FenceError::Unfenceable { line, opcode } => {
                write!(f, "line {line}: `{opcode}` cannot be fenced")
            }
            FenceError::DeviceHeap => write!(
                f,
                "it calls device-side malloc, whose heap lies outside the tenant's partition"
            ),
        }
    }
}

impl std::error::Error for FenceError {}
