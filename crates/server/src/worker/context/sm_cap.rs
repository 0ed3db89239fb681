//! A worker context's SM cap (a tenant's `sm_percent`, issue 20): kept until
//! its worker starts, then asked of the worker before anything else.

use cumux_protocol::{codes, CuError};

use super::{unexpected, WorkerContext};
use crate::locking::lock;
use crate::sm_parts::SmPart;
use crate::worker::link::Connection;
use crate::worker::wire::{WorkerRequest, WorkerValue};

impl WorkerContext {
    /// Keeps `percent` for the worker's start (a context's worker starts at
    /// its first call); refused once it has started.
    pub(super) fn keep_sm_cap(&self, part: SmPart) -> Result<(), CuError> {
        if lock(&self.conn).is_some() {
            return Err(CuError::new(
                codes::INVALID_CONTEXT,
                "an SM cap comes before a context's first call",
            ));
        }
        *lock(&self.sm_cap) = Some(part);
        Ok(())
    }

    /// A session of a shared context: the streams its connection makes from
    /// now on run on `part` of the SMs (the worker's connection thread makes
    /// them in a green context); asked before the session makes any.
    pub(crate) fn cap_streams(&self, part: SmPart) -> Result<(), CuError> {
        match self.call(&WorkerRequest::SmCap { part }, &[], None)? {
            WorkerValue::Number(sms) => {
                tracing::info!(%part, sms, "a shared context's session runs on a part of its GPU's SMs");
                Ok(())
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Puts the context on its share of the SMs, if it has a cap, before
    /// anything else is made in it.
    pub(super) fn cap_sms(&self, mut conn: Connection) -> Result<Connection, CuError> {
        let Some(part) = *lock(&self.sm_cap) else {
            return Ok(conn);
        };
        match self.exchange(&mut conn, &WorkerRequest::SmCap { part })? {
            WorkerValue::Number(sms) => {
                tracing::info!(
                    %part,
                    sms,
                    "a session's kernels run on a part of its GPU's SMs"
                );
                Ok(conn)
            }
            other => Err(unexpected(&other)),
        }
    }
}
