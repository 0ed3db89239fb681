//! `cumux install`: copies this `cumux`, its client driver (and NVML, where
//! built) into a prefix where `cumux run` finds them, with `libcuda.so.1`
//! links beside the driver; with `--system`, also an `ld.so.conf.d` entry so
//! that every program on the host loads cumux's driver without `cumux run`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::run::{find_driver, DRIVER_FILE, NVML_FILE};

/// What `cumux install` was asked for.
#[derive(Debug, Clone, clap::Args)]
pub struct InstallOptions {
    /// Where to install: `<prefix>/bin/cumux` and `<prefix>/lib/cumux/`.
    #[arg(long, default_value = "/usr/local")]
    pub prefix: PathBuf,
    /// Also make every program on the host use cumux's driver: an entry in
    /// the loader's folder (`--ld-conf-dir`), then `ldconfig`.
    #[arg(long)]
    pub system: bool,
    /// The loader's configuration folder, for `--system`.
    #[arg(long, default_value = "/etc/ld.so.conf.d")]
    pub ld_conf_dir: PathBuf,
}

/// Copies `from` to `to` (replacing it) with `mode`.
fn copy(from: &Path, to: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(folder) = to.parent() {
        std::fs::create_dir_all(folder)
            .with_context(|| format!("cannot make {}", folder.display()))?;
    }
    // A running copy cannot be written over; a fresh file can take its name.
    let fresh = to.with_extension("cumux-new");
    std::fs::copy(from, &fresh)
        .with_context(|| format!("cannot copy {} to {}", from.display(), fresh.display()))?;
    std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(mode))?;
    std::fs::rename(&fresh, to).with_context(|| format!("cannot install {}", to.display()))?;
    println!("installed {}", to.display());
    Ok(())
}

/// Points `link` at `target` (replacing whatever was there).
fn link(target: &str, link: &Path) -> Result<()> {
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("cannot link {}", link.display()))?;
    println!("linked {} -> {target}", link.display());
    Ok(())
}

pub fn install(options: InstallOptions) -> Result<()> {
    let exe = std::env::current_exe().context("cannot locate this cumux")?;
    let driver = find_driver().map_err(anyhow::Error::msg)?;
    let bin = options.prefix.join("bin");
    let lib = options.prefix.join("lib/cumux");
    copy(&exe, &bin.join("cumux"), 0o755)?;
    copy(&driver, &lib.join(DRIVER_FILE), 0o644)?;
    for name in ["libcuda.so.1", "libcuda.so"] {
        link(DRIVER_FILE, &lib.join(name))?;
    }
    let nvml = driver.with_file_name(NVML_FILE);
    if nvml.is_file() {
        copy(&nvml, &lib.join(NVML_FILE), 0o644)?;
        // Programs that find this folder (the loader's entry, a container's
        // LD_LIBRARY_PATH) get the tenant's NVML too.
        for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
            link(NVML_FILE, &lib.join(name))?;
        }
    }
    if options.system {
        let folder = &options.ld_conf_dir;
        std::fs::create_dir_all(folder)
            .with_context(|| format!("cannot make {}", folder.display()))?;
        let entry = folder.join("cumux.conf");
        let text = format!(
            "# cumux's client driver as every program's libcuda.so.1 (cumux install --system)\n{}\n",
            lib.display()
        );
        std::fs::write(&entry, text)
            .with_context(|| format!("cannot write {}", entry.display()))?;
        println!("wrote {}", entry.display());
        // The loader reads its folder through its cache: only the system's.
        if folder == Path::new("/etc/ld.so.conf.d") {
            let status = Command::new("ldconfig")
                .status()
                .context("cannot run ldconfig")?;
            if !status.success() {
                bail!("ldconfig failed: {status}");
            }
            println!(
                "ran ldconfig: programs now load {}",
                lib.join("libcuda.so.1").display()
            );
        }
    }
    Ok(())
}
