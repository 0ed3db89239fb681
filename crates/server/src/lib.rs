//! The cumux server: the single authority over the devices. It accepts client
//! connections, gives each a session with its own handle and allocation tables,
//! runs their stream-ordered work and reports its state for `cumux status`.
//!
//! Map: [`listener`] accepts connections; [`connection`] speaks the wire protocol
//! for one of them; [`session`] checks and executes calls; [`streams`] orders
//! work per stream; [`device`] is the backend trait with the `cpu` and `model`
//! backends; [`status`] keeps the registry of sessions.

pub mod connection;
pub mod device;
pub mod listener;
pub mod session;
pub mod status;
pub mod streams;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cumux_protocol::DeviceInfo;

pub use device::Device;
pub use listener::{Address, BoundListener};

/// Everything sessions share: the devices, the registry, the clock.
pub struct Server {
    name: String,
    devices: Vec<Arc<dyn Device>>,
    registry: status::Registry,
    started: Instant,
    next_session: AtomicU64,
}

impl Server {
    /// A server over `devices` (ordinals are their positions).
    pub fn new(devices: Vec<Arc<dyn Device>>) -> Arc<Self> {
        Arc::new(Server {
            name: format!("cumux {}", env!("CARGO_PKG_VERSION")),
            devices,
            registry: status::Registry::default(),
            started: Instant::now(),
            next_session: AtomicU64::new(1),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn devices(&self) -> &[Arc<dyn Device>] {
        &self.devices
    }

    /// The device descriptions a client receives at the handshake.
    pub fn device_infos(&self) -> Vec<DeviceInfo> {
        self.devices
            .iter()
            .enumerate()
            .map(|(ordinal, d)| DeviceInfo {
                ordinal: ordinal as u32,
                ..d.info().clone()
            })
            .collect()
    }

    pub fn registry(&self) -> &status::Registry {
        &self.registry
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    fn next_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }
}
