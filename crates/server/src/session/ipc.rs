//! A session's side of memory shared beyond its context: handles to its
//! allocations (`cuIpcGetMemHandle`), other programs' allocations it opened
//! (`cuIpcOpenMemHandle`), which its calls may then name like its own, and
//! peer access to the program's context on another device.

use cumux_protocol::{codes, DevicePtr, Handle, ReplyBody, IPC_HANDLE_BYTES};

use super::core::err;
use super::{CallResult, Session};
use crate::device::ordering::{EVENT_DISABLE_TIMING, EVENT_INTERPROCESS};
use crate::ipc::IpcKind;

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, the one flag of `cuIpcOpenMemHandle`
/// (the driver refuses any other, as a GPU's context may not check).
const IPC_LAZY_ENABLE_PEER_ACCESS: u32 = 1;

/// `CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS`: what an event shared
/// between processes must be made with.
const EVENT_IPC_FLAGS: u32 = EVENT_DISABLE_TIMING | EVENT_INTERPROCESS;

impl Session {
    /// The tenant of a driver session; status queries share no memory.
    fn ipc_tenant(&self) -> Result<String, cumux_protocol::CuError> {
        self.entry
            .as_ref()
            .map(|e| e.tenant.clone())
            .ok_or_else(|| {
                err(
                    codes::NOT_PERMITTED,
                    "only a program's session shares memory",
                )
            })
    }

    /// Whether this session may open `handle` as one of `kind`: one this
    /// server issued to a session of its tenant.
    fn check_openable(&self, kind: IpcKind, handle: &[u8]) -> Result<(), cumux_protocol::CuError> {
        let tenant = self.ipc_tenant()?;
        if handle.len() != IPC_HANDLE_BYTES {
            return Err(err(codes::INVALID_VALUE, "an IPC handle is 64 bytes"));
        }
        if !self.server.ipc().may_open(kind, handle, &tenant) {
            let what = match kind {
                IpcKind::Memory => "a memory",
                IpcKind::Event => "an event",
            };
            return Err(err(
                codes::INVALID_VALUE,
                format!("not {what} handle a program of this tenant gave out on this server"),
            ));
        }
        Ok(())
    }

    /// A handle to the allocation holding `ptr`.
    pub(super) fn ipc_get(&mut self, ptr: DevicePtr) -> CallResult {
        let tenant = self.ipc_tenant()?;
        let base = self
            .allocations
            .range(..=ptr)
            .next_back()
            .filter(|(base, size)| ptr - **base < **size)
            .map(|(base, _)| *base)
            .ok_or_else(|| {
                err(
                    codes::INVALID_VALUE,
                    format!("{ptr:#x} is not in an allocation of this session"),
                )
            })?;
        let handle = self.ctx.ipc_export(base)?;
        self.server
            .ipc()
            .issue(IpcKind::Memory, &handle, &tenant, self.id());
        Ok(ReplyBody::Data(handle))
    }

    /// Opens another program's allocation by a handle this server issued to
    /// a session of this tenant.
    pub(super) fn ipc_open(&mut self, handle: Vec<u8>, flags: u32) -> CallResult {
        if flags & !IPC_LAZY_ENABLE_PEER_ACCESS != 0 {
            return Err(err(
                codes::INVALID_VALUE,
                format!("unknown cuIpcOpenMemHandle flags {flags:#x}"),
            ));
        }
        self.check_openable(IpcKind::Memory, &handle)?;
        let (base, size) = self.ctx.ipc_open(&handle, flags)?;
        self.ipc_opened.insert(base, size);
        Ok(ReplyBody::Range { base, size })
    }

    /// Closes memory opened at `base` (its work done first, as the driver waits).
    pub(super) fn ipc_close(&mut self, base: DevicePtr) -> CallResult {
        if !self.ipc_opened.contains_key(&base) {
            return Err(err(
                codes::INVALID_VALUE,
                format!("{base:#x} is no memory this session opened"),
            ));
        }
        self.drain_all();
        self.ipc_opened.remove(&base);
        self.ctx.ipc_close(base)?;
        Ok(ReplyBody::Unit)
    }

    /// A handle to `event`, made interprocess and without timing, as the
    /// driver requires.
    pub(super) fn ipc_get_event(&mut self, event: Handle) -> CallResult {
        let tenant = self.ipc_tenant()?;
        let flags = *self
            .events
            .get(&event)
            .ok_or_else(|| err(codes::INVALID_HANDLE, format!("unknown event {event:#x}")))?;
        if flags & EVENT_IPC_FLAGS != EVENT_IPC_FLAGS {
            return Err(err(
                codes::INVALID_VALUE,
                "an event shared between processes is made interprocess and without timing",
            ));
        }
        let handle = self.ordered()?.event_ipc_handle(event)?;
        self.server
            .ipc()
            .issue(IpcKind::Event, &handle, &tenant, self.id());
        Ok(ReplyBody::Data(handle))
    }

    /// Opens another program's event (of this tenant) as an event of this
    /// session: waiting for it waits for that program's work.
    pub(super) fn ipc_open_event(&mut self, handle: Vec<u8>) -> CallResult {
        self.check_openable(IpcKind::Event, &handle)?;
        let event = self.mint_handle();
        self.ordered()?.event_open_ipc(event, &handle)?;
        self.events.insert(event, EVENT_IPC_FLAGS);
        Ok(ReplyBody::Handle(event))
    }

    /// Peer access between this session's context and the program's context
    /// on its device `peer` (which the program opened a session for).
    pub(super) fn peer_access(&mut self, peer: u32, enable: bool) -> CallResult {
        self.ipc_tenant()?;
        if peer == self.index {
            return Err(err(
                codes::INVALID_DEVICE,
                "peer access to the context's own device",
            ));
        }
        let peer_ctx = self
            .program_device(peer)
            .map_err(|e| err(codes::INVALID_CONTEXT, e.detail))?;
        self.ctx.peer_access(&*peer_ctx, enable)?;
        Ok(ReplyBody::Unit)
    }

    /// The program's context on its device `device` (a session of its group).
    pub(super) fn program_device(
        &self,
        device: u32,
    ) -> Result<std::sync::Arc<dyn crate::device::DeviceContext>, cumux_protocol::CuError> {
        self.group
            .as_ref()
            .and_then(|g| g.member(device))
            .ok_or_else(|| {
                err(
                    codes::INVALID_DEVICE,
                    format!("the program has no context on its device {device}"),
                )
            })
    }

    /// At the session's end: closes what it opened, withdraws what it gave out.
    pub(super) fn ipc_end(&mut self) {
        if !self.ipc_opened.is_empty() {
            self.drain_all();
        }
        for (base, _) in std::mem::take(&mut self.ipc_opened) {
            if let Err(e) = self.ctx.ipc_close(base) {
                tracing::debug!(
                    session = self.id(),
                    "closing opened memory at {base:#x}: {e}"
                );
            }
        }
        self.server.ipc().withdraw(self.id());
    }
}
