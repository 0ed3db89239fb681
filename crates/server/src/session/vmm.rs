//! A session's virtual memory (`cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap` …): its reservations, physical allocations and mappings, each
//! call checked as NVIDIA's driver checks it, physical bytes charged to the
//! tenant, everything given back at the session's end.

use std::sync::atomic::Ordering;

use cumux_protocol::vmm::{
    is_access_flags, VmmCall, VmmProperties, ACCESS_NONE, ACCESS_READ, ACCESS_READWRITE,
    HANDLE_TYPE_POSIX_FD, HOST_PAGE,
};
use cumux_protocol::{codes, CuError, DevicePtr, Handle, ReplyBody};

use super::core::{err, release_failed};
use super::vmm_tables::{Mapping, Physical};
use super::{CallResult, Session};
use crate::device::VmmOp;

/// Reservations one session may hold at once.
const MAX_RESERVATIONS: usize = 16 << 10;
/// Mappings one session may hold at once.
const MAX_MAPPINGS: usize = 256 << 10;

fn invalid(detail: impl Into<String>) -> CuError {
    err(codes::INVALID_VALUE, detail)
}

impl Session {
    pub(super) fn vmm_call(&mut self, call: VmmCall) -> CallResult {
        match call {
            VmmCall::Granularity {
                device,
                recommended,
            } => {
                self.check_device(device)?;
                let value = match recommended {
                    true => self.ctx.vmm(&VmmOp::Granularity { recommended })?,
                    false => self.vmm_granularity()?,
                };
                Ok(ReplyBody::Value(value))
            }
            VmmCall::Reserve {
                size,
                alignment,
                hint,
            } => self.vmm_reserve(size, alignment, hint),
            VmmCall::Free { ptr, size } => self.vmm_free(ptr, size),
            VmmCall::Create {
                device,
                size,
                handle_types,
                compressed,
            } => self.vmm_create(device, size, handle_types, compressed),
            VmmCall::Release { handle } => {
                let physical = self.vmm.held(handle)?;
                physical.refs -= 1;
                self.vmm_settle(handle);
                Ok(ReplyBody::Unit)
            }
            VmmCall::Map {
                ptr,
                size,
                offset,
                handle,
            } => self.vmm_map(ptr, size, offset, handle),
            VmmCall::Unmap { ptr, size } => self.vmm_unmap(ptr, size),
            VmmCall::SetAccess {
                ptr,
                size,
                device,
                flags,
            } => self.vmm_set_access(ptr, size, device, flags),
            VmmCall::GetAccess { ptr, device } => {
                if device != self.index {
                    self.program_device(device)?;
                }
                let (_, m) = self
                    .vmm
                    .mapping_of(ptr)
                    .ok_or_else(|| invalid(format!("{ptr:#x} is not mapped in this session")))?;
                Ok(ReplyBody::Value(m.access_of(self.index, device)))
            }
            VmmCall::Retain { ptr } => {
                let (_, m) = self
                    .vmm
                    .mapping_of(ptr)
                    .ok_or_else(|| invalid(format!("{ptr:#x} is not mapped in this session")))?;
                let handle = m.handle;
                if let Some(p) = self.vmm.physical.get_mut(&handle) {
                    p.refs = p.refs.saturating_add(1);
                }
                Ok(ReplyBody::Handle(handle))
            }
            VmmCall::Properties { handle } => {
                let physical = self.vmm.held(handle)?;
                Ok(ReplyBody::VmmProperties(VmmProperties {
                    device: self.index,
                    handle_types: physical.handle_types,
                    compressed: physical.compressed,
                }))
            }
            VmmCall::Export { handle } => self.vmm_export(handle),
            VmmCall::Import => self.vmm_import(),
        }
    }

    /// The file descriptor of `handle`'s memory, made shareable as one: it
    /// goes back to the client with the reply (`Session::take_outgoing_fd`).
    fn vmm_export(&mut self, handle: Handle) -> CallResult {
        let physical = self.vmm.held(handle)?;
        if physical.handle_types & HANDLE_TYPE_POSIX_FD == 0 {
            return Err(invalid(format!(
                "{handle:#x} was not made shareable as a file descriptor"
            )));
        }
        let backend = physical.backend;
        self.outgoing_fd = Some(self.ctx.vmm_export(backend)?);
        Ok(ReplyBody::Unit)
    }

    /// Imports the physical memory whose file descriptor came with the call
    /// (another program exported it): a handle of this session, whose memory
    /// is the exporter's, so this tenant is not charged for it.
    fn vmm_import(&mut self) -> CallResult {
        let fd = self
            .take_incoming_fd()
            .map_err(|why| invalid(format!("no file descriptor to import: {why}")))?;
        let backend = self.ctx.vmm_import(std::os::fd::AsFd::as_fd(&fd))?;
        let handle = self.mint_handle();
        let physical = Physical {
            // The driver knows the size, and checks each mapping against it.
            size: u64::MAX,
            backend,
            refs: 1,
            mappings: 0,
            handle_types: HANDLE_TYPE_POSIX_FD,
            compressed: false,
            imported: true,
        };
        self.vmm.physical.insert(handle, physical);
        Ok(ReplyBody::Handle(handle))
    }

    /// The backend's minimum granularity: sizes, addresses and offsets of
    /// physical allocations and mappings are multiples of it.
    fn vmm_granularity(&mut self) -> Result<u64, CuError> {
        if let Some(g) = self.vmm.granularity {
            return Ok(g);
        }
        let g = self.ctx.vmm(&VmmOp::Granularity { recommended: false })?;
        if !g.is_power_of_two() {
            return Err(err(
                codes::UNKNOWN,
                format!("the device's granularity is {g}"),
            ));
        }
        self.vmm.granularity = Some(g);
        Ok(g)
    }

    fn vmm_reserve(&mut self, size: u64, alignment: u64, hint: DevicePtr) -> CallResult {
        // Measured on NVIDIA's driver: a size of one page is refused too, so
        // a reservation is granules, though the documentation says pages.
        let g = self.vmm_granularity()?;
        if size == 0 || !size.is_multiple_of(g) || !hint.is_multiple_of(HOST_PAGE) {
            return Err(invalid(format!(
                "a reservation of {size} bytes at {hint:#x}: the size must be a multiple of \
                 the granularity, {g}, the address of the page size"
            )));
        }
        if alignment != 0 && !alignment.is_power_of_two() {
            return Err(invalid(format!(
                "alignment {alignment} is not a power of two"
            )));
        }
        if self.vmm.reservations.len() >= MAX_RESERVATIONS {
            return Err(err(
                codes::OUT_OF_MEMORY,
                format!("a session may hold {MAX_RESERVATIONS} address reservations"),
            ));
        }
        // The hint is only a hint: the backend places the range.
        let ptr = self.ctx.vmm(&VmmOp::Reserve { size, alignment })?;
        let end = ptr.checked_add(size);
        let clash = self
            .vmm
            .reservations
            .range(..end.unwrap_or(u64::MAX))
            .next_back()
            .is_some_and(|(base, len)| base.saturating_add(*len) > ptr);
        if end.is_none() || clash || self.containing(ptr).is_some() {
            // A backend that hands out a range twice would let two tables
            // name one address.
            let _ = self.ctx.vmm(&VmmOp::FreeReservation { ptr, size });
            return Err(err(
                codes::UNKNOWN,
                format!("the device reserved [{ptr:#x}, +{size}), which is taken"),
            ));
        }
        self.vmm.reservations.insert(ptr, size);
        if let Some(group) = &self.group {
            group.publish_range(self.id(), ptr, size, true);
        }
        Ok(ReplyBody::Ptr(ptr))
    }

    fn vmm_free(&mut self, ptr: DevicePtr, size: u64) -> CallResult {
        if self.vmm.reservations.get(&ptr) != Some(&size) {
            return Err(invalid(format!(
                "[{ptr:#x}, +{size}) is not an address reservation of this session"
            )));
        }
        if self.vmm.mapped_in(ptr, size) {
            return Err(invalid(format!(
                "[{ptr:#x}, +{size}) still has mappings: unmap them first"
            )));
        }
        self.ctx.vmm(&VmmOp::FreeReservation { ptr, size })?;
        self.vmm.reservations.remove(&ptr);
        if let Some(group) = &self.group {
            group.withdraw_range(ptr, true);
        }
        Ok(ReplyBody::Unit)
    }

    fn vmm_create(
        &mut self,
        device: u32,
        size: u64,
        handle_types: u64,
        compressed: bool,
    ) -> CallResult {
        self.check_device(device)?;
        let g = self.vmm_granularity()?;
        if size == 0 || !size.is_multiple_of(g) {
            return Err(invalid(format!(
                "{size} bytes is not a multiple of the granularity, {g}"
            )));
        }
        if handle_types & !HANDLE_TYPE_POSIX_FD != 0 {
            return Err(err(
                codes::NOT_SUPPORTED,
                format!("shareable handle types {handle_types:#x}: cumux offers a file descriptor at most"),
            ));
        }
        self.reserve(size)?;
        let shareable = handle_types & HANDLE_TYPE_POSIX_FD != 0;
        let create = VmmOp::Create {
            size,
            shareable,
            compressed,
        };
        let backend = match self.ctx.vmm(&create) {
            Ok(id) => id,
            Err(e) => {
                self.release(size);
                return Err(e);
            }
        };
        // What the device granted, as the driver reports it.
        let compressed = compressed
            && self
                .ctx
                .vmm(&VmmOp::Compressed { physical: backend })
                .is_ok_and(|c| c == 1);
        let handle = self.mint_handle();
        let physical = Physical {
            size,
            backend,
            refs: 1,
            mappings: 0,
            handle_types,
            compressed,
            imported: false,
        };
        self.vmm.physical.insert(handle, physical);
        let stats = &self.core.stats;
        stats.mem_used.fetch_add(size, Ordering::Relaxed);
        stats.allocations.fetch_add(1, Ordering::Relaxed);
        Ok(ReplyBody::Handle(handle))
    }

    /// Frees `handle`'s memory once the program holds no reference to it
    /// and no mapping uses it.
    fn vmm_settle(&mut self, handle: Handle) {
        let unused = self
            .vmm
            .physical
            .get(&handle)
            .is_some_and(|p| p.refs == 0 && p.mappings == 0);
        if !unused {
            return;
        }
        let Some(p) = self.vmm.physical.remove(&handle) else {
            return;
        };
        let op = VmmOp::Release {
            physical: p.backend,
            // An import's memory was never counted as this device's use here.
            size: if p.imported { 0 } else { p.size },
        };
        if let Err(e) = self.ctx.vmm(&op) {
            release_failed(
                self.id(),
                format_args!("freeing physical memory {handle:#x}"),
                &e,
            );
        }
        if p.imported {
            return;
        }
        self.release(p.size);
        let stats = &self.core.stats;
        stats.mem_used.fetch_sub(p.size, Ordering::Relaxed);
        stats.allocations.fetch_sub(1, Ordering::Relaxed);
    }

    fn vmm_map(&mut self, ptr: DevicePtr, size: u64, offset: u64, handle: Handle) -> CallResult {
        let g = self.vmm_granularity()?;
        let whole = self.vmm.held(handle)?.size;
        if size == 0 || !size.is_multiple_of(g) || !ptr.is_multiple_of(g) {
            return Err(invalid(format!(
                "[{ptr:#x}, +{size}): address and size must be multiples of the granularity, {g}"
            )));
        }
        // NVIDIA's driver answers these two "not supported" (measured).
        if offset != 0 || size > whole {
            return Err(err(
                codes::NOT_SUPPORTED,
                format!("a mapping of {size} bytes from {offset} of a {whole}-byte allocation"),
            ));
        }
        if !self.vmm.reserved(ptr, size) {
            // The program's reservation on another of its devices (NCCL maps
            // one device's memory where another reserved): taken as borrowed.
            let borrowed = self.group.as_ref().and_then(|g| g.reservation(ptr, size));
            let Some((base, len)) = borrowed else {
                return Err(invalid(format!(
                    "[{ptr:#x}, +{size}) is not inside an address reservation of this program"
                )));
            };
            self.vmm.borrowed.insert(base, len);
        }
        if self.vmm.mapped_in(ptr, size) {
            return Err(invalid(format!("[{ptr:#x}, +{size}) is mapped already")));
        }
        if self.vmm.mappings.len() >= MAX_MAPPINGS {
            return Err(err(
                codes::OUT_OF_MEMORY,
                format!("a session may hold {MAX_MAPPINGS} mappings"),
            ));
        }
        let backend = self.vmm.held(handle)?.backend;
        self.ctx.vmm(&VmmOp::Map {
            ptr,
            size,
            physical: backend,
        })?;
        self.vmm.held(handle)?.mappings += 1;
        let mapping = Mapping {
            size,
            handle,
            access: ACCESS_NONE,
            peer_access: Vec::new(),
        };
        self.vmm.mappings.insert(ptr, mapping);
        if let Some(group) = &self.group {
            group.publish_range(self.id(), ptr, size, false);
        }
        Ok(ReplyBody::Unit)
    }

    /// Unmaps every mapping in `[ptr, ptr + size)`, which must lie in a
    /// reservation and cut no mapping; parts with nothing mapped are fine
    /// (NVIDIA's driver unmaps such a range without complaint).
    fn vmm_unmap(&mut self, ptr: DevicePtr, size: u64) -> CallResult {
        let bases = self.vmm.mappings_within(ptr, size).ok_or_else(|| {
            invalid(format!(
                "[{ptr:#x}, +{size}) is not a reserved range of this session made of whole mappings"
            ))
        })?;
        if bases.is_empty() {
            return Ok(ReplyBody::Unit);
        }
        // Like cuMemUnmap, wait for work that may still use it.
        self.drain_all();
        for base in bases {
            self.vmm_unmap_one(base);
        }
        Ok(ReplyBody::Unit)
    }

    /// Removes the mapping at `base`, freeing its physical memory if that
    /// was its last use.
    fn vmm_unmap_one(&mut self, base: DevicePtr) {
        if let Some(group) = &self.group {
            group.withdraw_range(base, false);
        }
        let Some(m) = self.vmm.mappings.remove(&base) else {
            return;
        };
        let op = VmmOp::Unmap {
            ptr: base,
            size: m.size,
        };
        if let Err(e) = self.ctx.vmm(&op) {
            release_failed(self.id(), format_args!("unmapping {base:#x}"), &e);
        }
        if let Some(p) = self.vmm.physical.get_mut(&m.handle) {
            p.mappings = p.mappings.saturating_sub(1);
        }
        self.vmm_settle(m.handle);
    }

    fn vmm_set_access(&mut self, ptr: DevicePtr, size: u64, device: u32, flags: u64) -> CallResult {
        if !is_access_flags(flags) {
            return Err(invalid(format!("access flags {flags:#x}")));
        }
        // Another device of the program (XLA gives every peer access to each
        // device's memory): its context, in the same worker process, sets it.
        let peer = match device == self.index {
            true => None,
            false => {
                let reach = self
                    .device
                    .info()
                    .peers
                    .iter()
                    .any(|(d, a)| *d == device && a[1] == 1);
                if !reach {
                    return Err(err(
                        codes::INVALID_DEVICE,
                        format!("device {device} cannot reach this device's memory"),
                    ));
                }
                Some(self.program_device(device)?)
            }
        };
        let bases = self.vmm.whole_mappings(ptr, size).ok_or_else(|| {
            invalid(format!(
                "[{ptr:#x}, +{size}) is not a fully mapped range of this session"
            ))
        })?;
        let op = VmmOp::SetAccess { ptr, size, flags };
        match &peer {
            None => self.ctx.vmm(&op)?,
            Some(peer) => peer.vmm(&op)?,
        };
        for base in bases {
            if let Some(m) = self.vmm.mappings.get_mut(&base) {
                m.set_access(self.index, device, flags);
            }
        }
        Ok(ReplyBody::Unit)
    }

    /// The mapping holding `ptr`, for pointer queries: (base, size).
    pub(super) fn vmm_mapping_of(&self, ptr: DevicePtr) -> Option<(DevicePtr, u64)> {
        self.vmm.mapping_of(ptr).map(|(base, m)| (base, m.size))
    }

    /// Whether `[ptr, ptr + bytes)` is mapped memory this session may write
    /// (`writes`) or read.
    pub(super) fn vmm_accessible(&self, ptr: DevicePtr, bytes: u64, writes: bool) -> bool {
        let need = if writes {
            ACCESS_READWRITE
        } else {
            ACCESS_READ
        };
        !self.vmm.mappings.is_empty() && self.vmm.covers(ptr, bytes, need)
    }

    /// At the session's end: every mapping, physical allocation and
    /// reservation goes back to the device (the tenant's bytes with them).
    pub(super) fn vmm_teardown(&mut self) {
        let bases: Vec<DevicePtr> = self.vmm.mappings.keys().copied().collect();
        for base in bases {
            self.vmm_unmap_one(base);
        }
        let handles: Vec<Handle> = self.vmm.physical.keys().copied().collect();
        for handle in handles {
            if let Some(p) = self.vmm.physical.get_mut(&handle) {
                p.refs = 0;
            }
            self.vmm_settle(handle);
        }
        for (ptr, size) in std::mem::take(&mut self.vmm.reservations) {
            if let Err(e) = self.ctx.vmm(&VmmOp::FreeReservation { ptr, size }) {
                release_failed(self.id(), format_args!("freeing reservation {ptr:#x}"), &e);
            }
        }
    }
}
