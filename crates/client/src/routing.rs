//! Which of the program's devices a call is for, and so which session gets
//! it: the device a handle in it was issued for (each device's session issues
//! handles in a range of its own, `cumux_protocol::device_of_handle`), else
//! the device holding a pointer in it, else the device it names, else the
//! calling thread's current context's.

use cumux_protocol::arrays::{CopyEnd, Resource};
use cumux_protocol::{device_of_handle, ArrayCall, Call, Handle, VmmCall, DEFAULT_STREAM};

use crate::state::{current_device, Placements};

/// The device of work on `stream` (unless the default stream, the current
/// context's) touching device memory at `ptr`: the stream's, else the
/// allocation's; `None` where neither says.
pub fn device_of_access(placements: &Placements, ptr: u64, stream: Option<Handle>) -> Option<u32> {
    stream
        .filter(|&s| s != DEFAULT_STREAM)
        .map(device_of_handle)
        .or_else(|| placements.device_of(ptr))
}

/// The device `call` is for.
pub fn device_of_call(call: &Call, placements: &Placements) -> u32 {
    let handle = |h: Handle| Some(device_of_handle(h));
    let stream = |s: Handle| (s != DEFAULT_STREAM).then(|| device_of_handle(s));
    let ptr = |p: u64| placements.device_of(p);
    let access = |p: u64, s: &Option<Handle>| device_of_access(placements, p, *s);
    let found = match call {
        Call::QueryWithin { query, .. } => return device_of_call(query, placements),
        Call::MemAlloc { device, .. } | Call::MemGetInfo { device } => Some(*device),
        Call::MemFree { ptr: p } | Call::MemAddressRange { ptr: p } => ptr(*p),
        Call::MemcpyHtoD { dst, stream: s, .. }
        | Call::MemcpyHtoDHost { dst, stream: s, .. }
        | Call::Memset { dst, stream: s, .. }
        | Call::MemcpyDtoD { dst, stream: s, .. } => access(*dst, s),
        Call::MemcpyDtoH { src, stream: s, .. } | Call::MemcpyDtoHHost { src, stream: s, .. } => {
            access(*src, s)
        }
        Call::ModuleUnload { module } => handle(*module),
        Call::NewStream { handle: h, .. } | Call::NewEvent { handle: h, .. } => handle(*h),
        Call::Launch { function, .. } => handle(*function),
        Call::ClusterOccupancy { launch, .. } => handle(launch.function),
        Call::TensorMapEncode { request } => ptr(request.global_address),
        Call::StreamDestroy { stream: s }
        | Call::StreamSynchronize { stream: s }
        | Call::StreamQuery { stream: s }
        | Call::StreamWaitEvent { stream: s, .. }
        | Call::Settle { stream: Some(s) } => stream(*s),
        Call::EventRecord { event, .. }
        | Call::EventQuery { event }
        | Call::EventSynchronize { event }
        | Call::EventDestroy { event }
        | Call::EventElapsed { start: event, .. } => handle(*event),
        Call::HostUnregister { region } | Call::Mark { region, .. } => handle(*region),
        Call::IpcGetMemHandle { ptr: p } | Call::IpcCloseMemHandle { ptr: p } => ptr(*p),
        Call::IpcGetEventHandle { event } => handle(*event),
        Call::GraphCreate { launches } => launches.first().and_then(|l| handle(l.function)),
        Call::GraphLaunch { graph, .. } | Call::GraphDestroy { graph } => handle(*graph),
        Call::Vmm(vmm) => match vmm {
            VmmCall::Granularity { device, .. } | VmmCall::Create { device, .. } => Some(*device),
            VmmCall::Release { handle: h }
            | VmmCall::Properties { handle: h }
            | VmmCall::Export { handle: h } => handle(*h),
            VmmCall::Map { handle: h, .. } => handle(*h),
            VmmCall::Free { ptr: p, .. }
            | VmmCall::Unmap { ptr: p, .. }
            | VmmCall::SetAccess { ptr: p, .. }
            | VmmCall::GetAccess { ptr: p, .. }
            | VmmCall::Retain { ptr: p } => ptr(*p),
            VmmCall::Reserve { .. } | VmmCall::Import => None,
        },
        Call::Array(array) => match array {
            ArrayCall::Destroy { array: h }
            | ArrayCall::Describe { array: h }
            | ArrayCall::SurfaceCreate { array: h }
            | ArrayCall::DestroyMipmapped { mipmap: h }
            | ArrayCall::Level { mipmap: h, .. } => handle(*h),
            ArrayCall::Copy { src, dst, .. } => match (src, dst) {
                (CopyEnd::Array { array: h, .. }, _) | (_, CopyEnd::Array { array: h, .. }) => {
                    handle(*h)
                }
                _ => None,
            },
            ArrayCall::TextureCreate { resource, .. } => match resource {
                Resource::Array(h) | Resource::Mipmapped(h) => handle(*h),
                Resource::Linear { ptr: p, .. } | Resource::Pitch2D { ptr: p, .. } => ptr(*p),
            },
            ArrayCall::Create { .. }
            | ArrayCall::CreateMipmapped { .. }
            | ArrayCall::TextureDestroy { .. }
            | ArrayCall::SurfaceDestroy { .. }
            | ArrayCall::TextureDescribe { .. }
            | ArrayCall::SurfaceDescribe { .. } => None,
        },
        Call::ModuleLoad { .. }
        | Call::SetLimit { .. }
        | Call::StreamCreate { .. }
        | Call::EventCreate { .. }
        | Call::ContextSynchronize
        | Call::Settle { stream: None }
        | Call::HostRegister { .. }
        | Call::IpcOpenMemHandle { .. }
        | Call::IpcOpenEventHandle { .. }
        | Call::PeerAccess { .. } => None,
        // Not a program's calls; the first device's session answers them.
        Call::ServerStatus
        | Call::TenantPut { .. }
        | Call::TenantRemove { .. }
        | Call::SessionMove { .. }
        | Call::SessionCheckpoint { .. }
        | Call::SessionCheckpointFile { .. }
        | Call::SessionRestoreFile { .. }
        | Call::SessionRestore { .. }
        | Call::SessionPark { .. }
        | Call::SessionRelease { .. }
        | Call::DeviceHealth { .. }
        | Call::ImageRead { .. }
        | Call::ImageWrite { .. }
        | Call::Fence
        | Call::Lanes { .. } => Some(0),
    };
    found.unwrap_or_else(current_device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cumux_protocol::first_handle;

    #[test]
    fn handles_pointers_and_named_devices_choose_the_session() {
        let placements = Placements::default();
        placements.place(0x7000_0000, 1 << 20, 1).unwrap();
        let on_one = first_handle(1) + 5;
        let launch = Call::Launch {
            function: on_one,
            grid: [1; 3],
            block: [1; 3],
            shared_bytes: 0,
            stream: DEFAULT_STREAM,
            params: Vec::new(),
            attributes: Vec::new(),
        };
        assert_eq!(device_of_call(&launch, &placements), 1);
        let free = Call::MemFree { ptr: 0x7000_0100 };
        assert_eq!(device_of_call(&free, &placements), 1);
        let copy = Call::MemcpyDtoH {
            src: 0x7000_0000,
            bytes: 4,
            stream: Some(first_handle(2)),
        };
        assert_eq!(device_of_call(&copy, &placements), 2, "the stream decides");
        let alloc = Call::MemAlloc {
            device: 3,
            bytes: 1,
        };
        assert_eq!(device_of_call(&alloc, &placements), 3);
        // Nothing in it names a device: the current context's (none: 0).
        assert_eq!(device_of_call(&Call::ContextSynchronize, &placements), 0);
        let wait = Call::StreamWaitEvent {
            stream: DEFAULT_STREAM,
            event: on_one,
        };
        assert_eq!(
            device_of_call(&wait, &placements),
            0,
            "the default stream is the current context's"
        );
    }
}
