//! `cumux run --pool FILE --gpus N --memory SIZE`: asks every server of a pool
//! file which devices the tenant may use and how loaded they are (sessions
//! and programs placed there that have not connected yet, then memory in
//! use), and places the program on the fewest servers whose devices fit,
//! least loaded first.

use std::path::Path;

use anyhow::{bail, Context, Result};
use cumux_protocol::visible_devices::uuid_text;
use cumux_protocol::ClientRole;
use cumux_server::Address;
use serde::Deserialize;

use crate::config::parse_bytes;
use crate::probe;
use crate::status::human_bytes;

/// A pool file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    servers: Vec<RawServer>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    address: String,
    /// The server's certificate fingerprint, for TLS (`CUMUX_TLS_FINGERPRINT`).
    fingerprint: Option<String>,
}

/// The servers of a pool, in the file's order (which breaks ties).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub servers: Vec<Address>,
    /// Fingerprints the file pins, for every server's TLS.
    pub fingerprints: Vec<String>,
}

/// Reads a pool file (TOML: `[[servers]]` tables with `address` and,
/// for TLS, `fingerprint`).
pub fn read(path: &Path) -> Result<Pool> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the pool file {}", path.display()))?;
    parse(&text).with_context(|| format!("pool file {}", path.display()))
}

pub fn parse(text: &str) -> Result<Pool> {
    let raw: RawPool = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
    if raw.servers.is_empty() {
        bail!("it lists no server ([[servers]] with an address)");
    }
    let mut pool = Pool {
        servers: Vec::new(),
        fingerprints: Vec::new(),
    };
    for (i, server) in raw.servers.into_iter().enumerate() {
        let address = Address::parse(&server.address)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("servers[{i}].address"))?;
        if pool.servers.contains(&address) {
            bail!("servers[{i}]: {address} is listed twice");
        }
        if let Some(print) = server.fingerprint {
            cumux_protocol::tls::parse_fingerprint(&print)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("servers[{i}].fingerprint"))?;
            pool.fingerprints.push(print);
        }
        pool.servers.push(address);
    }
    Ok(pool)
}

/// One device a server offers the tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    /// The server, by its place in the pool.
    pub server: usize,
    pub uuid: [u8; 16],
    /// Memory the tenant could have there now.
    pub free: u64,
    /// The share of the device's memory in use, by anyone.
    pub load: f64,
    /// Sessions on it now, anyone's, and programs placed on it that have
    /// not opened theirs yet.
    pub sessions: u32,
}

impl Offer {
    /// How busy it is: its sessions first, then its memory in use.
    fn busy(&self) -> f64 {
        f64::from(self.sessions) + self.load
    }
}

/// Where a program goes: its servers and, in its order, its devices' uuids.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub servers: Vec<Address>,
    /// `CUDA_VISIBLE_DEVICES` for the program.
    pub visible: String,
    /// Each server's share of `visible`, in `servers`' order: what
    /// `cumux run` claims there while the program starts.
    pub visible_per_server: Vec<String>,
    /// What to tell the user.
    pub described: String,
    /// The servers that could not be asked, and why.
    pub left_out: Vec<String>,
}

/// `gpus` devices with at least `memory` free each, from `offers`: on one
/// server if one has enough (the least loaded such server), else across the
/// fewest servers, their least loaded devices first.
pub fn choose(offers: &[Offer], gpus: usize, memory: u64) -> Result<Vec<Offer>, String> {
    let fitting: Vec<&Offer> = offers.iter().filter(|o| o.free >= memory).collect();
    if fitting.len() < gpus {
        return Err(format!(
            "the pool has {} device(s) with {} free for this tenant; the program asks for {gpus}",
            fitting.len(),
            human_bytes(memory)
        ));
    }
    fn by_load(mut devices: Vec<&Offer>) -> Vec<&Offer> {
        devices.sort_by(|a, b| a.busy().total_cmp(&b.busy()));
        devices
    }
    let servers: std::collections::BTreeSet<usize> = fitting.iter().map(|o| o.server).collect();
    // Servers by how much of their fitting devices' memory is in use.
    let mut whole: Vec<(f64, usize, Vec<&Offer>)> = servers
        .iter()
        .map(|&s| {
            let own = by_load(fitting.iter().copied().filter(|o| o.server == s).collect());
            let load = own.iter().map(|o| o.busy()).sum::<f64>() / own.len() as f64;
            (load, s, own)
        })
        .collect();
    whole.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    if let Some((_, _, own)) = whole.iter().find(|(_, _, own)| own.len() >= gpus) {
        return Ok(own[..gpus].iter().map(|o| (*o).clone()).collect());
    }
    // Across servers: the servers with most fitting devices first, so the
    // program spans as few as it can.
    whole.sort_by(|a, b| b.2.len().cmp(&a.2.len()).then(a.0.total_cmp(&b.0)));
    Ok(whole
        .iter()
        .flat_map(|(_, _, own)| own.iter())
        .take(gpus)
        .map(|o| (*o).clone())
        .collect())
}

/// Asks each server of `pool` what `tenant` may use there and places the
/// program (see [`choose`]). Servers that cannot be asked are left out,
/// and named if nothing fits.
pub fn place(pool: &Pool, tenant: Option<&str>, gpus: usize, memory: u64) -> Result<Placement> {
    let mut offers = Vec::new();
    let mut skipped = Vec::new();
    for (server, address) in pool.servers.iter().enumerate() {
        match offers_of(server, address, tenant) {
            Ok(found) => offers.extend(found),
            Err(e) => skipped.push(format!("{address}: {e:#}")),
        }
    }
    let chosen = choose(&offers, gpus, memory).map_err(|why| {
        let mut text = why;
        for s in &skipped {
            text += &format!("\n  left out: {s}");
        }
        anyhow::anyhow!(text)
    })?;
    let mut servers: Vec<usize> = Vec::new();
    for o in &chosen {
        if !servers.contains(&o.server) {
            servers.push(o.server);
        }
    }
    let visible: Vec<String> = chosen.iter().map(|o| uuid_text(&o.uuid)).collect();
    let on = |s: usize| chosen.iter().filter(move |o| o.server == s);
    let described = servers
        .iter()
        .map(|&s| {
            let here: Vec<String> = on(s)
                .map(|o| format!("{} ({} free)", uuid_text(&o.uuid), human_bytes(o.free)))
                .collect();
            format!("{}: {}", pool.servers[s], here.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ");
    let visible_per_server = servers
        .iter()
        .map(|&s| {
            on(s)
                .map(|o| uuid_text(&o.uuid))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    Ok(Placement {
        servers: servers.iter().map(|&s| pool.servers[s].clone()).collect(),
        visible: visible.join(","),
        visible_per_server,
        described,
        left_out: skipped,
    })
}

/// The devices `tenant` may use at `address`, with their free memory and load.
fn offers_of(server: usize, address: &Address, tenant: Option<&str>) -> Result<Vec<Offer>> {
    let devices =
        probe::connect_as(address, ClientRole::Preflight, "cumux run --pool", tenant)?.devices;
    let status =
        probe::connect_as(address, ClientRole::Status, "cumux run --pool", tenant)?.status()?;
    Ok(devices
        .iter()
        .map(|d| {
            let whole = status.devices.iter().find(|s| s.uuid == d.uuid);
            let (free, load, sessions) = match whole {
                Some(s) => (
                    d.total_mem.min(s.total_mem.saturating_sub(s.used_mem)),
                    s.used_mem as f64 / s.total_mem.max(1) as f64,
                    s.sessions + s.claims,
                ),
                None => (d.total_mem, 0.0, 0),
            };
            Offer {
                server,
                uuid: d.uuid,
                free,
                load,
                sessions,
            }
        })
        .collect())
}

/// `--memory` on `cumux run` ([`parse_bytes`]).
pub fn memory_arg(text: &str) -> Result<u64, String> {
    parse_bytes(text).map_err(|e| format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(server: usize, n: u8, free_gib: u64, load: f64) -> Offer {
        Offer {
            server,
            uuid: [n; 16],
            free: free_gib << 30,
            load,
            sessions: 0,
        }
    }

    #[test]
    fn one_server_is_preferred_and_the_least_loaded_one() {
        let offers = [
            offer(0, 1, 40, 0.5),
            offer(0, 2, 40, 0.4),
            offer(1, 3, 80, 0.1),
            offer(1, 4, 80, 0.0),
            offer(2, 5, 80, 0.0),
        ];
        let two = choose(&offers, 2, 20 << 30).unwrap();
        assert_eq!(two.iter().map(|o| o.uuid[0]).collect::<Vec<_>>(), [4, 3]);
        // Only server 0's devices are too small for 50 GiB; server 1 fits.
        let big = choose(&offers, 2, 50 << 30).unwrap();
        assert!(big.iter().all(|o| o.server == 1));
    }

    #[test]
    fn sessions_count_before_memory() {
        let mut busy = offer(0, 1, 40, 0.0);
        busy.sessions = 2;
        let idle = offer(1, 2, 40, 0.3);
        let one = choose(&[busy, idle], 1, 0).unwrap();
        assert_eq!(one[0].uuid[0], 2);
    }

    #[test]
    fn across_servers_when_none_has_enough() {
        let offers = [
            offer(0, 1, 40, 0.0),
            offer(1, 2, 40, 0.2),
            offer(1, 3, 40, 0.1),
            offer(2, 4, 10, 0.0),
        ];
        let three = choose(&offers, 3, 20 << 30).unwrap();
        let servers: Vec<usize> = three.iter().map(|o| o.server).collect();
        assert_eq!(servers, [1, 1, 0]);
        let why = choose(&offers, 4, 20 << 30).unwrap_err();
        assert!(why.contains("3 device(s) with 20.0 GiB free"), "{why}");
    }

    #[test]
    fn pool_files_are_checked() {
        let pool =
            parse("[[servers]]\naddress = \"tcp:10.0.0.1:7000\"\nfingerprint = \"sha256:00\"\n");
        assert!(format!("{:#}", pool.unwrap_err()).contains("servers[0].fingerprint"));
        let pool =
            parse("[[servers]]\naddress = \"unix:/a\"\n[[servers]]\naddress = \"unix:/a\"\n");
        assert!(format!("{:#}", pool.unwrap_err()).contains("listed twice"));
        assert!(parse("servers = []").is_err());
        let ok = parse("[[servers]]\naddress = \"unix:/a\"\n[[servers]]\naddress = \"tcp:b:1\"\n")
            .unwrap();
        assert_eq!(ok.servers.len(), 2);
    }
}
