//! Descriptors over a unix socket (`SCM_RIGHTS`): how a client hands the
//! server its area's memfd, and pinned regions' memfds after the switch.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Room for one control message carrying descriptors, 8-byte aligned as the
/// kernel's `cmsghdr` wants.
struct ControlBuffer {
    words: Vec<u64>,
    space: usize,
}

impl ControlBuffer {
    /// Room for `fds` descriptors in one `SCM_RIGHTS` message.
    fn for_fds(fds: usize) -> ControlBuffer {
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE((fds * std::mem::size_of::<RawFd>()) as u32) };
        let space = space as usize;
        ControlBuffer {
            words: vec![0u64; space.div_ceil(8)],
            space,
        }
    }

    /// A message header over the one buffer `iov` and this control buffer; it
    /// points at both, so neither may move or drop while it is in use.
    fn header(&mut self, iov: &mut libc::iovec) -> libc::msghdr {
        // SAFETY: an all-zero msghdr is valid; the fields that matter are set below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov;
        msg.msg_iovlen = 1;
        msg.msg_control = self.words.as_mut_ptr().cast();
        msg.msg_controllen = self.space as _;
        msg
    }
}

/// Sends `bytes` on a unix socket with `fd` attached (`SCM_RIGHTS`), in one message.
pub fn send_with_fd(socket: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    let raw: RawFd = fd.as_raw_fd();
    let mut control = ControlBuffer::for_fds(1);
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let msg = control.header(&mut iov);
    // SAFETY: `msg` points at `control`, which has room for one cmsg carrying one
    // descriptor (CMSG_SPACE above); CMSG_FIRSTHDR is non-null for that size and
    // CMSG_DATA points inside it. `iov` and `bytes` outlive the sendmsg call.
    let sent = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), raw);
        libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    if sent as usize != bytes.len() {
        // A short send of a few bytes on a fresh socket: send the rest plainly.
        use std::io::Write;
        let mut s = socket;
        s.write_all(&bytes[sent as usize..])?;
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes from a unix socket and the first descriptor
/// that came with them (any others are closed). 0 bytes: the peer closed.
pub fn recv_with_fd(socket: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut fds = Vec::new();
    let got = recv_with_fds(socket.as_fd(), buf, 0, &mut fds)?;
    let first = if fds.is_empty() {
        None
    } else {
        Some(fds.swap_remove(0))
    };
    Ok((got, first))
}

/// One `recvmsg` of up to `buf.len()` bytes with `flags` (`MSG_DONTWAIT`…),
/// retried on `EINTR`; descriptors that came with the bytes are appended to
/// `fds` (close-on-exec). 0 bytes: the peer closed.
pub fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: libc::c_int,
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    const MAX_FDS: usize = 4;
    let mut control = ControlBuffer::for_fds(MAX_FDS);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut msg = control.header(&mut iov);
    let got = loop {
        // SAFETY: `msg` describes `buf` and `control`, both valid for writes of
        // the lengths given.
        let n =
            unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, flags | libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // SAFETY: walking the control messages the kernel wrote into `control`, with
    // the CMSG macros, which stay within `msg_controllen`; each SCM_RIGHTS
    // payload holds whole descriptors that now belong to this process.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let payload = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                for i in 0..payload / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(got)
}

/// The process, uid and gid at the other end of a unix socket (`SO_PEERCRED`).
pub fn peer_credentials(stream: &UnixStream) -> Option<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes and `len` says how big `cred` is;
    // the descriptor belongs to `stream`, alive for the call.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && len as usize == std::mem::size_of::<libc::ucred>()).then_some(cred)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::area::ShmArea;
    use crate::shm::endpoint::Endpoint;
    use crate::shm::layout::Side;
    use crate::shm::test_data::SMALL;
    use crate::shm::wait::DEFAULT_SPIN;

    #[test]
    fn descriptors_pass_over_a_unix_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let (area, fd) = ShmArea::create(SMALL).unwrap();
        send_with_fd(&a, b"attach", fd.as_fd()).unwrap();
        let mut buf = [0u8; 64];
        let (n, got) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"attach");
        let other = ShmArea::attach(got.expect("a descriptor"), SMALL).unwrap();
        let mut client = Endpoint::new(area, Side::Client, None, DEFAULT_SPIN);
        let mut server = Endpoint::new(other, Side::Server, None, DEFAULT_SPIN);
        client.send(b"over the memfd", &[]).unwrap();
        let (mut msg, mut bulk) = (Vec::new(), Vec::new());
        server.recv(&mut msg, &mut bulk).unwrap();
        assert_eq!(msg, b"over the memfd");
    }
}
