//! [`Colocation`]: one program's contexts on several devices, kept in one
//! worker process, so they share one address space (no two of its devices'
//! pointers alias) and reach each other's memory where the hardware can.
//!
//! The first member context to start becomes the host: its worker process
//! (or the `shared` worker its session views) takes the others, each a
//! further connection with a context of its own on its device
//! ([`super::process::serve_worker_beside`]). A member that finds the host
//! dead starts a process of its own and hosts from then on. Members share the
//! host's fate (a fault or the death of the process ends them all).

use std::path::PathBuf;
use std::process::Child;
use std::sync::{Arc, Mutex};

use cumux_protocol::CuError;

use super::spawn::reap_in_background;
use super::stdout_tap::StdoutTap;
use super::wire::NONCE_BYTES;
use crate::locking::lock;

/// Where a program's further contexts join its host process.
#[derive(Clone)]
pub struct Host {
    /// The process's socket for further connections, and their token.
    pub path: PathBuf,
    pub token: [u8; NONCE_BYTES],
    /// The process's printf stream.
    pub tap: Arc<StdoutTap>,
    /// The fate of the process, as its first connection keeps it.
    pub sticky: Arc<Mutex<Option<CuError>>>,
}

/// One program's group of contexts in one worker process.
#[derive(Default)]
pub struct Colocation {
    /// The host, once a member has started.
    host: Mutex<Option<Host>>,
    /// The fate of a process a member started (every member shares it).
    pub(super) sticky: Arc<Mutex<Option<CuError>>>,
    /// That process, reaped once the whole group is gone.
    pub(super) child: Arc<Mutex<Option<Child>>>,
}

impl Colocation {
    pub fn new() -> Arc<Colocation> {
        Arc::new(Colocation::default())
    }

    /// Holds the group's host choice while a member starts, so two members
    /// starting at once do not both start a process.
    pub fn starting(&self) -> std::sync::MutexGuard<'_, Option<Host>> {
        lock(&self.host)
    }
}

impl Drop for Colocation {
    fn drop(&mut self) {
        if let Some(child) = lock(&self.child).take() {
            reap_in_background(child);
        }
    }
}
