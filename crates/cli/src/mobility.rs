//! `cumux migrate`, `cumux drain`, `cumux checkpoint` and `cumux restore`:
//! an admin moves a running session to another device or server, every
//! session off a device, or a session's state to a file and back (issue 17).

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

/// A checkpoint's image as the server answered it: whole, or staged on the
/// connection and read in pieces.
fn image_of(conn: &mut probe::Connection, reply: ReplyBody) -> Result<Vec<u8>> {
    let bytes = match reply {
        ReplyBody::Data(image) => return Ok(image),
        ReplyBody::ImageStaged { bytes } => bytes,
        other => bail!("unexpected answer to a checkpoint: {other:?}"),
    };
    let mut image = Vec::with_capacity(usize::try_from(bytes)?);
    while (image.len() as u64) < bytes {
        let offset = image.len() as u64;
        let piece = (bytes - offset).min(IMAGE_PIECE_BYTES as u64);
        match conn.call(Call::ImageRead {
            offset,
            bytes: piece,
        })? {
            ReplyBody::Data(d) if d.len() as u64 == piece => image.extend_from_slice(&d),
            other => bail!("unexpected answer to an image read: {other:?}"),
        }
    }
    Ok(image)
}

/// `image` for a restore or park on `conn`: itself where one call carries
/// it, else staged there in pieces first, and then the call names none.
fn sent_image(conn: &mut probe::Connection, image: Vec<u8>) -> Result<Vec<u8>> {
    if image.len() <= IMAGE_PIECE_BYTES {
        return Ok(image);
    }
    for (i, piece) in image.chunks(IMAGE_PIECE_BYTES).enumerate() {
        conn.call(Call::ImageWrite {
            offset: (i * IMAGE_PIECE_BYTES) as u64,
            data: piece.to_vec(),
        })?;
    }
    Ok(Vec::new())
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
    let parked = image_of(&mut source, reply).and_then(|image| {
        bytes = image.len();
        let image = sent_image(&mut there, image)?;
        there.call(Call::SessionPark { image })
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
/// its next call, written to `file` (checksummed, compressed). With `hold`
/// that call is held unanswered, so that `cumux serve --restore FILE` can
/// resume the program after the server restarts.
pub fn checkpoint(
    address: &Address,
    session: u64,
    file: &Path,
    hold: bool,
    wait: Duration,
) -> Result<()> {
    let mut conn = admin(address, "cumux checkpoint")?;
    let call = Call::SessionCheckpoint {
        session,
        wait_ms: wait_ms(wait),
        hold,
    };
    let reply = conn.call(call)?;
    let mut image = Vec::new();
    let written = image_of(&mut conn, reply).and_then(|got| {
        image = got;
        checkpoint_file::write(file, &image)
    });
    let written = match written {
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
        "session {session} checkpointed to {}: {} bytes of state, {written} in the file",
        file.display(),
        image.len()
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

/// `cumux restore FILE --session SESSION`: the session's state replaced by
/// the checkpoint's, at its next call.
pub fn restore(address: &Address, file: &Path, session: u64, wait: Duration) -> Result<()> {
    let image = checkpoint_file::read(file)?;
    let mut conn = admin(address, "cumux restore")?;
    let image = sent_image(&mut conn, image)?;
    let call = Call::SessionRestore {
        session,
        image,
        wait_ms: wait_ms(wait),
    };
    let reply = conn.call(call)?;
    println!("{}", said(reply));
    Ok(())
}
