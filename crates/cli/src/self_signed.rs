//! The self-signed certificate a TCP listener shows when the config gives
//! none: made once in the state folder (key readable by its owner only), reused.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// `$XDG_STATE_HOME/cumux`, else `~/.local/state/cumux`.
pub fn state_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("cumux"));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .context("neither XDG_STATE_HOME nor HOME is set: give --tls-cert and --tls-key")?;
    Ok(PathBuf::from(home).join(".local/state/cumux"))
}

/// The certificate and key files in `dir`, made now (naming `hosts`) if
/// they are not there yet.
pub fn ensure(dir: &Path, hosts: &[String]) -> Result<(PathBuf, PathBuf)> {
    let cert = dir.join("server-cert.pem");
    let key = dir.join("server-key.pem");
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot make {}", dir.display()))?;
    let made = rcgen::generate_simple_self_signed(hosts.to_vec())
        .context("cannot make a self-signed certificate")?;
    write_new(&key, made.signing_key.serialize_pem().as_bytes(), 0o600)?;
    write_new(&cert, made.cert.pem().as_bytes(), 0o644)?;
    tracing::info!(
        "made a self-signed TLS certificate for {} in {}",
        hosts.join(", "),
        dir.display()
    );
    Ok((cert, key))
}

/// Writes a file that must not exist yet, with `mode`.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(bytes)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The names a self-signed certificate for `host_port` gives: its host (if
/// it names one), this machine's name, and localhost.
pub fn names_for(host_port: &str) -> Vec<String> {
    let host = host_port
        .rsplit_once(':')
        .map_or(host_port, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let mut names = vec![];
    let unspecified = host
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified());
    if !host.is_empty() && !unspecified {
        names.push(host);
    }
    if let Some(name) = hostname() {
        names.push(name);
    }
    names.push("localhost".into());
    names.dedup();
    names
}

fn hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_made_once_and_its_key_kept_private() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = ensure(dir.path(), &["localhost".into()]).unwrap();
        let first = std::fs::read(&cert).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "key mode {mode:o}");
        let again = ensure(dir.path(), &["localhost".into()]).unwrap();
        assert_eq!(again, (cert.clone(), key));
        assert_eq!(std::fs::read(&cert).unwrap(), first);
        cumux_server::tls::ServerTls::load(&again.0, &again.1, None).unwrap();
    }

    #[test]
    fn names_skip_an_unspecified_host() {
        let names = names_for("0.0.0.0:7000");
        assert!(!names.contains(&"0.0.0.0".to_string()));
        assert!(names.contains(&"localhost".to_string()));
        assert_eq!(names_for("10.1.2.3:7000")[0], "10.1.2.3");
    }
}
