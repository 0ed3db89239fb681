//! `cumux serve --config FILE`: a TOML file with the server settings (`device`,
//! `listen`, `memory`, `launch_budget`, `policy`; command-line flags win), per-device
//! tables (`[devices.N]`: a device's own `policy`), the tenant table (quotas,
//! weights, classes, devices, uids), the session limits (`[limits]`), the
//! socket's access (`socket_mode`, `socket_group`), TLS on TCP (`tls_cert`,
//! `tls_key`, `tls_client_ca`), and the byte-size syntax
//! (`512M`, `16GiB`, `1.5G`).

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValue, PossibleValuesParser};
use cumux_server::admission::SessionLimits;
use cumux_server::gate::parse_policy;
use cumux_server::tenants::{TenantClass, TenantPolicy, TenantSettings};
use cumux_server::Policy;
use serde::Deserialize;

/// The server settings that a config file and `cumux serve`'s flags both
/// give (the flags win; see [`ServerSettings::or`]). The docs are the flags' help.
#[derive(Debug, Default, Clone, PartialEq, Eq, clap::Args)]
pub struct ServerSettings {
    /// Which devices to serve: auto (GPUs if any, else the CPU device), cpu,
    /// cuda, or worker-cpu (the CPU device in worker processes, as GPUs are
    /// served).
    #[arg(long, value_parser = device_kinds())]
    pub device: Option<String>,
    /// Where to listen: unix:PATH or tcp:HOST:PORT.
    #[arg(long)]
    pub listen: Option<String>,
    /// Device memory of the CPU device, e.g. 4G (default: a quarter of RAM, at most 16 GiB).
    #[arg(long, value_parser = memory_arg)]
    pub memory: Option<u64>,
    /// Instructions one launch may execute on the CPU device, all its thread
    /// blocks together, before it fails with CUDA_ERROR_LAUNCH_TIMEOUT (702),
    /// like the driver's watchdog; it stops a kernel that never ends, however
    /// many blocks it has (default 20000000000, minutes of interpretation;
    /// 0 = unlimited). A single block past it fails at that instruction, a
    /// grid at its next check (every 65536 instructions of a block).
    #[arg(long)]
    pub launch_budget: Option<u64>,
    /// How many CPU devices to serve (cpu and worker-cpu; default 1), each
    /// with --memory of its own: a program can use several, as on a
    /// multi-GPU machine (at most 16).
    #[arg(long)]
    pub cpu_devices: Option<u32>,
    /// The address window (0-15) of this server's first CPU device, and its
    /// number: a program using the CPU devices of several servers needs
    /// them in different windows, so that their pointers never alias
    /// (default 0).
    #[arg(long)]
    pub cpu_window: Option<u32>,
    /// Host threads a CPU device runs a launch's blocks on, and the
    /// multiprocessors it reports (default: one per host core; cpu and
    /// worker-cpu devices only).
    #[arg(long)]
    pub threads: Option<u32>,
    /// How each device shares its time among tenants: fifo (default: no scheduler,
    /// launches go in arrival order), fair (weighted shares of device time) or
    /// priority (latency-critical tenants first). It sets every device's policy
    /// but those a config's [devices.N] table gives a policy of their own.
    #[arg(long, value_parser = PossibleValuesParser::new(cumux_server::gate::POLICIES))]
    pub policy: Option<String>,
    /// How a GPU gives sessions contexts: isolated (default: a context per
    /// session, each in a process of its own; a fault stays with its
    /// session), shared (one context, each session on streams of its
    /// own, kernels side by side; a fault fails every session on it), or
    /// fenced (shared, and each tenant not marked trusted kept to a memory
    /// partition of its own, its PTX rewritten; cubin-only modules refused).
    #[arg(long, value_parser = PossibleValuesParser::new(cumux_server::worker::device::Sharing::NAMES))]
    pub sharing: Option<String>,
    /// Resets a GPU context whose queued work makes no progress for this long
    /// (e.g. 30s, 2m): a kernel that never ends then fails with
    /// CUDA_ERROR_LAUNCH_TIMEOUT (702) instead of holding the GPU; in shared
    /// mode every session on the context fails with it. Default: never. Keep it
    /// far above the longest kernel a tenant may run.
    #[arg(long, value_parser = timeout_arg)]
    pub kernel_timeout: Option<std::time::Duration>,
    /// On SIGTERM or SIGINT, how long sessions already running may go on
    /// (new connections are refused meanwhile) before the server exits
    /// anyway, e.g. 30s (the default), 5m, 0s (stop at once). A second
    /// signal stops it at once.
    #[arg(long, value_parser = drain_arg)]
    pub drain_timeout: Option<std::time::Duration>,
    /// The unix socket's permission bits, in octal (e.g. 0660 for a group of
    /// users), set after it is bound. Default: as the umask leaves them (only
    /// the owner can connect). Its folder must let them reach it: the
    /// default folder is private (0700).
    #[arg(long, value_parser = socket_mode_arg)]
    pub socket_mode: Option<u32>,
    /// The group (name or number) the unix socket is given after it is bound,
    /// so that with --socket-mode 0660 its members can connect.
    #[arg(long)]
    pub socket_group: Option<String>,
    /// Serve Prometheus metrics on this TCP address (HOST:PORT; port 0 picks
    /// one), at /metrics: devices, tenants (counters for the server's life)
    /// and sessions. A non-loopback address needs --insecure.
    #[arg(long)]
    pub metrics: Option<String>,
    /// The certificate chain (PEM) a TCP listener shows; with --tls-key its
    /// TCP clients must speak TLS. A non-loopback TCP address given neither
    /// gets a self-signed pair, made once in $XDG_STATE_HOME/cumux (else
    /// ~/.local/state/cumux) and reused; its fingerprint is printed at start.
    #[arg(long)]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long)]
    pub tls_key: Option<std::path::PathBuf>,
    /// Mutual TLS: TCP clients must show a certificate this CA (PEM) signed
    /// (CUMUX_TLS_CERT and CUMUX_TLS_KEY on the client).
    #[arg(long)]
    pub tls_client_ca: Option<std::path::PathBuf>,
    /// Serve the functions API on this TCP address (HOST:PORT; port 0 picks
    /// one), at /v1/functions: tenants register a module and a plan, then
    /// invoke it over HTTP with their token. A non-loopback address needs
    /// --insecure.
    #[arg(long)]
    pub functions: Option<String>,
    /// The largest request body the functions API takes (a module and its
    /// plan, or an invocation's inputs), e.g. 64M (default 256 MiB); over
    /// it a request gets 413.
    #[arg(long, value_parser = memory_arg)]
    pub functions_max_body: Option<u64>,
    /// Most of one tenant's invocations that run at once on one device, each
    /// in a session of its own (1 to 64, default 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub functions_lanes: Option<u32>,
    /// What happens to a device's sessions when it fails (`cumux device
    /// fail`, or an uncorrectable ECC or NVLink error in a call): stay
    /// (default: they stay, and the device takes no new programs), migrate
    /// (moved to the healthy device with the most memory free), or
    /// migrate-to-cpu (moved to a CPU device the server keeps in reserve,
    /// offered to no program, with --memory of its own).
    #[arg(long, value_parser = PossibleValuesParser::new(cumux_server::device_health::OnFailure::NAMES))]
    pub on_device_failure: Option<String>,
}

impl ServerSettings {
    /// Each of these settings, else `fallback`'s.
    pub fn or(self, fallback: ServerSettings) -> ServerSettings {
        ServerSettings {
            device: self.device.or(fallback.device),
            listen: self.listen.or(fallback.listen),
            memory: self.memory.or(fallback.memory),
            launch_budget: self.launch_budget.or(fallback.launch_budget),
            cpu_devices: self.cpu_devices.or(fallback.cpu_devices),
            cpu_window: self.cpu_window.or(fallback.cpu_window),
            threads: self.threads.or(fallback.threads),
            policy: self.policy.or(fallback.policy),
            sharing: self.sharing.or(fallback.sharing),
            kernel_timeout: self.kernel_timeout.or(fallback.kernel_timeout),
            drain_timeout: self.drain_timeout.or(fallback.drain_timeout),
            socket_mode: self.socket_mode.or(fallback.socket_mode),
            socket_group: self.socket_group.or(fallback.socket_group),
            metrics: self.metrics.or(fallback.metrics),
            tls_cert: self.tls_cert.or(fallback.tls_cert),
            tls_key: self.tls_key.or(fallback.tls_key),
            tls_client_ca: self.tls_client_ca.or(fallback.tls_client_ca),
            functions: self.functions.or(fallback.functions),
            functions_max_body: self.functions_max_body.or(fallback.functions_max_body),
            functions_lanes: self.functions_lanes.or(fallback.functions_lanes),
            on_device_failure: self.on_device_failure.or(fallback.on_device_failure),
        }
    }
}

/// The devices `--device` takes; `model` (the server tests' model device,
/// which runs no real kernels) is left out of the help.
fn device_kinds() -> PossibleValuesParser {
    PossibleValuesParser::new([
        PossibleValue::new("auto"),
        PossibleValue::new("cpu"),
        PossibleValue::new("cuda"),
        PossibleValue::new("worker-cpu"),
        PossibleValue::new("model").hide(true),
    ])
}

/// A byte count on the command line ([`parse_bytes`]).
pub fn memory_arg(text: &str) -> Result<u64, String> {
    parse_bytes(text).map_err(|e| format!("{e:#}"))
}

/// A timeout on the command line ([`parse_duration`]).
fn timeout_arg(text: &str) -> Result<std::time::Duration, String> {
    parse_duration(text).map_err(|e| format!("{e:#}"))
}

/// A drain timeout on the command line ([`parse_drain_timeout`]).
fn drain_arg(text: &str) -> Result<std::time::Duration, String> {
    parse_drain_timeout(text).map_err(|e| format!("{e:#}"))
}

/// A socket mode on the command line ([`parse_socket_mode`]).
fn socket_mode_arg(text: &str) -> Result<u32, String> {
    parse_socket_mode(text).map_err(|e| format!("{e:#}"))
}

/// Settings a config file may give.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FileConfig {
    pub settings: ServerSettings,
    /// Settings of single devices (`[devices.N]`).
    pub devices: DeviceTables,
    pub tenants: TenantPolicy,
}

/// What a `[devices.N]` table sets for device `N`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DeviceSettings {
    /// This device's scheduling policy, over the default of every device.
    pub policy: Option<String>,
}

/// The `[devices.N]` tables of a config, by server ordinal.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DeviceTables(pub BTreeMap<u32, DeviceSettings>);

impl DeviceTables {
    /// The scheduling policy of each of `count` devices, in device order: its
    /// `[devices.N]` policy, else `default`. Tables of devices past `count` are
    /// ignored (see [`DeviceTables::beyond`]).
    pub fn policies(&self, default: Policy, count: usize) -> Result<Vec<Policy>> {
        (0..count)
            .map(|ordinal| {
                let own = self
                    .0
                    .get(&(ordinal as u32))
                    .and_then(|d| d.policy.as_deref());
                match own {
                    Some(name) => parse_policy(name)
                        .map_err(anyhow::Error::msg)
                        .with_context(|| format!("[devices.{ordinal}]: policy")),
                    None => Ok(default),
                }
            })
            .collect()
    }

    /// The ordinals of `[devices.N]` tables that name no device of a server of
    /// `count` devices.
    pub fn beyond(&self, count: usize) -> Vec<u32> {
        self.0
            .keys()
            .copied()
            .filter(|&ordinal| ordinal as usize >= count)
            .collect()
    }
}

/// A byte count written as an integer or as a string with a unit (`"4G"`).
#[derive(Debug, Clone)]
enum Bytes {
    Count(u64),
    Text(String),
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(BytesVisitor)
    }
}

/// Reads a [`Bytes`], saying what is wrong with a negative or fractional number.
struct BytesVisitor;

impl serde::de::Visitor<'_> for BytesVisitor {
    type Value = Bytes;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(
            "a byte count: a whole number of bytes, or a string such as \"512M\" or \"1.5G\"",
        )
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Bytes, E> {
        Ok(Bytes::Count(n))
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Bytes, E> {
        u64::try_from(n)
            .map(Bytes::Count)
            .map_err(|_| E::custom(format!("{n} bytes: a byte count cannot be negative")))
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Bytes, E> {
        Err(E::custom(format!(
            "{n}: a byte count is a whole number of bytes; write fractions with a unit, as a string (\"1.5G\")"
        )))
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Bytes, E> {
        Ok(Bytes::Text(text.to_string()))
    }
}

impl Bytes {
    fn get(&self) -> Result<u64> {
        match self {
            Bytes::Count(n) => Ok(*n),
            Bytes::Text(t) => parse_bytes(t),
        }
    }
}

/// A socket mode written as a string of octal digits (`"0660"`) or as a
/// TOML octal integer (`0o660`).
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "a socket mode: a string of octal digits such as \"0660\""
)]
enum Mode {
    Bits(i64),
    Text(String),
}

impl Mode {
    fn get(&self) -> Result<u32> {
        match self {
            Mode::Text(t) => parse_socket_mode(t),
            Mode::Bits(n) => match u32::try_from(*n) {
                Ok(bits) if bits <= 0o777 => check_socket_mode(bits),
                _ => bail!(
                    "{n} is not a mode: write it in octal, as a string (\"0660\") or as 0o660"
                ),
            },
        }
    }
}

/// The file as written. Unknown keys are errors, so typos do not pass silently.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    device: Option<String>,
    listen: Option<String>,
    memory: Option<Bytes>,
    launch_budget: Option<u64>,
    cpu_devices: Option<u32>,
    cpu_window: Option<u32>,
    threads: Option<u32>,
    policy: Option<String>,
    sharing: Option<String>,
    kernel_timeout: Option<String>,
    drain_timeout: Option<String>,
    socket_mode: Option<Mode>,
    socket_group: Option<String>,
    metrics: Option<String>,
    tls_cert: Option<std::path::PathBuf>,
    tls_key: Option<std::path::PathBuf>,
    tls_client_ca: Option<std::path::PathBuf>,
    functions: Option<String>,
    functions_max_body: Option<Bytes>,
    functions_lanes: Option<u32>,
    on_device_failure: Option<String>,
    #[serde(default = "yes")]
    allow_unknown: bool,
    #[serde(default)]
    defaults: RawTenant,
    #[serde(default)]
    tenants: BTreeMap<String, RawTenant>,
    #[serde(default)]
    limits: RawLimits,
    /// Lets a `cumux status` with this token (`CUMUX_TOKEN`) see every tenant.
    admin_token: Option<String>,
    admin_token_file: Option<std::path::PathBuf>,
    /// Each `[devices.N]` table as written; read into [`RawDevice`] one by one,
    /// so an error names its device.
    #[serde(default)]
    devices: BTreeMap<String, toml::Value>,
}

fn yes() -> bool {
    true
}

/// `[limits]`: the most sessions the server holds, in all and per holder.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    sessions: Option<u32>,
    sessions_per_peer: Option<u32>,
    sessions_per_uid: Option<u32>,
    sessions_per_tenant: Option<u32>,
}

impl RawLimits {
    fn limits(&self) -> SessionLimits {
        let base = SessionLimits::default();
        SessionLimits {
            total: self.sessions.unwrap_or(base.total),
            per_peer: self.sessions_per_peer.unwrap_or(base.per_peer),
            per_uid: self.sessions_per_uid.unwrap_or(base.per_uid),
            per_tenant: self.sessions_per_tenant.unwrap_or(base.per_tenant),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    memory_quota: Option<Bytes>,
    weight: Option<u32>,
    class: Option<TenantClass>,
    devices: Option<Vec<u32>>,
    uids: Option<Vec<u32>>,
    token: Option<String>,
    /// A file whose first line is the token (a secret kept out of the config).
    token_file: Option<std::path::PathBuf>,
    /// `shared` mode runs the tenant's kernels unfenced.
    trusted: Option<bool>,
    /// The share of a GPU's SMs the tenant may use, 1 to 100 (100: all).
    sm_percent: Option<u8>,
}

/// A token given in the config or in a file of its own.
fn token_of(
    what: &str,
    token: Option<String>,
    file: Option<std::path::PathBuf>,
) -> Result<Option<String>> {
    match (token, file) {
        (Some(_), Some(_)) => bail!("{what}: token and token_file both given"),
        (token, None) => Ok(token),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("{what}: cannot read token_file {}", path.display()))?;
            Ok(Some(text.lines().next().unwrap_or("").trim().to_string()))
        }
    }
}

impl RawTenant {
    fn settings(self, what: &str) -> Result<TenantSettings> {
        let base = TenantSettings::default();
        Ok(TenantSettings {
            memory_quota: self
                .memory_quota
                .map(|b| b.get())
                .transpose()
                .with_context(|| format!("{what}: memory_quota"))?,
            weight: self.weight.unwrap_or(base.weight),
            class: self.class.unwrap_or(base.class),
            devices: self.devices,
            uids: self.uids,
            token: token_of(what, self.token, self.token_file)?,
            trusted: self.trusted.unwrap_or(base.trusted),
            sm_percent: match self.sm_percent {
                Some(0) | Some(101..) => {
                    bail!("{what}: sm_percent is a share of the SMs, 1 to 100")
                }
                Some(100) | None => None,
                Some(p) => Some(p),
            },
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of device settings")]
struct RawDevice {
    policy: Option<String>,
}

/// Reads one `[devices.N]` table: `N` a server ordinal, its policy one we know.
fn device_settings(key: &str, table: toml::Value) -> Result<(u32, DeviceSettings)> {
    let what = format!("[devices.{key}]");
    let ordinal: u32 = key
        .parse()
        .map_err(|_| anyhow::anyhow!("{what}: {key:?} is not a device ordinal (0, 1, 2 …)"))?;
    let raw: RawDevice = table
        .try_into()
        .map_err(|e| anyhow::anyhow!("{what}: {}", e.to_string().trim()))?;
    if let Some(name) = &raw.policy {
        parse_policy(name)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("{what}: policy"))?;
    }
    Ok((ordinal, DeviceSettings { policy: raw.policy }))
}

/// Reads a config file.
pub fn read(path: &std::path::Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    parse(&text).with_context(|| format!("in config {}", path.display()))
}

pub fn parse(text: &str) -> Result<FileConfig> {
    let raw: RawConfig = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut tenants = BTreeMap::new();
    for (name, t) in raw.tenants {
        let settings = t.settings(&format!("[tenants.{name}]"))?;
        tenants.insert(name, settings);
    }
    let policy = TenantPolicy {
        allow_unknown: raw.allow_unknown,
        defaults: raw.defaults.settings("[defaults]")?,
        tenants,
        limits: raw.limits.limits(),
        admin_token: token_of("admin_token", raw.admin_token, raw.admin_token_file)?,
    };
    policy.validate().map_err(anyhow::Error::msg)?;
    if let Some(name) = &raw.policy {
        parse_policy(name)
            .map_err(anyhow::Error::msg)
            .context("policy")?;
    }
    let mut devices = BTreeMap::new();
    for (key, table) in raw.devices {
        let (ordinal, settings) = device_settings(&key, table)?;
        if devices.insert(ordinal, settings).is_some() {
            bail!("[devices.{key}]: device {ordinal} has two tables");
        }
    }
    if let Some(name) = &raw.sharing {
        cumux_server::worker::device::Sharing::parse(name)
            .map_err(anyhow::Error::msg)
            .context("sharing")?;
    }
    if let Some(name) = &raw.on_device_failure {
        cumux_server::device_health::OnFailure::parse(name).map_err(anyhow::Error::msg)?;
    }
    let settings = ServerSettings {
        on_device_failure: raw.on_device_failure,
        policy: raw.policy,
        sharing: raw.sharing,
        kernel_timeout: raw
            .kernel_timeout
            .as_deref()
            .map(parse_duration)
            .transpose()
            .context("kernel_timeout")?,
        device: raw.device,
        listen: raw.listen,
        memory: raw.memory.map(|m| m.get()).transpose().context("memory")?,
        launch_budget: raw.launch_budget,
        cpu_devices: raw.cpu_devices,
        cpu_window: raw.cpu_window,
        threads: raw.threads,
        drain_timeout: raw
            .drain_timeout
            .as_deref()
            .map(parse_drain_timeout)
            .transpose()
            .context("drain_timeout")?,
        socket_mode: raw
            .socket_mode
            .map(|m| m.get())
            .transpose()
            .context("socket_mode")?,
        socket_group: raw.socket_group,
        metrics: raw.metrics,
        tls_cert: raw.tls_cert,
        tls_key: raw.tls_key,
        tls_client_ca: raw.tls_client_ca,
        functions: raw.functions,
        functions_max_body: raw
            .functions_max_body
            .map(|m| m.get())
            .transpose()
            .context("functions_max_body")?,
        functions_lanes: match raw.functions_lanes {
            Some(n) if !(1..=64).contains(&n) => {
                anyhow::bail!("functions_lanes: {n} is not between 1 and 64")
            }
            n => n,
        },
    };
    Ok(FileConfig {
        settings,
        devices: DeviceTables(devices),
        tenants: policy,
    })
}

/// Parses a duration with its unit (`30s`, `500ms`, `2m`, `1h 30m`); zero is refused.
pub fn parse_duration(text: &str) -> Result<std::time::Duration> {
    let d = humantime::parse_duration(text.trim())
        .with_context(|| format!("{text:?} is not a duration (e.g. 30s, 500ms, 2m)"))?;
    if d.is_zero() {
        bail!("{text:?}: a timeout must be longer than zero");
    }
    Ok(d)
}

/// Parses a drain timeout (`30s`, `2m`); zero stops at once.
pub fn parse_drain_timeout(text: &str) -> Result<std::time::Duration> {
    humantime::parse_duration(text.trim())
        .with_context(|| format!("{text:?} is not a duration (e.g. 30s, 2m, 0s)"))
}

/// Parses a socket mode in octal (`0660`, `660`, `0o660`): permission bits
/// only, and the owner keeps read and write.
pub fn parse_socket_mode(text: &str) -> Result<u32> {
    let t = text.trim();
    let digits = t.strip_prefix("0o").unwrap_or(t);
    let bits = u32::from_str_radix(digits, 8)
        .ok()
        .filter(|b| *b <= 0o777 && !digits.is_empty())
        .with_context(|| {
            format!("{text:?} is not a socket mode: octal permission bits such as 0660 or 0600")
        })?;
    check_socket_mode(bits)
}

fn check_socket_mode(bits: u32) -> Result<u32> {
    if bits & 0o600 != 0o600 {
        bail!("mode {bits:04o} takes reading or writing from the socket's owner, the server itself: keep 0o600 in it (e.g. 0660)");
    }
    Ok(bits)
}

/// Parses `1073741824`, `512M`, `512MiB`, `16G`, `16GiB`, `64K`, `1.5G`
/// (powers of 1024, in any case; `MB` means `MiB`; a fraction is rounded to
/// a whole number of bytes).
pub fn parse_bytes(text: &str) -> Result<u64> {
    let t = text.trim();
    if t.starts_with('-') {
        bail!("{text:?}: a byte count cannot be negative");
    }
    parse_size::Config::new()
        .with_binary()
        .parse_size(t)
        .map_err(|e| match e {
            parse_size::Error::PosOverflow => anyhow::anyhow!("{text:?} is too large"),
            _ => anyhow::anyhow!(
                "{text:?} is not a byte count: write a number and one of B, K, M, G or T (powers of 1024; KiB, MB, MiB … mean the same), e.g. 4096, 512M or 1.5G"
            ),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_files() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("512M").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("16GiB").unwrap(), 16 << 30);
        assert!(parse_bytes("12Q").is_err());
        assert!(parse_bytes("").is_err());
        let c =
            parse("# cumux\ndevice = \"cpu\"\nlisten = \"unix:/tmp/x.sock\"\nmemory = \"1G\"\n")
                .unwrap();
        assert_eq!(c.settings.device.as_deref(), Some("cpu"));
        assert_eq!(c.settings.listen.as_deref(), Some("unix:/tmp/x.sock"));
        assert_eq!(c.settings.memory, Some(1 << 30));
        assert_eq!(c.tenants, TenantPolicy::default());
        assert_eq!(parse("memory = 4096").unwrap().settings.memory, Some(4096));
        assert_eq!(
            parse("policy = \"fair\"")
                .unwrap()
                .settings
                .policy
                .as_deref(),
            Some("fair")
        );
        assert!(parse("policy = \"lottery\"").is_err());
        assert_eq!(
            parse("sharing = \"shared\"")
                .unwrap()
                .settings
                .sharing
                .as_deref(),
            Some("shared")
        );
        assert!(parse("sharing = \"everything\"").is_err());
        assert_eq!(
            parse("kernel_timeout = \"1m 30s\"")
                .unwrap()
                .settings
                .kernel_timeout,
            Some(std::time::Duration::from_secs(90))
        );
        assert_eq!(parse("").unwrap().settings.kernel_timeout, None);
        for bad in ["\"soon\"", "\"0s\"", "30"] {
            let e = parse(&format!("kernel_timeout = {bad}")).unwrap_err();
            assert!(format!("{e:#}").contains("kernel_timeout"), "{bad}: {e:#}");
        }
        assert_eq!(
            parse("launch_budget = 0").unwrap().settings.launch_budget,
            Some(0)
        );
        assert_eq!(
            parse("launch_budget = 1000000")
                .unwrap()
                .settings
                .launch_budget,
            Some(1_000_000)
        );
        assert_eq!(parse("").unwrap().settings.launch_budget, None);
        assert!(parse("colour = \"blue\"").is_err());
    }

    #[test]
    fn tenant_tables() {
        let c = parse(
            r#"
allow_unknown = false

[defaults]
memory_quota = "256M"

[tenants.alice]
memory_quota = "4G"
weight = 3
class = "latency-critical"
devices = [0]
uids = [1000, 1001]

[tenants.batchjobs]
"#,
        )
        .unwrap();
        let t = &c.tenants;
        assert!(!t.allow_unknown);
        assert_eq!(t.defaults.memory_quota, Some(256 << 20));
        let alice = &t.tenants["alice"];
        assert_eq!(alice.memory_quota, Some(4 << 30));
        assert_eq!(alice.weight, 3);
        assert_eq!(alice.class, TenantClass::LatencyCritical);
        assert_eq!(alice.devices.as_deref(), Some(&[0][..]));
        assert_eq!(alice.uids.as_deref(), Some(&[1000, 1001][..]));
        assert!(!alice.trusted, "tenants are fenced unless trusted");
        assert_eq!(t.tenants["batchjobs"], TenantSettings::default());
        assert!(parse("[tenants.x]\nweight = 0\n").is_err());
        let trusted = parse("[tenants.x]\ntrusted = true\n").unwrap();
        assert!(trusted.tenants.tenants["x"].trusted);
        assert!(parse("[tenants.x]\nclass = \"urgent\"\n").is_err());
        let capped = |p: &str| parse(&format!("[tenants.x]\nsm_percent = {p}\n"));
        assert_eq!(
            capped("25").unwrap().tenants.tenants["x"].sm_percent,
            Some(25)
        );
        assert_eq!(capped("100").unwrap().tenants.tenants["x"].sm_percent, None);
        for bad in ["0", "101", "-5", "\"half\""] {
            assert!(capped(bad).is_err(), "sm_percent = {bad}");
        }
        assert!(parse("[tenants.x]\nquota = 5\n").is_err());
    }

    #[test]
    fn tokens_limits_and_their_errors() {
        let dir = cumux_testkit::TempDir::new("config-tokens");
        let file = dir.0.join("bob.token");
        std::fs::write(&file, "bob-token-from-a-file\n").unwrap();
        let text = format!(
            "admin_token = \"admin-token-0123456789\"\n[limits]\nsessions = 9\n\
             [tenants.bob]\ntoken_file = \"{}\"\n[tenants.eve]\ntoken = \"eve-token-0123456789\"\n",
            file.display()
        );
        let config = parse(&text).unwrap();
        let tenants = &config.tenants;
        assert_eq!(
            tenants.tenants["bob"].token.as_deref(),
            Some("bob-token-from-a-file")
        );
        assert_eq!(
            tenants.tenants["eve"].token.as_deref(),
            Some("eve-token-0123456789")
        );
        assert!(tenants.is_admin_token(Some("admin-token-0123456789")));
        assert_eq!(tenants.limits.total, 9);
        let short = parse("[tenants.x]\ntoken = \"short\"\n").unwrap_err();
        assert!(
            format!("{short:#}").contains("16 to 256 bytes"),
            "{short:#}"
        );
        let both = parse(&format!(
            "[tenants.x]\ntoken = \"0123456789abcdef\"\ntoken_file = \"{}\"\n",
            file.display()
        ))
        .unwrap_err();
        assert!(format!("{both:#}").contains("both given"), "{both:#}");
        let zero = parse("[limits]\nsessions_per_peer = 0\n").unwrap_err();
        assert!(
            format!("{zero:#}").contains("sessions_per_peer"),
            "{zero:#}"
        );
    }

    #[test]
    fn on_device_failure_takes_its_three_policies_and_refuses_a_typo() {
        for name in ["stay", "migrate", "migrate-to-cpu"] {
            let c = parse(&format!("on_device_failure = \"{name}\"")).unwrap();
            assert_eq!(c.settings.on_device_failure.as_deref(), Some(name));
        }
        let e = format!("{:#}", parse("on_device_failure = \"to-cpu\"").unwrap_err());
        assert!(e.contains("stay, migrate, migrate-to-cpu"), "{e}");
    }

    #[test]
    fn device_tables_override_the_policy_per_device() {
        let c = parse(
            r#"
policy = "fair"

[devices.1]
policy = "priority"

[devices.3]
policy = "fifo"

[devices.4]
"#,
        )
        .unwrap();
        assert_eq!(c.settings.policy.as_deref(), Some("fair"));
        assert_eq!(c.devices.0[&1].policy.as_deref(), Some("priority"));
        assert_eq!(c.devices.0[&4], DeviceSettings::default());
        let by_name = |name: &str| parse_policy(name).unwrap();
        let (fifo, fair, priority) = (by_name("fifo"), by_name("fair"), by_name("priority"));
        // The file's global policy is the default of every device without its own …
        assert_eq!(
            c.devices.policies(fair, 5).unwrap(),
            [fair, priority, fair, fifo, fair]
        );
        // … and so is the command line's, which wins over it.
        assert_eq!(c.devices.policies(fifo, 3).unwrap(), [fifo, priority, fifo]);
        // Tables past the server's devices are left out, and reported.
        assert_eq!(c.devices.policies(fair, 1).unwrap(), [fair]);
        assert_eq!(c.devices.beyond(2), [3, 4]);
        assert!(c.devices.beyond(5).is_empty());
        // Dotted keys and inline tables say the same.
        let dotted =
            parse("devices.1.policy = \"priority\"\ndevices.3 = { policy = \"fifo\" }\n").unwrap();
        assert_eq!(
            dotted.devices.policies(fair, 4).unwrap(),
            [fair, priority, fair, fifo]
        );
        assert_eq!(parse("").unwrap().devices, DeviceTables::default());
    }

    #[test]
    fn bad_device_tables_are_errors_naming_the_device() {
        let error = |text: &str| format!("{:#}", parse(text).unwrap_err());
        let e = error("[devices.1]\npolicy = \"lottery\"\n");
        assert!(
            e.contains("[devices.1]")
                && e.contains("lottery")
                && e.contains("fifo, fair or priority"),
            "{e}"
        );
        let e = error("[devices.2]\npolicy = \"fair\"\nweight = 3\n");
        assert!(e.contains("[devices.2]") && e.contains("weight"), "{e}");
        let e = error("[devices.gpu0]\npolicy = \"fair\"\n");
        assert!(e.contains("[devices.gpu0]") && e.contains("ordinal"), "{e}");
        let e = error("[devices.-1]\npolicy = \"fair\"\n");
        assert!(e.contains("[devices.-1]"), "{e}");
        let e = error("[devices.1]\npolicy = \"fair\"\n[devices.01]\npolicy = \"fifo\"\n");
        assert!(e.contains("device 1 has two tables"), "{e}");
        let e = error("[devices]\n0 = \"fair\"\n");
        assert!(e.contains("[devices.0]"), "{e}");
        // The global policy is still checked by name too.
        let e = error("policy = \"lottery\"\n[devices.0]\npolicy = \"fair\"\n");
        assert!(e.contains("policy") && e.contains("lottery"), "{e}");
    }

    #[test]
    fn byte_counts_take_fractions_and_say_what_is_wrong() {
        assert_eq!(parse_bytes("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("0.5 MiB").unwrap(), 512 << 10);
        assert_eq!(parse_bytes("0.25K").unwrap(), 256);
        assert_eq!(parse_bytes("2.0g").unwrap(), 2 << 30);
        let error = |text: &str| format!("{:#}", parse_bytes(text).unwrap_err());
        let e = error("1.5Q");
        assert!(e.contains("\"1.5Q\"") && e.contains("K, M, G"), "{e}");
        assert!(
            error("-5").contains("cannot be negative"),
            "{}",
            error("-5")
        );
        assert_eq!(parse_bytes("0.1K").unwrap(), 102);
        assert!(error("1.2.3G").contains("not a byte count"));
        assert!(error("G").contains("not a byte count"));
        assert!(error("99999999999T").contains("too large"));
        // In the file: a negative or fractional number says so, with the key's line.
        let e = format!(
            "{:#}",
            parse("[tenants.alice]\nmemory_quota = -5\n").unwrap_err()
        );
        assert!(
            e.contains("cannot be negative")
                && e.contains("memory_quota")
                && !e.contains("untagged"),
            "{e}"
        );
        let e = format!("{:#}", parse("memory = 1.5\n").unwrap_err());
        assert!(
            e.contains("whole number of bytes") && e.contains("\"1.5G\""),
            "{e}"
        );
        let e = format!(
            "{:#}",
            parse("[defaults]\nmemory_quota = \"1.5X\"\n").unwrap_err()
        );
        assert!(
            e.contains("[defaults]: memory_quota") && e.contains("not a byte count"),
            "{e}"
        );
        assert_eq!(
            parse("[tenants.bob]\nmemory_quota = \"1.5G\"\n")
                .unwrap()
                .tenants
                .tenants["bob"]
                .memory_quota,
            Some(3 << 29)
        );
    }

    #[test]
    fn socket_access_and_drain_timeout() {
        let c =
            parse("socket_mode = \"0660\"\nsocket_group = \"cumux\"\ndrain_timeout = \"45s\"\n")
                .unwrap();
        assert_eq!(c.settings.socket_mode, Some(0o660));
        assert_eq!(c.settings.socket_group.as_deref(), Some("cumux"));
        assert_eq!(
            c.settings.drain_timeout,
            Some(std::time::Duration::from_secs(45))
        );
        assert_eq!(
            parse("socket_mode = 0o600").unwrap().settings.socket_mode,
            Some(0o600)
        );
        assert_eq!(
            parse("drain_timeout = \"0s\"")
                .unwrap()
                .settings
                .drain_timeout,
            Some(std::time::Duration::ZERO)
        );
        for (bad, why) in [
            ("socket_mode = 660", "octal"),
            ("socket_mode = \"0999\"", "not a socket mode"),
            ("socket_mode = \"4770\"", "not a socket mode"),
            ("socket_mode = \"0060\"", "owner"),
            ("drain_timeout = \"soon\"", "drain_timeout"),
        ] {
            let e = format!("{:#}", parse(bad).unwrap_err());
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert_eq!(parse_socket_mode("0o640").unwrap(), 0o640);
    }
}
