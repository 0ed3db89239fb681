//! `cumux serve --config FILE`: a TOML file with the server settings (`device`,
//! `listen`, `memory`, `launch_budget`, `policy`; command-line flags win) and the tenant table (quotas,
//! weights, classes, devices, uids), and the byte-size syntax (`512M`, `16GiB`).

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use cumux_server::tenants::{TenantClass, TenantPolicy, TenantSettings};
use serde::Deserialize;

/// Settings a config file may give.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FileConfig {
    pub device: Option<String>,
    pub listen: Option<String>,
    pub memory: Option<u64>,
    /// Instructions one block of a CPU device launch may execute before the
    /// launch fails with CUDA_ERROR_LAUNCH_TIMEOUT (702); 0 = unlimited.
    pub launch_budget: Option<u64>,
    /// The scheduling policy of every device: `fifo`, `fair` or `priority`.
    pub policy: Option<String>,
    /// How GPUs give sessions contexts: `isolated` or `shared`.
    pub sharing: Option<String>,
    pub tenants: TenantPolicy,
}

/// A byte count written as an integer or as a string with a unit (`"4G"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Bytes {
    Count(u64),
    Text(String),
}

impl Bytes {
    fn get(&self) -> Result<u64> {
        match self {
            Bytes::Count(n) => Ok(*n),
            Bytes::Text(t) => parse_bytes(t),
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
    policy: Option<String>,
    sharing: Option<String>,
    #[serde(default = "yes")]
    allow_unknown: bool,
    #[serde(default)]
    defaults: RawTenant,
    #[serde(default)]
    tenants: BTreeMap<String, RawTenant>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    memory_quota: Option<Bytes>,
    weight: Option<u32>,
    class: Option<TenantClass>,
    devices: Option<Vec<u32>>,
    uids: Option<Vec<u32>>,
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
        })
    }
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
    };
    policy.validate().map_err(anyhow::Error::msg)?;
    if let Some(name) = &raw.policy {
        cumux_server::gate::parse_policy(name)
            .map_err(anyhow::Error::msg)
            .context("policy")?;
    }
    if let Some(name) = &raw.sharing {
        cumux_server::device::worker::Sharing::parse(name)
            .map_err(anyhow::Error::msg)
            .context("sharing")?;
    }
    Ok(FileConfig {
        policy: raw.policy,
        sharing: raw.sharing,
        device: raw.device,
        listen: raw.listen,
        memory: raw.memory.map(|m| m.get()).transpose().context("memory")?,
        launch_budget: raw.launch_budget,
        tenants: policy,
    })
}

/// Parses `1073741824`, `512M`, `512MiB`, `16G`, `16GiB`, `64K` (powers of 1024).
pub fn parse_bytes(text: &str) -> Result<u64> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: u64 = number
        .parse()
        .with_context(|| format!("{text:?} is not a byte count"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => bail!("unknown unit {other:?} in {text:?}"),
    };
    number
        .checked_mul(1u64 << shift)
        .with_context(|| format!("{text:?} is too large"))
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
        assert_eq!(c.device.as_deref(), Some("cpu"));
        assert_eq!(c.listen.as_deref(), Some("unix:/tmp/x.sock"));
        assert_eq!(c.memory, Some(1 << 30));
        assert_eq!(c.tenants, TenantPolicy::default());
        assert_eq!(parse("memory = 4096").unwrap().memory, Some(4096));
        assert_eq!(
            parse("policy = \"fair\"").unwrap().policy.as_deref(),
            Some("fair")
        );
        assert!(parse("policy = \"lottery\"").is_err());
        assert_eq!(
            parse("sharing = \"shared\"").unwrap().sharing.as_deref(),
            Some("shared")
        );
        assert!(parse("sharing = \"everything\"").is_err());
        assert_eq!(parse("launch_budget = 0").unwrap().launch_budget, Some(0));
        assert_eq!(
            parse("launch_budget = 1000000").unwrap().launch_budget,
            Some(1_000_000)
        );
        assert_eq!(parse("").unwrap().launch_budget, None);
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
        assert_eq!(t.tenants["batchjobs"], TenantSettings::default());
        assert!(parse("[tenants.x]\nweight = 0\n").is_err());
        assert!(parse("[tenants.x]\nclass = \"urgent\"\n").is_err());
        assert!(parse("[tenants.x]\nquota = 5\n").is_err());
    }
}
