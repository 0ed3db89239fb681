//! Memory pools other processes import (`cuMemPoolExportToShareableHandle`,
//! `cuMemPoolExportPointer` and their imports). Each allocation of such a
//! pool is virtual memory made shareable as a file descriptor (the path of
//! `cuMemCreate`), mapped at a reservation of its own. The exported pool is
//! a unix socket (an abstract name) served by a thread of the exporting
//! process: an importer of the same user connects, sends the 64 bytes that
//! `cuMemPoolExportPointer` gave, and gets the allocation's descriptor back,
//! which its own session imports and maps. An importer of the pool first
//! asks which device holds it (the device's UUID), so the import needs no
//! context of its own.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

use cumux_protocol::shm::{peer_credentials, recv_with_fd, send_with_fd};
use cumux_protocol::vmm::HANDLE_TYPE_POSIX_FD;
use cumux_protocol::{Call, ReplyBody, VmmCall};

use super::*;
use crate::state::pools::SharedAllocation;
use crate::state::Client;

/// The first 8 bytes of cumux's `CUmemPoolPtrExportData`.
const MAGIC: &[u8; 8] = b"CUMUXPL1";
/// A request for the pool's device rather than an allocation.
const DEVICE_QUERY: &[u8; 8] = b"CUMUXPD1";
/// Where the exporting process's pool sockets are named.
const NAME_PREFIX: &str = "cumux-pool-";

/// `CUmemPoolPtrExportData`: magic, the pool's share id, the exporter's
/// address of the allocation; the rest zero.
pub(super) fn export_data(share_id: u64, ptr: u64) -> [u8; 64] {
    let mut data = [0u8; 64];
    data[..8].copy_from_slice(MAGIC);
    data[8..16].copy_from_slice(&share_id.to_le_bytes());
    data[16..24].copy_from_slice(&ptr.to_le_bytes());
    data
}

/// (share id, exporter's address) of export data, if it is cumux's.
pub(super) fn parse_export_data(data: &[u8; 64]) -> Option<(u64, u64)> {
    if &data[..8] != MAGIC {
        return None;
    }
    let word = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().unwrap_or_default());
    Some((word(8), word(16)))
}

fn random_u64() -> u64 {
    let mut bits = [0u8; 8];
    // SAFETY: getrandom writes at most `bits.len()` bytes into the buffer.
    unsafe { libc::getrandom(bits.as_mut_ptr().cast(), bits.len(), 0) };
    u64::from_ne_bytes(bits)
}

/// A new share id (never 0).
pub(super) fn new_share_id() -> u64 {
    random_u64() | 1
}

/// A VMM call's value (vmm.rs's own helpers).
fn vmm_value(c: &Client, call: VmmCall) -> CuResult<u64> {
    super::vmm::reply_value(super::vmm::vmm(c, call)?)
}

/// The bytes a reservation of `bytes` on `device` takes: whole granules.
fn whole_granules(c: &Client, device: u32, bytes: u64) -> CuResult<u64> {
    let granule = match c.device(device as i32)?.vmm_granularity {
        Some((minimum, _)) => minimum.max(1),
        None => vmm_value(
            c,
            VmmCall::Granularity {
                device,
                recommended: false,
            },
        )?
        .max(1),
    };
    Ok(bytes.max(1).next_multiple_of(granule))
}

/// Maps `physical` (of `size` bytes) at a reservation of its own, read and
/// written by `devices`: the address.
fn map_shared(c: &Client, physical: u64, size: u64, devices: &[u32]) -> CuResult<u64> {
    let ptr = vmm_value(
        c,
        VmmCall::Reserve {
            size,
            alignment: 0,
            hint: 0,
        },
    )?;
    let mapped = c.call(Call::Vmm(VmmCall::Map {
        ptr,
        size,
        offset: 0,
        handle: physical,
    }));
    if let Err(e) = mapped {
        let _ = c.call(Call::Vmm(VmmCall::Free { ptr, size }));
        return Err(e);
    }
    for device in devices {
        let access = VmmCall::SetAccess {
            ptr,
            size,
            device: *device,
            flags: 3,
        };
        if let Err(e) = c.call(Call::Vmm(access)) {
            unmap_shared(c, ptr, size, physical);
            return Err(e);
        }
    }
    c.place(ptr, size, cumux_protocol::device_of_handle(physical))?;
    c.lock().mappings.insert(ptr, size);
    Ok(ptr)
}

/// Unmaps and releases what [`map_shared`] made.
fn unmap_shared(c: &Client, ptr: u64, size: u64, physical: u64) {
    for call in [
        VmmCall::Unmap { ptr, size },
        VmmCall::Release { handle: physical },
        VmmCall::Free { ptr, size },
    ] {
        if let Err(e) = c.call(Call::Vmm(call)) {
            tracing::debug!(
                "freeing a pool's shared allocation at {ptr:#x}: {}",
                name(e)
            );
        }
    }
    c.lock().mappings.remove(&ptr);
    c.placements().remove(ptr);
}

/// An allocation of `bytes` for shareable pool `pool` on `device`, read and
/// written by `devices`.
pub(super) fn alloc(
    c: &Client,
    pool: usize,
    device: u32,
    bytes: u64,
    devices: &[u32],
) -> CuResult<u64> {
    let size = whole_granules(c, device, bytes)?;
    let create = VmmCall::Create {
        device,
        size,
        handle_types: HANDLE_TYPE_POSIX_FD,
        compressed: false,
    };
    let physical = vmm_value(c, create)?;
    map_and_keep(c, pool, physical, size, devices)
}

/// Frees a shareable pool's allocation (made or imported) if `ptr` is one:
/// whether it was.
pub(super) fn free(c: &Client, ptr: u64) -> bool {
    let Some(shared) = c.lock().pools.shared.remove(&ptr) else {
        return false;
    };
    unmap_shared(c, ptr, shared.size, shared.physical);
    true
}

/// Maps shareable allocation `physical` of pool `pool` for `devices` and
/// keeps it among the pools' shared allocations: its address. The
/// allocation is released if it cannot be mapped.
fn map_and_keep(
    c: &Client,
    pool: usize,
    physical: u64,
    size: u64,
    devices: &[u32],
) -> CuResult<u64> {
    let ptr = map_shared(c, physical, size, devices).inspect_err(|_| {
        let _ = c.call(Call::Vmm(VmmCall::Release { handle: physical }));
    })?;
    c.lock().pools.shared.insert(
        ptr,
        SharedAllocation {
            pool,
            physical,
            size,
        },
    );
    Ok(ptr)
}

/// Starts serving shareable pool `share_id`, on the device of UUID `device`,
/// to importers: the listening socket, which the pool keeps.
pub(super) fn listen(c: &'static Client, share_id: u64, device: [u8; 16]) -> CuResult<OwnedFd> {
    let name = format!("{NAME_PREFIX}{:016x}{:016x}", random_u64(), random_u64());
    let address =
        SocketAddr::from_abstract_name(name.as_bytes()).map_err(|_| CUDA_ERROR_OPERATING_SYSTEM)?;
    let listener = UnixListener::bind_addr(&address).map_err(|e| {
        tracing::warn!("a pool's socket for its importers: {e}");
        CUDA_ERROR_OPERATING_SYSTEM
    })?;
    let serving = listener
        .try_clone()
        .map_err(|_| CUDA_ERROR_OPERATING_SYSTEM)?;
    std::thread::Builder::new()
        .name("cumux-pool-ipc".into())
        .spawn(move || {
            for stream in serving.incoming() {
                match stream {
                    Ok(stream) => {
                        if let Err(e) = answer(c, share_id, device, stream) {
                            tracing::debug!("a pool importer's request: {e}");
                        }
                    }
                    // The pool was destroyed (its socket shut down).
                    Err(_) => break,
                }
            }
        })
        .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    Ok(OwnedFd::from(listener))
}

/// Answers one importer: its request is export data; the reply is the
/// allocation's size (8 bytes, 0 for a refusal) with its descriptor. A
/// device query is answered with the pool's device UUID (16 bytes).
fn answer(
    c: &Client,
    share_id: u64,
    device: [u8; 16],
    mut stream: UnixStream,
) -> std::io::Result<()> {
    let mut request = [0u8; 64];
    stream.read_exact(&mut request)?;
    let refuse = |mut stream: UnixStream| stream.write_all(&0u64.to_le_bytes());
    // Only the exporter's own user may import.
    if peer_uid(&stream) != Some(own_uid()) {
        return refuse(stream);
    }
    if request.starts_with(DEVICE_QUERY) {
        return stream.write_all(&device);
    }
    let Some((_, ptr)) = parse_export_data(&request).filter(|(id, _)| *id == share_id) else {
        return refuse(stream);
    };
    let Some(shared) = c.lock().pools.shared.get(&ptr).copied() else {
        return refuse(stream);
    };
    match c.call_for_fd(Call::Vmm(VmmCall::Export {
        handle: shared.physical,
    })) {
        Ok((_, fd)) => send_with_fd(&stream, &shared.size.to_le_bytes(), fd.as_fd()),
        Err(_) => refuse(stream),
    }
}

/// This process's user.
fn own_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// The user of the process at the other end of `stream`.
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    peer_credentials(stream).map(|cred| cred.uid)
}

/// The abstract name of the pool socket `fd` (a shareable handle another
/// process passed): `INVALID_VALUE` where it is not one of cumux's.
pub(super) fn socket_name(fd: BorrowedFd<'_>) -> CuResult<Vec<u8>> {
    // SAFETY: the descriptor is borrowed for the call; the clone is ours.
    let owned = fd
        .try_clone_to_owned()
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let listener = UnixListener::from(owned);
    let name = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_abstract_name().map(<[u8]>::to_vec))
        .filter(|n| n.starts_with(NAME_PREFIX.as_bytes()))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(name)
}

/// The UUID of the device holding the pool served at `name`.
pub(super) fn pool_device(name: &[u8]) -> CuResult<[u8; 16]> {
    let mut stream = connect(name)?;
    let mut request = [0u8; 64];
    request[..8].copy_from_slice(DEVICE_QUERY);
    let mut uuid = [0u8; 16];
    stream
        .write_all(&request)
        .and_then(|()| stream.read_exact(&mut uuid))
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    Ok(uuid)
}

/// A connection to the exporter serving the pool at `name`.
fn connect(name: &[u8]) -> CuResult<UnixStream> {
    let address = SocketAddr::from_abstract_name(name).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    UnixStream::connect_addr(&address).map_err(|e| {
        tracing::warn!("the exporting process of a memory pool is gone: {e}");
        CUDA_ERROR_INVALID_VALUE
    })
}

/// Imports the allocation `data` names from the exporter at `name`, mapped
/// for `devices` on this process's `device`: its address and size.
pub(super) fn import(
    c: &Client,
    pool: usize,
    name: &[u8],
    data: &[u8; 64],
    device: u32,
    devices: &[u32],
) -> CuResult<u64> {
    let mut stream = connect(name)?;
    stream
        .write_all(data)
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let mut reply = [0u8; 8];
    let (n, fd) = recv_with_fd(&stream, &mut reply).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let size = u64::from_le_bytes(reply);
    let fd = match (n, fd) {
        (8, Some(fd)) if size > 0 => fd,
        // Export data of another pool, or of a freed allocation.
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let physical = match c.call_with_fd_on(device, Call::Vmm(VmmCall::Import), fd.as_fd())? {
        ReplyBody::Handle(h) | ReplyBody::Value(h) => h,
        _ => return Err(CUDA_ERROR_UNKNOWN),
    };
    map_and_keep(c, pool, physical, size, devices)
}

/// A descriptor number the program holds, as a borrowed descriptor.
pub(super) fn program_fd(raw: usize) -> CuResult<BorrowedFd<'static>> {
    let raw = i32::try_from(raw).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    if raw < 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the program passes a descriptor it holds open for the call.
    Ok(unsafe { BorrowedFd::borrow_raw(raw) })
}

/// A descriptor for the program: a duplicate of `fd`, which stays ours.
pub(super) fn program_copy(fd: &OwnedFd) -> CuResult<i32> {
    let copy = fd.try_clone().map_err(|_| CUDA_ERROR_OPERATING_SYSTEM)?;
    Ok(std::os::fd::IntoRawFd::into_raw_fd(copy))
}

/// Stops serving a destroyed pool (its serving thread's accept fails).
pub(super) fn stop(listener: OwnedFd) {
    // SAFETY: shutting down a socket we own; the serving thread's clone of
    // it then fails its accept and ends.
    unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RDWR) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_data_names_its_pool_and_allocation() {
        let data = export_data(0x1234, 0x7f00_0000_0000);
        assert_eq!(parse_export_data(&data), Some((0x1234, 0x7f00_0000_0000)));
        assert_eq!(parse_export_data(&[0u8; 64]), None);
        assert!(new_share_id() != 0);
    }

    #[test]
    fn only_cumux_pool_sockets_are_taken_as_pools() {
        let listener = listen_for_test(b"cumux-pool-test-only-cumux");
        let name = socket_name(listener.as_fd()).unwrap();
        assert!(name.starts_with(b"cumux-pool-"));
        let other = listen_for_test(b"someone-else");
        assert_eq!(socket_name(other.as_fd()), Err(CUDA_ERROR_INVALID_VALUE));
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert_eq!(socket_name(file.as_fd()), Err(CUDA_ERROR_INVALID_VALUE));
    }

    fn listen_for_test(name: &[u8]) -> OwnedFd {
        let mut unique = name.to_vec();
        unique.extend(format!("-{}", random_u64()).bytes());
        let address = SocketAddr::from_abstract_name(&unique).unwrap();
        OwnedFd::from(UnixListener::bind_addr(&address).unwrap())
    }
}
