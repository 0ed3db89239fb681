//! `cumux tenant put|remove`: an admin lists, changes or removes a tenant
//! while the server runs (`Call::TenantPut`, `Call::TenantRemove`), as a
//! device plugin does for each pod it gives a share of a GPU.

use std::path::PathBuf;

use anyhow::{Context, Result};
use cumux_protocol::{Call, ClientRole, TenantSpec};
use cumux_server::Address;

use crate::config::memory_arg;
use crate::probe;

/// What `cumux tenant` was asked to do.
#[derive(Debug, clap::Subcommand)]
pub enum TenantCommand {
    /// List a tenant, or replace its entry (sessions already open keep theirs).
    Put {
        name: String,
        /// Device memory it may hold, across its sessions (bytes, or K/M/G/T).
        #[arg(long, value_parser = memory_arg)]
        memory_quota: Option<u64>,
        /// Its share of device time under `fair`.
        #[arg(long, default_value_t = 1)]
        weight: u32,
        /// Whether its work is latency-critical (else batch).
        #[arg(long)]
        latency_critical: bool,
        /// Server device ordinals it may use (default: all), e.g. 0,2.
        #[arg(long, value_delimiter = ',')]
        devices: Option<Vec<u32>>,
        /// Peer uids that may act as it (default: anyone), e.g. 1000,1001.
        #[arg(long, value_delimiter = ',')]
        uids: Option<Vec<u32>>,
        /// A file holding the token that names it (`CUMUX_TOKEN`).
        #[arg(long)]
        token_file: Option<PathBuf>,
    },
    /// Take a tenant off the table (its sessions run on).
    Remove { name: String },
}

/// Runs `command` against the server at `address`, as an admin.
pub fn tenant(address: &Address, command: TenantCommand) -> Result<()> {
    let call = match command {
        TenantCommand::Put {
            name,
            memory_quota,
            weight,
            latency_critical,
            devices,
            uids,
            token_file,
        } => {
            let token = token_file
                .map(|path| {
                    std::fs::read_to_string(&path)
                        .with_context(|| format!("cannot read {}", path.display()))
                        .map(|t| t.trim().to_string())
                })
                .transpose()?;
            let spec = TenantSpec {
                memory_quota,
                weight,
                latency_critical,
                devices,
                uids,
                token,
            };
            Call::TenantPut { name, spec }
        }
        TenantCommand::Remove { name } => Call::TenantRemove { name },
    };
    let mut conn = probe::connect_as(address, ClientRole::Status, "cumux tenant", None)?;
    conn.call(call)?;
    Ok(())
}
