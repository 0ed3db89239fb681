//! A moved session's memory copied device to device (issue 17): each chunk of
//! the target's placed memory exported, mapped on the source context, copied into.

use std::os::fd::AsFd;

use cumux_protocol::vmm::ACCESS_READWRITE;
use cumux_protocol::{codes, CuError, DevicePtr};

use super::{DeviceContext, MovableContext, VmmOp};

/// A target chunk as the source context maps it for the copies.
struct Mapped {
    /// The chunk's start and size in the target (the program's addresses).
    start: u64,
    size: u64,
    /// Where the source context maps it, and its physical memory there.
    at: u64,
    physical: u64,
    mapped: bool,
}

impl Mapped {
    fn holds(&self, ptr: DevicePtr, bytes: u64) -> bool {
        ptr >= self.start && ptr.saturating_add(bytes) <= self.start + self.size
    }

    /// Undoes what the source made of the chunk: its mapping (if made),
    /// its reservation, its imported physical memory (never charged to the
    /// source: size 0).
    fn release(&self, source: &dyn DeviceContext) {
        if self.mapped {
            let _ = source.vmm(&VmmOp::Unmap {
                ptr: self.at,
                size: self.size,
            });
        }
        let _ = source.vmm(&VmmOp::FreeReservation {
            ptr: self.at,
            size: self.size,
        });
        let _ = source.vmm(&VmmOp::Release {
            physical: self.physical,
            size: 0,
        });
    }
}

/// Copies each `(ptr, bytes)` of `source` into `target`, where the move
/// placed memory at the same addresses, without the bytes leaving the
/// devices: the target exports the chunk that holds an allocation, the
/// source maps it and copies there. An error leaves the target's bytes
/// partly written (the caller copies them another way); the source's
/// mappings go either way.
pub fn copy_placed(
    source: &dyn DeviceContext,
    target: &dyn MovableContext,
    allocations: &[(DevicePtr, u64)],
) -> Result<u64, CuError> {
    let mut chunks: Vec<Mapped> = Vec::new();
    let copied = copy_through(source, target, allocations, &mut chunks);
    for c in &chunks {
        c.release(source);
    }
    copied
}

fn copy_through(
    source: &dyn DeviceContext,
    target: &dyn MovableContext,
    allocations: &[(DevicePtr, u64)],
    chunks: &mut Vec<Mapped>,
) -> Result<u64, CuError> {
    let mut copied = 0u64;
    for &(ptr, bytes) in allocations.iter().filter(|a| a.1 > 0) {
        let chunk = match chunks.iter().position(|c| c.holds(ptr, bytes)) {
            Some(i) => &chunks[i],
            None => {
                chunks.push(map_chunk(source, target, ptr)?);
                let c = &chunks[chunks.len() - 1];
                if !c.holds(ptr, bytes) {
                    return Err(CuError::new(
                        codes::UNKNOWN,
                        format!("the chunk placed for {ptr:#x} does not hold its {bytes} bytes"),
                    ));
                }
                c
            }
        };
        source.mem_copy(chunk.at + (ptr - chunk.start), ptr, bytes)?;
        copied += bytes;
    }
    Ok(copied)
}

/// The target's chunk holding `ptr`, mapped readable and writable on the
/// source; what was made of it is undone on failure.
fn map_chunk(
    source: &dyn DeviceContext,
    target: &dyn MovableContext,
    ptr: DevicePtr,
) -> Result<Mapped, CuError> {
    let (start, size, fd) = target.export_placed(ptr)?;
    let physical = source.vmm_import(fd.as_fd())?;
    let at = match source.vmm(&VmmOp::Reserve { size, alignment: 0 }) {
        Ok(at) => at,
        Err(e) => {
            let _ = source.vmm(&VmmOp::Release { physical, size: 0 });
            return Err(e);
        }
    };
    let mut chunk = Mapped {
        start,
        size,
        at,
        physical,
        mapped: false,
    };
    let mapped = source.vmm(&VmmOp::Map {
        ptr: at,
        size,
        physical,
    });
    chunk.mapped = mapped.is_ok();
    let made = mapped.and_then(|_| {
        source.vmm(&VmmOp::SetAccess {
            ptr: at,
            size,
            flags: ACCESS_READWRITE,
        })
    });
    match made {
        Ok(_) => Ok(chunk),
        Err(e) => {
            chunk.release(source);
            Err(e)
        }
    }
}
