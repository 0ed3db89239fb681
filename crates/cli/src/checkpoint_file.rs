//! The checkpoint file on the admin's side (`cumux checkpoint`, `cumux
//! restore`, `cumux serve --restore`): written under a name beside its own and
//! renamed once complete, and its preamble looked at before a server hears of it.
//! The stream inside is the server's (`cumux_server::session::image_stream`).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use cumux_server::session::image_stream::{self, FORMAT, MAGIC};

/// A checkpoint being written: a file beside its name, renamed to it by
/// [`Partial::commit`]; dropped before that, it is removed.
pub struct Partial {
    pub file: File,
    path: PathBuf,
    partial: PathBuf,
    committed: bool,
}

impl Partial {
    /// An empty file beside `path` (`NAME.partial`, in the same folder, so
    /// the rename is atomic), for the checkpoint that will take `path`.
    pub fn create(path: &Path) -> Result<Partial> {
        let mut name = path
            .file_name()
            .with_context(|| format!("{} names no file", path.display()))?
            .to_os_string();
        name.push(".partial");
        let partial = path.with_file_name(name);
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&partial)
            .with_context(|| format!("cannot create {}", partial.display()))?;
        Ok(Partial {
            file,
            path: path.to_path_buf(),
            partial,
            committed: false,
        })
    }

    /// The checkpoint on disk under its name: synced, then renamed.
    pub fn commit(mut self) -> Result<u64> {
        self.file
            .sync_all()
            .with_context(|| format!("cannot write {}", self.partial.display()))?;
        let size = self.file.metadata()?.len();
        std::fs::rename(&self.partial, &self.path).with_context(|| {
            format!(
                "cannot rename {} to {}",
                self.partial.display(),
                self.path.display()
            )
        })?;
        self.committed = true;
        Ok(size)
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

/// The checkpoint at `path`, opened at its start once its preamble says it
/// is one of this cumux's format; the rest (its checksums) the server
/// checks as it reads.
pub fn open(path: &Path) -> Result<File> {
    let mut file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut preamble = [0u8; 12];
    let got = file
        .read(&mut preamble)
        .with_context(|| format!("cannot read {}", path.display()))?;
    refused_by_preamble(&preamble[..got])
        .with_context(|| format!("{} is refused", path.display()))?;
    file.seek(SeekFrom::Start(0))?;
    Ok(file)
}

fn refused_by_preamble(preamble: &[u8]) -> Result<()> {
    if preamble.len() < MAGIC.len() || &preamble[..MAGIC.len()] != MAGIC {
        bail!("it is not a cumux checkpoint (no CUMUXCKP header)");
    }
    if preamble.len() < 12 {
        bail!("it is truncated: {} bytes", preamble.len());
    }
    let format = u32::from_le_bytes(preamble[8..12].try_into().unwrap_or_default());
    if format != FORMAT {
        bail!("it is a checkpoint of format {format}; this cumux reads format {FORMAT}");
    }
    Ok(())
}

/// The whole checkpoint at `path`, once every checksum in it is checked
/// (`cumux serve --restore` parks it so).
pub fn read(path: &Path) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open(path)?
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    image_stream::verified(&bytes[..])
        .map_err(|e| anyhow::anyhow!("{}", e.detail))
        .with_context(|| format!("{} is refused", path.display()))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_file_goes_unless_committed_and_foreign_or_older_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("cumux-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.ckpt");
        let partial = dir.join("s.ckpt.partial");
        drop(Partial::create(&path).unwrap());
        assert!(!partial.exists() && !path.exists());
        let mut p = Partial::create(&path).unwrap();
        std::io::Write::write_all(&mut p.file, b"CUMUXCKP\x03\0\0\0rest").unwrap();
        assert_eq!(p.commit().unwrap(), 16);
        assert!(!partial.exists());
        assert!(open(&path).is_ok());
        let why = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            format!("{:#}", open(&path).unwrap_err())
        };
        assert!(why(b"\x7fELF and so on").contains("not a cumux checkpoint"));
        assert!(why(b"CUMUXCKP\x02\0\0\0").contains("format 2; this cumux reads format 3"));
        assert!(why(b"CUMUXCKP\x03").contains("truncated"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
