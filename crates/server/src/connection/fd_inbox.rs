//! The descriptor that came last with a unix socket's bytes (`SCM_RIGHTS`):
//! how an admin's checkpoint file reaches the server on a socket's frames.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use cumux_protocol::shm;

use crate::locking::lock;

/// The descriptor (`SCM_RIGHTS`) that came last with a unix socket's bytes:
/// an admin's checkpoint file comes attached to its call's frame. One at
/// most is kept; others are closed.
#[derive(Clone, Default)]
pub struct FdInbox(Arc<Mutex<Option<OwnedFd>>>);

impl FdInbox {
    /// The descriptor that came, taken.
    pub(super) fn take(&self) -> Option<OwnedFd> {
        lock(&self.0).take()
    }

    /// Reads `stream` as `read` would, keeping a descriptor that comes.
    pub(super) fn read(&self, stream: &UnixStream, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut fds = Vec::new();
        let got = shm::recv_with_fds(stream.as_fd(), buf, 0, &mut fds)?;
        if let Some(fd) = fds.pop() {
            *lock(&self.0) = Some(fd);
        }
        Ok(got)
    }
}
