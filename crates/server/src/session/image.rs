//! A session's state as data (issue 17): its memory with the bytes at their
//! addresses, its modules as their images with the handles its client knows,
//! its streams, events and graphs; encoded for checkpoints.

use cumux_protocol::{codes, CuError, DevicePtr, Handle};
use serde::{Deserialize, Serialize};

use crate::device::LaunchGeometry;

/// The layout of [`SessionImage`]; an image of another is refused.
pub const IMAGE_FORMAT: u32 = 2;

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
    pub allocations: Vec<Bytes>,
    pub modules: Vec<ModuleImage>,
    pub streams: Vec<StreamImage>,
    /// Events and their `CU_EVENT_*` flags (their recorded times do not move).
    pub events: Vec<(Handle, u32)>,
    pub graphs: Vec<GraphImage>,
    /// The context's limits (`CUlimit`, value), as `cuCtxSetLimit` set them.
    pub limits: Vec<(u32, u64)>,
    /// Where its program resumes, for an image taken with the call it was
    /// taken at held (`cumux checkpoint --hold`); `None` for a rollback image.
    pub resume: Option<ResumePoint>,
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

/// Device memory at `ptr`: its bytes.
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
    #[serde(with = "serde_bytes")]
    pub image: Vec<u8>,
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
            .fold(0u64, |sum, a| sum.saturating_add(a.bytes.len() as u64));
        self.modules
            .iter()
            .fold(allocations, |sum, m| sum.saturating_add(m.charged))
    }

    pub fn encode(&self) -> Result<Vec<u8>, CuError> {
        // Room for the memory at once: grown from empty, a 1 GiB image took
        // 2.9 s to encode here instead of 1.9 s.
        postcard::to_extend(self, Vec::with_capacity(self.size_hint()))
            .map_err(|e| CuError::new(codes::UNKNOWN, format!("cannot encode the image: {e}")))
    }

    /// About the bytes the encoded image takes: its memory and modules, and
    /// room for the rest.
    fn size_hint(&self) -> usize {
        let memory = |b: &Bytes| b.bytes.len() + 16;
        let modules: usize = self
            .modules
            .iter()
            .map(|m| m.image.len() + m.globals.iter().map(memory).sum::<usize>())
            .sum();
        self.allocations.iter().map(memory).sum::<usize>() + modules + (64 << 10)
    }

    /// Reads an image, refusing one of another layout.
    pub fn decode(bytes: &[u8]) -> Result<Self, CuError> {
        let image: SessionImage = postcard::from_bytes(bytes).map_err(|e| {
            CuError::new(
                codes::INVALID_VALUE,
                format!("not a session image of this cumux: {e}"),
            )
        })?;
        if image.format != IMAGE_FORMAT {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                format!(
                    "a session image of format {}, this server reads {IMAGE_FORMAT}",
                    image.format
                ),
            ));
        }
        Ok(image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_reads_back_and_garbage_or_another_format_is_refused() {
        let image = SessionImage {
            format: IMAGE_FORMAT,
            index: 0,
            window: 1,
            next_handle: 9,
            allocations: vec![Bytes {
                ptr: 0x2000_0000_0000,
                bytes: vec![1, 2, 3],
            }],
            modules: Vec::new(),
            streams: vec![StreamImage {
                handle: 5,
                flags: 1,
                priority: 0,
            }],
            events: vec![(6, 2)],
            graphs: Vec::new(),
            limits: vec![(2, 8 << 20)],
            resume: Some(ResumePoint {
                key: 77,
                seq: 12,
                tenant: "t".into(),
                program: "p".into(),
            }),
        };
        let bytes = image.encode().unwrap();
        assert_eq!(SessionImage::decode(&bytes).unwrap(), image);
        assert_eq!(image.charged_bytes(), 3);
        assert!(SessionImage::decode(&bytes[..bytes.len() / 2]).is_err());
        let other = SessionImage {
            format: IMAGE_FORMAT + 1,
            ..image
        };
        let e = SessionImage::decode(&other.encode().unwrap()).unwrap_err();
        assert!(e.detail.contains("format"), "{e:?}");
    }
}
