//! A session's state as data (issue 17): where its memory lies, its modules
//! as their images with the handles its client knows, its streams, events
//! and graphs. Memory's bytes travel apart from it (`session::image_stream`).

use std::sync::Arc;

use cumux_protocol::{DevicePtr, Handle};
use serde::{Deserialize, Serialize};

use crate::device::LaunchGeometry;

/// The layout of [`SessionImage`]; an image of another is refused.
pub const IMAGE_FORMAT: u32 = 4;

/// What a session holds, taken while none of its work runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionImage {
    pub format: u32,
    /// The program's number of the session's device: its handles say it.
    pub index: u32,
    /// The address window its pointers lie in.
    pub window: u32,
    /// The next handle the session issues.
    pub next_handle: Handle,
    /// Its allocations, in the order their bytes follow the image.
    pub allocations: Vec<Allocation>,
    pub modules: Vec<ModuleImage>,
    pub streams: Vec<StreamImage>,
    /// Events and their `CU_EVENT_*` flags (their recorded times do not move).
    pub events: Vec<(Handle, u32)>,
    pub graphs: Vec<GraphImage>,
    /// The context's limits (`CUlimit`, value), as `cuCtxSetLimit` set them.
    pub limits: Vec<(u32, u64)>,
    /// Globals its program holds at addresses where they no longer are
    /// (an earlier move's driver put them elsewhere): (the program's
    /// address, bytes, where they are in this image).
    pub aliases: Vec<(DevicePtr, u64, DevicePtr)>,
    /// Where its program resumes, for an image taken with the call it was
    /// taken at held (`cumux checkpoint --hold`); `None` for a rollback image.
    pub resume: Option<ResumePoint>,
}

impl SessionImage {
    /// An image of a session that holds nothing, in window `window`.
    pub fn empty(window: u32) -> SessionImage {
        SessionImage {
            format: IMAGE_FORMAT,
            index: 0,
            window,
            next_handle: 1,
            allocations: Vec::new(),
            modules: Vec::new(),
            streams: Vec::new(),
            events: Vec::new(),
            graphs: Vec::new(),
            limits: Vec::new(),
            aliases: Vec::new(),
            resume: None,
        }
    }
}

/// The call a held checkpoint was taken at, and whose program may resume it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumePoint {
    /// The resume key the session's first welcome gave its client.
    pub key: u64,
    /// The held call: every earlier one is in the image, it and later ones
    /// are not; the client sends them again.
    pub seq: u64,
    pub tenant: String,
    /// The program's name, as its hello said.
    pub program: String,
}

/// An allocation of `size` bytes at `ptr` (its bytes travel apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub ptr: DevicePtr,
    pub size: u64,
}

/// Device memory at `ptr`: its bytes (a module's global).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct Bytes {
    pub ptr: DevicePtr,
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes at {:#x}", self.bytes.len(), self.ptr)
    }
}

/// A loaded module: its image, what its loading allocated (in order), its
/// functions' handles (kernel by kernel) and its globals' bytes.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct ModuleImage {
    pub handle: Handle,
    /// Shared with the session's module entry: a move copies no image.
    #[serde(with = "shared_bytes")]
    pub image: Arc<Vec<u8>>,
    pub blocks: Vec<DevicePtr>,
    pub functions: Vec<Handle>,
    pub globals: Vec<Bytes>,
    /// Bytes of globals charged to the tenant.
    pub charged: u64,
}

impl std::fmt::Debug for ModuleImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleImage")
            .field("handle", &self.handle)
            .field("image_bytes", &self.image.len())
            .field("functions", &self.functions)
            .field("globals", &self.globals)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamImage {
    pub handle: Handle,
    pub flags: u32,
    pub priority: i32,
}

/// A graph of launches, each naming its kernel by module handle and index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphImage {
    pub handle: Handle,
    pub launches: Vec<LaunchImage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchImage {
    pub module: Handle,
    pub kernel: u64,
    pub geometry: LaunchGeometry,
    #[serde(with = "serde_bytes")]
    pub params: Vec<u8>,
}

impl SessionImage {
    /// Bytes of device memory the image holds, as the tenant is charged.
    pub fn charged_bytes(&self) -> u64 {
        let allocations = self
            .allocations
            .iter()
            .fold(0u64, |sum, a| sum.saturating_add(a.size));
        self.modules
            .iter()
            .fold(allocations, |sum, m| sum.saturating_add(m.charged))
    }
}

/// Shared bytes written as `serde_bytes` writes a `Vec<u8>`: the same
/// encoding as before they were shared.
mod shared_bytes {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Arc<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        serde_bytes::serialize(bytes.as_slice(), s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<Vec<u8>>, D::Error> {
        serde_bytes::ByteBuf::deserialize(d).map(|b| Arc::new(b.into_vec()))
    }
}
