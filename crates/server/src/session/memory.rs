//! A session's device memory: allocations against the tenant's quota, the
//! check that every pointer lies in the session's own memory, and the copies
//! and memsets the client asks for.

use std::sync::atomic::Ordering;

use cumux_protocol::framing::MAX_CHUNK_BYTES;
use cumux_protocol::{
    codes, CuError, DevicePtr, Handle, ReplyBody, TensorMapRequest, DEFAULT_STREAM,
};

use super::core::err;
use super::{CallResult, Session};
use crate::device::socket_bytes::{FillBytes, SendBytes};
use crate::device::{MemFill, StreamWork};

/// Dimensions a tensor map may have (CUDA's limit).
const MAX_TENSOR_RANK: usize = 5;

impl Session {
    pub(super) fn mem_alloc(&mut self, device: u32, bytes: u64) -> CallResult {
        self.check_device(device)?;
        if bytes == 0 {
            return Err(err(codes::INVALID_VALUE, "cannot allocate 0 bytes"));
        }
        self.reserve(bytes)?;
        let ptr = match self.ctx.mem_alloc(bytes) {
            Ok(ptr) => ptr,
            Err(e) => {
                self.release(bytes);
                return Err(e);
            }
        };
        self.allocations.insert(ptr, bytes);
        if let Some(group) = &self.group {
            group.publish_range(self.id(), ptr, bytes, false);
        }
        let stats = &self.core.stats;
        stats.mem_used.fetch_add(bytes, Ordering::Relaxed);
        stats.allocations.fetch_add(1, Ordering::Relaxed);
        Ok(ReplyBody::Ptr(ptr))
    }

    pub(super) fn mem_free(&mut self, ptr: DevicePtr) -> CallResult {
        let Some(&size) = self.allocations.get(&ptr) else {
            return Err(err(
                codes::INVALID_VALUE,
                format!("{ptr:#x} is not an allocation of this session"),
            ));
        };
        // Like cuMemFree, wait for work that may still use it.
        self.drain_all();
        self.allocations.remove(&ptr);
        if let Some(group) = &self.group {
            group.withdraw_range(ptr, false);
        }
        let stats = &self.core.stats;
        stats.mem_used.fetch_sub(size, Ordering::Relaxed);
        stats.allocations.fetch_sub(1, Ordering::Relaxed);
        self.release(size);
        self.ctx.mem_free(ptr, size)?;
        Ok(ReplyBody::Unit)
    }

    /// Holds `bytes` against the tenant's quota, or fails as the driver does
    /// when memory runs out.
    pub(super) fn reserve(&self, bytes: u64) -> Result<(), CuError> {
        let Some(hold) = &self.account else {
            return Ok(());
        };
        let account = hold.account();
        if account.reserve(bytes) {
            return Ok(());
        }
        Err(err(
            codes::OUT_OF_MEMORY,
            format!(
                "{bytes} bytes would take tenant {:?} past its quota of {} bytes ({} in use)",
                account.name,
                account.memory_quota().unwrap_or(u64::MAX),
                account.mem_used()
            ),
        ))
    }

    pub(super) fn release(&self, bytes: u64) {
        if let Some(hold) = &self.account {
            hold.account().release(bytes);
        }
    }

    pub(super) fn memcpy_htod(
        &mut self,
        dst: DevicePtr,
        data: Vec<u8>,
        stream: Option<Handle>,
    ) -> CallResult {
        self.check_optional_stream(stream)?;
        self.check_range(dst, data.len() as u64)?;
        if data.is_empty() {
            return Ok(ReplyBody::Unit);
        }
        self.submit(stream, StreamWork::Write { dst, data })
    }

    /// A copy to the host's checks: its stream (the default one if none),
    /// at most one chunk, and a source the session owns; the stream.
    fn dtoh_checked(
        &mut self,
        src: DevicePtr,
        bytes: u64,
        stream: Option<Handle>,
    ) -> Result<Handle, CuError> {
        let stream = stream.unwrap_or(DEFAULT_STREAM);
        self.check_stream(stream)?;
        if bytes > MAX_CHUNK_BYTES as u64 {
            return Err(err(
                codes::INVALID_VALUE,
                format!("a copy of {bytes} bytes exceeds one chunk"),
            ));
        }
        self.check_source(src, bytes)?;
        Ok(stream)
    }

    pub(super) fn memcpy_dtoh(
        &mut self,
        src: DevicePtr,
        bytes: u64,
        stream: Option<Handle>,
    ) -> CallResult {
        let stream = self.dtoh_checked(src, bytes, stream)?;
        let mut buf = vec![0u8; bytes as usize];
        let outcome = self.ordered()?.read(stream, src, &mut buf);
        self.waited(outcome)?;
        Ok(ReplyBody::Data(buf))
    }

    /// [`Session::memcpy_htod`] of `len` bytes that `fill` reads from the
    /// client's socket where the device takes them.
    pub(super) fn memcpy_htod_filled(
        &mut self,
        dst: DevicePtr,
        len: usize,
        stream: Option<Handle>,
        fill: &mut FillBytes<'_>,
    ) -> CallResult {
        self.check_optional_stream(stream)?;
        self.check_range(dst, len as u64)?;
        if len == 0 {
            return Ok(ReplyBody::Unit);
        }
        self.submit_filled(stream, dst, len, fill)
    }

    /// [`Session::memcpy_dtoh`] whose bytes go to `send` (the client's
    /// socket) from where they lie; `Ok(Unit)` once sent. A failure kept
    /// from earlier calls is answered first, in place of the bytes.
    pub(super) fn memcpy_dtoh_sent(
        &mut self,
        src: DevicePtr,
        bytes: u64,
        stream: Option<Handle>,
        send: &mut dyn SendBytes,
    ) -> CallResult {
        let stream = self.dtoh_checked(src, bytes, stream)?;
        if let Some(e) = self.core.take_error() {
            return Err(e);
        }
        let outcome = self.ordered()?.read_sent(stream, src, bytes as usize, send);
        if outcome.result.is_err() {
            return self.waited(outcome);
        }
        self.core.append_stdout(&outcome.stdout);
        Ok(ReplyBody::Unit)
    }

    pub(super) fn memcpy_dtod(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: Option<Handle>,
    ) -> CallResult {
        self.check_optional_stream(stream)?;
        self.check_source(src, bytes)?;
        self.check_range(dst, bytes)?;
        if bytes == 0 {
            return Ok(ReplyBody::Unit);
        }
        self.submit(stream, StreamWork::Copy { dst, src, bytes })
    }

    /// The bytes of one memset element, `value` as `elem_bytes` (1, 2 or 4),
    /// once the call's `stream` is checked.
    pub(super) fn memset_element(
        &self,
        stream: Option<Handle>,
        value: u32,
        elem_bytes: u8,
    ) -> Result<Vec<u8>, CuError> {
        self.check_optional_stream(stream)?;
        match elem_bytes {
            1 => Ok(vec![value as u8]),
            2 => Ok((value as u16).to_le_bytes().to_vec()),
            4 => Ok(value.to_le_bytes().to_vec()),
            _ => Err(err(
                codes::INVALID_VALUE,
                format!("memset element of {elem_bytes} bytes"),
            )),
        }
    }

    /// A memset of `fill`, whose pattern is a [`Session::memset_element`], in
    /// the session's memory.
    pub(super) fn memset(&mut self, fill: MemFill, stream: Option<Handle>) -> CallResult {
        let MemFill {
            dst,
            count,
            pitch,
            height,
            ..
        } = fill;
        let row = count
            .checked_mul(fill.pattern.len() as u64)
            .ok_or_else(|| err(codes::INVALID_VALUE, "memset too large"))?;
        if count == 0 || height == 0 {
            return Ok(ReplyBody::Unit);
        }
        if height > 1 && pitch < row {
            return Err(err(codes::INVALID_VALUE, "memset pitch smaller than a row"));
        }
        let span = (height - 1)
            .checked_mul(pitch)
            .and_then(|s| s.checked_add(row))
            .ok_or_else(|| err(codes::INVALID_VALUE, "memset too large"))?;
        self.check_range(dst, span)?;
        self.submit(stream, StreamWork::Fill(fill))
    }

    /// A copy between device memory at `device` and a span of a pinned host
    /// region (`to_device`: from the region): checked against the session's
    /// allocations and the region, then queued like any copy.
    pub(super) fn memcpy_host(
        &mut self,
        device: DevicePtr,
        region: Handle,
        offset: u64,
        bytes: u64,
        stream: Option<Handle>,
        to_device: bool,
    ) -> CallResult {
        self.check_optional_stream(stream)?;
        // A region of the program's session on another device is mapped in
        // the process this session's context shares with it.
        let host = match (self.host.span(region, offset, bytes), &self.group) {
            (Ok(span), _) => span,
            (Err(e), Some(group)) => match group.region(region) {
                Some(mapping) => crate::host_regions::span_of(region, &mapping, offset, bytes)?,
                None => return Err(e),
            },
            (Err(e), None) => return Err(e),
        };
        match to_device {
            true => self.check_range(device, bytes)?,
            false => self.check_source(device, bytes)?,
        }
        if bytes == 0 {
            return Ok(ReplyBody::Unit);
        }
        self.core
            .stats
            .zero_copy_bytes
            .fetch_add(bytes, Ordering::Relaxed);
        let work = match to_device {
            true => StreamWork::HostToDevice { dst: device, host },
            false => StreamWork::DeviceToHost { src: device, host },
        };
        self.submit(stream, work)
    }

    /// A tensor-memory-access descriptor, for a tensor that starts in this
    /// session's memory. (Its end is not checked: a descriptor only ever
    /// reaches the memory of the context it is used in, and the tile reads
    /// past a tensor's bounds are filled, not made.)
    pub(super) fn tensor_map_encode(&mut self, request: TensorMapRequest) -> CallResult {
        let rank = request.rank as usize;
        let short = request.global_dim.len() < rank
            || request.global_strides.len() + 1 < rank
            || request.element_strides.len() < rank;
        if !(1..=MAX_TENSOR_RANK).contains(&rank) || short {
            return Err(err(
                codes::INVALID_VALUE,
                format!("a tensor map of rank {rank} with too few dimensions"),
            ));
        }
        self.check_source(request.global_address, 1)?;
        let bytes = self.ctx.tensor_map_encode(&request)?;
        Ok(ReplyBody::TensorMap(bytes))
    }

    /// The session allocation, module global, mapping or pinned host region
    /// the device reaches at the client's address holding `ptr`: (base, size).
    pub(super) fn containing(&self, ptr: DevicePtr) -> Option<(DevicePtr, u64)> {
        [&self.allocations, &self.globals, &self.ipc_opened]
            .into_iter()
            .filter_map(|table| table.range(..=ptr).next_back())
            .map(|(b, s)| (*b, *s))
            .find(|(base, size)| ptr - base < *size)
            .or_else(|| self.vmm_mapping_of(ptr))
            .or_else(|| self.host.reached_range(ptr))
    }

    /// Checks that `[ptr, ptr+bytes)` lies inside one of this session's
    /// allocations, or in mapped memory it may write.
    pub(super) fn check_range(&self, ptr: DevicePtr, bytes: u64) -> Result<(), CuError> {
        self.check_access(ptr, bytes, true)
    }

    /// [`Session::check_range`] for memory that is only read: mapped memory
    /// may be read-only.
    pub(super) fn check_source(&self, ptr: DevicePtr, bytes: u64) -> Result<(), CuError> {
        self.check_access(ptr, bytes, false)
    }

    fn check_access(&self, ptr: DevicePtr, bytes: u64, writes: bool) -> Result<(), CuError> {
        let allocated = [&self.allocations, &self.globals, &self.ipc_opened]
            .into_iter()
            .filter_map(|table| table.range(..=ptr).next_back())
            .any(|(base, size)| ptr - base < *size && bytes <= size - (ptr - base));
        let pinned = self
            .host
            .reached_range(ptr)
            .is_some_and(|(base, size)| bytes <= size - (ptr - base));
        // Memory of the program on another of its devices: its contexts are
        // in one process, where the driver reaches it (or refuses) as natively.
        let program = || {
            self.group
                .as_ref()
                .is_some_and(|g| g.holds_memory(self.id(), ptr, bytes))
        };
        if allocated || pinned || self.vmm_accessible(ptr, bytes, writes) || program() {
            Ok(())
        } else {
            Err(err(
                codes::INVALID_VALUE,
                format!("[{ptr:#x}, +{bytes}) is not inside an allocation of this session"),
            ))
        }
    }
}
