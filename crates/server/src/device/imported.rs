//! A move's target memory as its source's context imports and maps it (issue
//! 17): the chunks' places, shared by the device layer and its workers' wire.

use cumux_protocol::{codes, CuError, DevicePtr};
use serde::{Deserialize, Serialize};

/// A chunk of the target's placed memory as the source imported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportedChunk {
    /// The chunk's start and size in the target (the program's addresses).
    pub start: u64,
    pub size: u64,
    /// Its physical memory's id in the source ([`DeviceContext::vmm_import`]).
    pub physical: u64,
}

impl ImportedChunk {
    pub fn holds(&self, ptr: DevicePtr, bytes: u64) -> bool {
        ptr >= self.start && ptr.saturating_add(bytes) <= self.start + self.size
    }
}

/// The target's chunks as the source maps them: one reservation, each
/// chunk at its place in it, readable and writable
/// ([`DeviceContext::map_imported`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MappedChunks {
    pub base: u64,
    pub total: u64,
    /// Each chunk and where it is mapped.
    pub chunks: Vec<(ImportedChunk, u64)>,
}

impl MappedChunks {
    /// Where `(ptr, bytes)` of the target lies in the source's mapping.
    pub fn place_of(&self, ptr: DevicePtr, bytes: u64) -> Result<u64, CuError> {
        self.chunks
            .iter()
            .find(|(c, _)| c.holds(ptr, bytes))
            .map(|(c, at)| at + (ptr - c.start))
            .ok_or_else(|| {
                CuError::new(
                    codes::INVALID_VALUE,
                    format!("no mapped chunk holds the {bytes} bytes at {ptr:#x}"),
                )
            })
    }
}
