//! `cumux migrate`, `cumux drain`, `cumux checkpoint`, `cumux restore` and
//! `cumux device fail|ok`: an admin moves a running session to another device
//! or server, every session off a device, a session's state to a file and
//! back, or marks a device failed (issue 17).

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use cumux_protocol::{Call, ClientRole, ReplyBody, IMAGE_PIECE_BYTES};
use cumux_server::Address;

use crate::checkpoint_file;
use crate::probe;

/// How long each order waits, by default, for its session's next call.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

fn admin(address: &Address, what: &str) -> Result<probe::Connection> {
    probe::connect_as(address, ClientRole::Status, what, None)
        .with_context(|| format!("cannot reach the server at {address}"))
}

fn wait_ms(wait: Duration) -> u64 {
    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)
}

/// A checkpoint stream as the server answered it, handed to `out` piece by
/// piece: whole in the answer, or staged on the connection and read in
/// pieces. The stream's bytes.
fn stream_of(
    conn: &mut probe::Connection,
    reply: ReplyBody,
    out: &mut dyn FnMut(u64, Vec<u8>) -> Result<()>,
) -> Result<u64> {
    let bytes = match reply {
        ReplyBody::Data(image) => {
            let len = image.len() as u64;
            out(0, image)?;
            return Ok(len);
        }
        ReplyBody::ImageStaged { bytes } => bytes,
        other => bail!("unexpected answer to a checkpoint: {other:?}"),
    };
    let mut offset = 0;
    while offset < bytes {
        let piece = (bytes - offset).min(IMAGE_PIECE_BYTES as u64);
        match conn.call(Call::ImageRead {
            offset,
            bytes: piece,
        })? {
            ReplyBody::Data(d) if d.len() as u64 == piece => out(offset, d)?,
            other => bail!("unexpected answer to an image read: {other:?}"),
        }
        offset += piece;
    }
    Ok(bytes)
}

/// Stages a checkpoint stream's pieces on `conn` for its next restore or
/// park ([`Call::ImageWrite`]), where it does not fit one call: the image
/// the call then names (the piece itself, or none).
struct Stager<'a> {
    conn: &'a mut probe::Connection,
    /// A stream's first piece, kept until a second comes or it ends.
    first: Option<Vec<u8>>,
}

impl Stager<'_> {
    fn piece(&mut self, offset: u64, data: Vec<u8>) -> Result<()> {
        if offset == 0 {
            self.first = Some(data);
            return Ok(());
        }
        if let Some(first) = self.first.take() {
            self.conn.call(Call::ImageWrite {
                offset: 0,
                data: first,
            })?;
        }
        self.conn.call(Call::ImageWrite { offset, data })?;
        Ok(())
    }

    /// The image the restore or park call names.
    fn image(self) -> Vec<u8> {
        self.first.unwrap_or_default()
    }
}

/// What the server said it did.
fn said(reply: ReplyBody) -> String {
    match reply {
        ReplyBody::Data(line) => String::from_utf8_lossy(&line).into_owned(),
        other => format!("{other:?}"),
    }
}

/// Where `cumux migrate --to` sends a session.
pub enum Destination {
    /// A device of its server, by ordinal.
    Device(u32),
    /// Another server (`unix:PATH` or `tcp:HOST:PORT`).
    Server(Address),
}

impl Destination {
    pub fn parse(text: &str) -> Result<Destination> {
        if let Ok(device) = text.trim().parse::<u32>() {
            return Ok(Destination::Device(device));
        }
        Address::parse(text)
            .map(Destination::Server)
            .map_err(|e| anyhow::anyhow!("--to {text}: a device number, or a server: {e}"))
    }
}

/// `cumux migrate SESSION --to DEVICE|SERVER`: prints what was done.
pub fn migrate(address: &Address, session: u64, to: &Destination, wait: Duration) -> Result<()> {
    match to {
        Destination::Device(device) => migrate_to_device(address, session, *device, wait),
        Destination::Server(target) => migrate_to_server(address, session, target, wait),
    }
}

/// The session held at its next call, its image parked on `target`, then
/// its held call answered "moved there": its client (run with
/// CUMUX_RESUME=1) reconnects there and sends the call again. A target that
/// does not take it leaves it carrying on where it was.
fn migrate_to_server(
    address: &Address,
    session: u64,
    target: &Address,
    wait: Duration,
) -> Result<()> {
    // Both servers first: an unreachable target leaves the session alone.
    let mut source = admin(address, "cumux migrate")?;
    let mut there = admin(target, "cumux migrate")?;
    let started = std::time::Instant::now();
    let call = Call::SessionCheckpoint {
        session,
        wait_ms: wait_ms(wait),
        hold: true,
    };
    let reply = source.call(call)?;
    let mut bytes = 0;
    let mut stager = Stager {
        conn: &mut there,
        first: None,
    };
    // Piece by piece from one server to the other: read, then written.
    let relayed = stream_of(&mut source, reply, &mut |offset, piece| {
        stager.piece(offset, piece)
    });
    let parked = relayed.and_then(|relayed| {
        bytes = relayed;
        let Stager { conn, first } = stager;
        let image = first.unwrap_or_default();
        conn.call(Call::SessionPark { image })
    });
    if let Err(e) = parked {
        let release = Call::SessionRelease {
            session,
            moved_to: None,
        };
        let carried_on = source.call(release).is_ok();
        bail!(
            "the server at {target} did not take session {session}{}: {e:#}",
            match carried_on {
                true => " (it carries on where it was)",
                false => "",
            }
        );
    }
    let release = Call::SessionRelease {
        session,
        moved_to: Some(target.to_string()),
    };
    source.call(release)?;
    println!(
        "session {session} moved to the server at {target}: {bytes} bytes of state in {:.1?}",
        started.elapsed()
    );
    Ok(())
}

fn migrate_to_device(address: &Address, session: u64, device: u32, wait: Duration) -> Result<()> {
    let mut conn = admin(address, "cumux migrate")?;
    let call = Call::SessionMove {
        session,
        device,
        wait_ms: wait_ms(wait),
    };
    let reply = conn.call(call)?;
    println!("{}", said(reply));
    Ok(())
}

/// `cumux device fail DEVICE --reason TEXT` (`failed`: the reason) or
/// `cumux device ok DEVICE`: prints what the server did.
pub fn device_health(address: &Address, device: u32, failed: Option<String>) -> Result<()> {
    let mut conn = admin(address, "cumux device")?;
    let reply = conn.call(Call::DeviceHealth { device, failed })?;
    println!("{}", said(reply));
    Ok(())
}

/// `cumux drain DEVICE [--to DEVICE]`: every session of `device` moved to
/// `to`, else to the other device with the most memory free. Fails, after
/// trying them all, if any session stayed.
pub fn drain(address: &Address, device: u32, to: Option<u32>, wait: Duration) -> Result<()> {
    let mut conn = admin(address, "cumux drain")?;
    let status = conn.status()?;
    if status.shown != "all" {
        bail!(
            "draining a device needs an admin: the server's own user or root, or its admin token"
        );
    }
    if !status.devices.iter().any(|d| d.ordinal == device) {
        bail!("the server has no device {device}");
    }
    let target = match to {
        Some(to) => to,
        None => status
            .devices
            .iter()
            .filter(|d| d.ordinal != device)
            .max_by_key(|d| d.total_mem.saturating_sub(d.used_mem))
            .map(|d| d.ordinal)
            .context("the server has no other device to move sessions to")?,
    };
    let sessions: Vec<u64> = status
        .sessions
        .iter()
        .filter(|s| s.device == device)
        .map(|s| s.session)
        .collect();
    // Every session at once, each on an admin connection of its own: a
    // move's target is made ready while its program runs on, and a short
    // program may end while another's move waits.
    let moves: Vec<_> = sessions
        .iter()
        .map(|&session| {
            let address = address.clone();
            let call = Call::SessionMove {
                session,
                device: target,
                wait_ms: wait_ms(wait),
            };
            let moved = std::thread::spawn(move || -> Result<String> {
                let mut conn = admin(&address, "cumux drain")?;
                Ok(said(conn.call(call)?))
            });
            (session, moved)
        })
        .collect();
    let mut stayed = Vec::new();
    for (session, moved) in moves {
        match moved.join() {
            Ok(Ok(line)) => println!("{line}"),
            Ok(Err(e)) => {
                eprintln!("session {session}: {e:#}");
                stayed.push(session);
            }
            Err(_) => {
                eprintln!("session {session}: its move's thread failed");
                stayed.push(session);
            }
        }
    }
    if !stayed.is_empty() {
        bail!(
            "{} of {} sessions stayed on device {device}: {stayed:?}",
            stayed.len(),
            sessions.len()
        );
    }
    println!(
        "device {device} drained: {} sessions moved to device {target}",
        sessions.len()
    );
    Ok(())
}

/// `cumux checkpoint SESSION FILE [--hold]`: the session's state, taken at
/// its next call, written to `file` (checksummed, compressed where that
/// pays). On a unix socket the server writes it straight into the file,
/// whose descriptor goes with the call; over TCP it comes in pieces. The
/// file takes its name only once complete. With `hold` that call is held
/// unanswered, so that `cumux serve --restore FILE` can resume the program
/// after the server restarts.
pub fn checkpoint(
    address: &Address,
    session: u64,
    file: &Path,
    hold: bool,
    wait: Duration,
) -> Result<()> {
    let mut conn = admin(address, "cumux checkpoint")?;
    let partial = checkpoint_file::Partial::create(file)?;
    let written = write_checkpoint(&mut conn, address, session, hold, wait, &partial.file)
        .and_then(|said| {
            let started = std::time::Instant::now();
            let size = partial.commit()?;
            Ok((said, size, started.elapsed()))
        });
    let (said, size, committed) = match written {
        Ok(written) => written,
        Err(e) if hold => {
            let release = Call::SessionRelease {
                session,
                moved_to: None,
            };
            let _ = conn.call(release);
            return Err(e.context(format!("session {session} was released: it carries on")));
        }
        Err(e) => return Err(e),
    };
    println!(
        "session {session} checkpointed to {}: {said}; the file has {size} bytes, synced and \
         named here in {:.3} s",
        file.display(),
        committed.as_secs_f64()
    );
    if hold {
        println!(
            "its program waits at the call the checkpoint was taken at; restart the server \
             with `cumux serve --restore {}` and it resumes there",
            file.display()
        );
    }
    Ok(())
}

/// The checkpoint written into `out`: what the server said of it.
fn write_checkpoint(
    conn: &mut probe::Connection,
    address: &Address,
    session: u64,
    hold: bool,
    wait: Duration,
    mut out: &std::fs::File,
) -> Result<String> {
    let wait_ms = wait_ms(wait);
    if let Address::Unix(_) = address {
        let call = Call::SessionCheckpointFile {
            session,
            wait_ms,
            hold,
        };
        return conn.call_with_fd(call, out.as_fd()).map(said);
    }
    let call = Call::SessionCheckpoint {
        session,
        wait_ms,
        hold,
    };
    let reply = conn.call(call)?;
    let bytes = stream_of(conn, reply, &mut |_, piece| {
        out.write_all(&piece).context("cannot write the checkpoint")
    })?;
    Ok(format!("{bytes} bytes, in pieces over TCP"))
}

/// `cumux restore FILE --session SESSION`: the session's state replaced by
/// the checkpoint's, at its next call. On a unix socket the server reads
/// the file itself, whose descriptor goes with the call, checking it as it
/// rebuilds; over TCP it goes in pieces.
pub fn restore(address: &Address, file: &Path, session: u64, wait: Duration) -> Result<()> {
    let mut input = checkpoint_file::open(file)?;
    let mut conn = admin(address, "cumux restore")?;
    let reply = match address {
        Address::Unix(_) => {
            let call = Call::SessionRestoreFile {
                session,
                wait_ms: wait_ms(wait),
            };
            conn.call_with_fd(call, input.as_fd())
        }
        Address::Tcp(_) => {
            let mut stager = Stager {
                conn: &mut conn,
                first: None,
            };
            let mut offset = 0u64;
            loop {
                let mut piece = Vec::with_capacity(IMAGE_PIECE_BYTES);
                (&mut input)
                    .take(IMAGE_PIECE_BYTES as u64)
                    .read_to_end(&mut piece)
                    .with_context(|| format!("cannot read {}", file.display()))?;
                if piece.is_empty() {
                    break;
                }
                let len = piece.len() as u64;
                stager.piece(offset, piece)?;
                offset += len;
            }
            let call = Call::SessionRestore {
                session,
                image: stager.image(),
                wait_ms: wait_ms(wait),
            };
            conn.call(call)
        }
    };
    let reply = reply.with_context(|| format!("{} is refused", file.display()))?;
    println!("{}", said(reply));
    Ok(())
}
