//! `cumux serve --config FILE`: a small TOML-like file of `key = value` lines
//! (`device`, `listen`, `memory`), overridden by command-line flags, and the
//! byte-size syntax (`512M`, `16GiB`) shared with `--memory`.

use anyhow::{bail, Context, Result};

/// Settings a config file may give.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FileConfig {
    pub device: Option<String>,
    pub listen: Option<String>,
    pub memory: Option<u64>,
}

/// Reads a config file. Unknown keys are errors, so typos do not pass silently.
pub fn read(path: &std::path::Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    parse(&text).with_context(|| format!("in config {}", path.display()))
}

pub fn parse(text: &str) -> Result<FileConfig> {
    let mut config = FileConfig::default();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with('[') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            bail!("line {}: expected key = value", n + 1);
        };
        let value = value.trim().trim_matches('"').to_string();
        match key.trim() {
            "device" => config.device = Some(value),
            "listen" => config.listen = Some(value),
            "memory" => config.memory = Some(parse_bytes(&value)?),
            other => bail!("line {}: unknown setting {other:?}", n + 1),
        }
    }
    Ok(config)
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
        let c = parse("# cumux\ndevice = \"cpu\"\nlisten = \"unix:/tmp/x.sock\"\nmemory = 1G\n")
            .unwrap();
        assert_eq!(c.device.as_deref(), Some("cpu"));
        assert_eq!(c.listen.as_deref(), Some("unix:/tmp/x.sock"));
        assert_eq!(c.memory, Some(1 << 30));
        assert!(parse("colour = blue").is_err());
    }
}
