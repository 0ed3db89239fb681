//! A failed device's sessions moved off it (issue 17): when an admin or a
//! call's error marks a device failed, the server moves its sessions where
//! its `on_device_failure` says, round after round until none is left.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use cumux_protocol::{codes, CuError};

use crate::device_health::OnFailure;
use crate::moves::Action;
use crate::Server;

/// How long one move waits for its session's next call.
const MOVE_WAIT: Duration = Duration::from_secs(10);

/// The pause between rounds, for sessions that made no call in the last.
const ROUND_PAUSE: Duration = Duration::from_millis(200);

/// Marks the server's device `device` failed for `reason` and, unless the
/// policy is `stay`, moves its sessions off it on a thread of its own. The
/// line says what was done.
pub fn fail_device(
    server: &Arc<Server>,
    device: u32,
    reason: String,
    by_admin: bool,
) -> Result<String, String> {
    has_device(server, device)?;
    let health = server.health();
    if !health.fail(device, reason.clone(), by_admin) {
        return Ok(format!(
            "device {device} is failed already: {}",
            health.describe(device)
        ));
    }
    let policy = health.failover().on_failure;
    let sessions = sessions_on(server, device).len();
    tracing::error!(
        device,
        sessions,
        on_device_failure = policy.name(),
        "device failed: {reason}; it takes no new programs"
    );
    if policy == OnFailure::Stay {
        return Ok(format!(
            "device {device} is failed: it takes no new programs; its {sessions} session(s) \
             stay (on_device_failure = \"stay\")"
        ));
    }
    let weak = Arc::downgrade(server);
    let spawned = std::thread::Builder::new()
        .name(format!("cumux-failover-{device}"))
        .spawn(move || evacuate(weak, device));
    match spawned {
        Ok(_) => Ok(format!(
            "device {device} is failed: it takes no new programs; its {sessions} session(s) \
             are being moved off it (on_device_failure = \"{}\")",
            policy.name()
        )),
        Err(e) => Err(format!(
            "device {device} is failed, but no thread could be started to move its sessions: {e}"
        )),
    }
}

/// Marks device `device` healthy again; the line says what it had failed with.
pub fn recover_device(server: &Server, device: u32) -> Result<String, String> {
    has_device(server, device)?;
    match server.health().recover(device) {
        Some(failure) => {
            tracing::info!(
                device,
                "device marked healthy again (it had failed: {})",
                failure.reason
            );
            Ok(format!(
                "device {device} takes programs again (it had failed {:.0?} ago: {})",
                failure.since.elapsed(),
                failure.reason
            ))
        }
        None => Ok(format!("device {device} was not failed")),
    }
}

/// Whether the server has a device at position `device`, else why not.
fn has_device(server: &Server, device: u32) -> Result<(), String> {
    match (device as usize) < server.devices().len() {
        true => Ok(()),
        false => Err(format!("the server has no device {device}")),
    }
}

/// The driver sessions on the server's device at position `device`.
fn sessions_on(server: &Server, device: u32) -> Vec<u64> {
    let Some(ordinal) = server
        .devices()
        .get(device as usize)
        .map(|d| d.info().ordinal)
    else {
        return Vec::new();
    };
    let entries = server.registry().entries();
    entries
        .iter()
        .filter(|e| e.device == ordinal)
        .map(|e| e.session)
        .collect()
}

/// Where a failed device's sessions go, as the policy says: `None` where
/// no device can take them.
fn target(server: &Server, from: u32) -> Option<u32> {
    let health = server.health();
    let failover = health.failover();
    let reserve = failover.reserve.filter(|&r| !health.is_failed(r));
    match failover.on_failure {
        OnFailure::Stay => None,
        OnFailure::MigrateToCpu => reserve,
        OnFailure::Migrate => server
            .devices()
            .iter()
            .enumerate()
            .map(|(i, d)| (i as u32, d))
            .filter(|&(i, _)| i != from && health.offered(i))
            .max_by_key(|(_, d)| d.mem_total().saturating_sub(d.mem_used()))
            .map(|(i, _)| i)
            .or(reserve),
    }
}

/// Moves every session off failed `device`, in rounds: a session that made
/// no call within [`MOVE_WAIT`] is tried again next round; one whose move is
/// refused stays, logged. Ends when none is left to move, when the device
/// is healthy again, or when the server is gone.
fn evacuate(server: Weak<Server>, device: u32) {
    let mut refused: HashMap<u64, String> = HashMap::new();
    loop {
        let Some(server) = server.upgrade() else {
            return;
        };
        if !server.health().is_failed(device) {
            tracing::info!(device, "device is healthy again: its sessions stay");
            return;
        }
        let left: Vec<u64> = sessions_on(&server, device)
            .into_iter()
            .filter(|s| !refused.contains_key(s))
            .collect();
        if left.is_empty() {
            match refused.len() {
                0 => tracing::info!(device, "every session has moved off the failed device"),
                n => tracing::error!(
                    device,
                    "{n} session(s) could not move off the failed device and stay on it"
                ),
            }
            return;
        }
        let Some(to) = target(&server, device) else {
            tracing::error!(
                device,
                sessions = left.len(),
                "no healthy device to move the failed device's sessions to: they stay"
            );
            return;
        };
        let moves: Vec<(u64, Result<Vec<u8>, CuError>)> = std::thread::scope(|scope| {
            let server = &server;
            let running: Vec<_> = left
                .iter()
                .map(|&session| (session, scope.spawn(move || move_to(server, session, to))))
                .collect();
            running
                .into_iter()
                .map(|(session, moving)| {
                    let answer = moving.join().unwrap_or_else(|_| {
                        Err(CuError::new(codes::UNKNOWN, "its move's thread failed"))
                    });
                    (session, answer)
                })
                .collect()
        });
        for (session, answer) in moves {
            match answer {
                Ok(line) => tracing::info!(
                    device,
                    session,
                    "off the failed device: {}",
                    String::from_utf8_lossy(&line)
                ),
                // It made no call yet (or has an order waiting): next round.
                Err(e) if e.code == codes::NOT_READY => {}
                Err(e) => {
                    tracing::error!(device, session, "stays on the failed device: {}", e.detail);
                    refused.insert(session, e.detail);
                }
            }
        }
        drop(server);
        std::thread::sleep(ROUND_PAUSE);
    }
}

/// Orders `session` to move to device `to`, and waits for its answer.
fn move_to(server: &Server, session: u64, to: u32) -> Result<Vec<u8>, CuError> {
    let orders = server.orders();
    let answer = orders.post(session, Action::MoveTo(to))?;
    orders.wait(session, &answer, MOVE_WAIT)
}
