//! Resuming a program elsewhere (issue 17): a checkpoint taken with the call it
//! was taken at held, parked on a server under its program's resume key, and
//! rebuilt into the session the program's client opens there to send that call again.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cumux_protocol::{codes, CuError, Hello, ReplyBody};

use super::core::err;
use super::image::{ResumePoint, SessionImage};
use super::image_stream::{self, StreamReader};
use super::{CallResult, Session};
use crate::moves::{Action, Order, Parked, Release, HOLD_LIMIT};
use crate::Server;

/// How often a held session looks whether its client hung up.
const HOLD_CHECK: Duration = Duration::from_millis(250);

impl Session {
    /// The resume key of a session opened by `hello`: the one it names, a
    /// fresh one where its client offers to resume, else 0 (none).
    pub(super) fn resume_key_for(hello: &Hello, id: u64) -> u64 {
        match hello.resume {
            None => 0,
            Some(0) => {
                // Random-keyed SipHash of the session and the time: a key
                // nobody else can guess.
                let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
                hasher.write_u64(id);
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                hasher.write_u128(now);
                hasher.finish().max(1)
            }
            Some(key) => key,
        }
    }

    /// The key this session's client resumes it by; 0: none.
    pub fn resume_key(&self) -> u64 {
        self.resume_key
    }

    /// The `seq` of the call the connection hands [`Session::handle`] next.
    pub fn set_seq(&mut self, seq: u64) {
        self.seq = seq;
    }

    /// Whether the session ends once the call's reply is sent (it moved to
    /// another server).
    pub fn leaving(&self) -> bool {
        self.leaving
    }

    /// Keeps a held checkpoint's `image` on `server` for its program to
    /// resume (`cumux serve --restore`, `Call::SessionPark`): what was parked.
    pub fn park(server: &Server, image: Vec<u8>) -> Result<String, CuError> {
        let decoded = image_stream::verified(&image[..])?;
        let Some(point) = decoded.resume else {
            return Err(err(
                codes::INVALID_VALUE,
                "the checkpoint was taken without --hold: no program can resume it (restore it \
                 into a running session with cumux restore)",
            ));
        };
        server.orders().park(
            point.key,
            Parked {
                image,
                tenant: point.tenant.clone(),
            },
        )?;
        let line = format!(
            "a checkpoint of {} (tenant {:?}) waits for its program to resume at call {}",
            point.program, point.tenant, point.seq
        );
        tracing::info!("{line}");
        Ok(line)
    }

    /// `Action::Hold`: the session's state at the start of this call, with
    /// the call held unanswered until the admin releases it.
    pub(super) fn hold(&mut self, order: Order) -> Option<CallResult> {
        let id = self.id();
        let orders = Arc::clone(&self.server);
        let orders = orders.orders();
        let file = match &order.action {
            Action::Hold(file) => file.clone(),
            _ => None,
        };
        let image = self.held_image();
        let encoded = image.and_then(|image| self.checkpoint_into(&image, file.as_ref()));
        let released = encoded.is_ok().then(|| orders.hold(id));
        match &encoded {
            // Said before the admin hears of it: status shows it held at once.
            Ok(_) => orders.note(id, format!("held at call {} (checkpointed)", self.seq)),
            Err(e) => {
                tracing::warn!(session = id, "an admin's order was refused: {}", e.detail);
                orders.done(id);
            }
        }
        orders.count_answer(order.action.kind(), encoded.is_ok());
        if order.answer.send(encoded).is_err() {
            // Nobody took the image: nothing to hold for.
            orders.unhold(id);
            orders.done(id);
            return None;
        }
        let released = released?;
        tracing::info!(
            session = id,
            seq = self.seq,
            "checkpointed; its call is held"
        );
        let how = self.held_until_released(&released);
        orders.unhold(id);
        orders.done(id);
        match how {
            Some(Release::MovedTo(address)) => {
                tracing::info!(session = id, %address, "moved to another server");
                self.leaving = true;
                Some(Ok(ReplyBody::Moved { address }))
            }
            Some(Release::CarryOn) | None => None,
        }
    }

    /// How a held session goes on: as released, or (`None`) on with its
    /// call, once its client hung up or [`HOLD_LIMIT`] passed.
    fn held_until_released(&self, released: &Receiver<Release>) -> Option<Release> {
        let deadline = Instant::now() + HOLD_LIMIT;
        loop {
            match released.recv_timeout(HOLD_CHECK) {
                Ok(how) => return Some(how),
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) => {}
            }
            if self.hung_up.load(Ordering::Relaxed) {
                tracing::info!(session = self.id(), "its client hung up while held");
                return None;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    session = self.id(),
                    "held for {HOLD_LIMIT:?} without a release: it carries on"
                );
                return None;
            }
        }
    }

    /// The image of a held checkpoint: the session's state and where its
    /// program resumes.
    fn held_image(&mut self) -> Result<SessionImage, CuError> {
        let refuse = |why: &str| {
            Err(err(
                codes::NOT_SUPPORTED,
                format!("session {} cannot be held: {why}", self.id()),
            ))
        };
        if self.resume_key == 0 {
            return refuse(
                "its client cannot resume it elsewhere (run the program with CUMUX_RESUME=1)",
            );
        }
        if !self.host.is_empty() || self.incoming_fd.is_some() {
            return refuse("it shares pinned host memory with this server (cuMemHostAlloc)");
        }
        let mut image = self.quiesced_image("held")?;
        image.resume = Some(ResumePoint {
            key: self.resume_key,
            seq: self.seq,
            tenant: self.tenant_name(),
            program: self
                .entry
                .as_ref()
                .map(|e| e.program.clone())
                .unwrap_or_default(),
        });
        Ok(image)
    }

    fn tenant_name(&self) -> String {
        self.tenant
            .as_ref()
            .map_or_else(|| crate::tenants::DEFAULT_TENANT.into(), |t| t.0.clone())
    }

    /// Rebuilds the checkpoint parked under this session's resume key into
    /// it: the `seq` of the first call its client sends again.
    pub fn resume_parked(&mut self) -> Result<u64, CuError> {
        let key = self.resume_key;
        let orders = Arc::clone(&self.server);
        let orders = orders.orders();
        let parked = orders.unpark(key).ok_or_else(|| {
            err(
                codes::INVALID_VALUE,
                "this server holds no checkpoint for the program to resume (start it with \
                 cumux serve --restore FILE, or move the session here with cumux migrate)",
            )
        })?;
        let result = self.resume_from(&parked);
        if let Err(e) = &result {
            tracing::warn!(session = self.id(), "a resume was refused: {}", e.detail);
            let _ = orders.park(key, parked);
        }
        result
    }

    fn resume_from(&mut self, parked: &Parked) -> Result<u64, CuError> {
        let (mut reader, image) = StreamReader::open(&parked.image[..])?;
        let point = image
            .resume
            .clone()
            .ok_or_else(|| err(codes::INVALID_VALUE, "a parked image with no resume point"))?;
        let tenant = self.tenant_name();
        if point.tenant != tenant || parked.tenant != tenant {
            return Err(err(
                codes::NOT_PERMITTED,
                format!(
                    "the checkpoint is tenant {:?}'s, this program is tenant {tenant:?}'s",
                    point.tenant
                ),
            ));
        }
        let program = self.entry.as_ref().map(|e| e.program.as_str());
        if program.is_some_and(|p| p != point.program) {
            return Err(err(
                codes::INVALID_VALUE,
                format!(
                    "the checkpoint is of program {:?}, not {:?}",
                    point.program,
                    program.unwrap_or_default()
                ),
            ));
        }
        let line = self.restore_image(image, &mut reader)?;
        tracing::info!(session = self.id(), seq = point.seq, "resumed: {line}");
        Ok(point.seq)
    }
}
