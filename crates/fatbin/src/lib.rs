//! Parser for NVIDIA fat binaries: the container nvcc embeds in every program,
//! holding cubins (ELF) and PTX for several architectures, optionally LZ4 or
//! Zstandard compressed. Pure and panic-free on any input.
//!
//! Layout (little-endian), as produced by nvcc 12/13:
//! - header, 16 bytes: magic `0xBA55ED50` u32, version u16 (1), header size
//!   u16, then u64 size of everything after the header.
//! - entries, back to back: kind u16 (1 = PTX, 2 = ELF) at +0, version u16
//!   at +2, entry header size u32 at +4, padded payload size u64 at +8,
//!   compressed payload size u32 at +16, code version (major << 16 | minor)
//!   u32 at +24, sm architecture u32 at +28, flags u64 at +40 (0x2000 LZ4,
//!   0x8000 Zstandard), decompressed size u64 at +56. The payload follows the
//!   entry header; the next entry starts after the padded payload.

use std::fmt;

/// Magic of a fat binary (`fatBinaryHeader.magic`).
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Magic of the `__fatBinC_Wrapper_t` nvcc hands `__cudaRegisterFatBinary`.
pub const FATBINC_WRAPPER_MAGIC: u32 = 0x4662_43B1;

const HEADER_BYTES: usize = 16;
const ENTRY_MIN_BYTES: usize = 64;
const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;
/// Largest decompressed image accepted; a larger claim is treated as corrupt.
const MAX_IMAGE_BYTES: u64 = 1 << 30;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FatbinError {
    /// Fewer bytes than the structure needs.
    Truncated {
        needed: usize,
        have: usize,
    },
    BadMagic(u32),
    /// An entry of a kind this parser does not know.
    UnknownKind(u16),
    /// A compressed entry that does not decompress to its stated size.
    Decompress(String),
    /// A size field that cannot be right (overflow, beyond the limit).
    BadSize(u64),
}

impl fmt::Display for FatbinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FatbinError::Truncated { needed, have } => {
                write!(f, "fat binary truncated: need {needed} bytes, have {have}")
            }
            FatbinError::BadMagic(m) => write!(f, "not a fat binary (magic {m:#x})"),
            FatbinError::UnknownKind(k) => write!(f, "unknown fat binary entry kind {k}"),
            FatbinError::Decompress(e) => write!(f, "cannot decompress fat binary entry: {e}"),
            FatbinError::BadSize(s) => write!(f, "implausible size {s} in fat binary"),
        }
    }
}

impl std::error::Error for FatbinError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    Ptx,
    Cubin,
}

/// One image of a fat binary, decompressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub kind: ImageKind,
    /// Architecture, e.g. 75 for sm_75 / compute_75.
    pub sm: u32,
    /// PTX version (for PTX) or ELF ABI version (for cubins), major << 16 | minor.
    pub version: u32,
    /// Decompressed bytes; PTX text carries no trailing NULs.
    pub data: Vec<u8>,
}

/// What a module image handed to the driver is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Classified {
    Fatbin,
    /// A `__fatBinC_Wrapper_t` (its pointer field refers to the fat binary).
    FatbinWrapper,
    Elf,
    Ptx,
    Unknown,
}

fn read_u16(b: &[u8], at: usize) -> Result<u16, FatbinError> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or(FatbinError::Truncated {
            needed: at + 2,
            have: b.len(),
        })
}

fn read_u32(b: &[u8], at: usize) -> Result<u32, FatbinError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or(FatbinError::Truncated {
            needed: at + 4,
            have: b.len(),
        })
}

fn read_u64(b: &[u8], at: usize) -> Result<u64, FatbinError> {
    let lo = read_u32(b, at)? as u64;
    let hi = read_u32(b, at + 4)? as u64;
    Ok(lo | (hi << 32))
}

/// Total size in bytes of the fat binary starting at `bytes_at` (header
/// included), read from its header. `bytes_at` needs only the 16 header bytes.
pub fn fatbin_size(bytes_at: &[u8]) -> Result<usize, FatbinError> {
    let magic = read_u32(bytes_at, 0)?;
    if magic != FATBIN_MAGIC {
        return Err(FatbinError::BadMagic(magic));
    }
    let header = read_u16(bytes_at, 6)? as u64;
    let body = read_u64(bytes_at, 8)?;
    // At least the header itself, so that reading fat binaries back to back
    // always moves on.
    let total = header
        .checked_add(body)
        .filter(|t| (HEADER_BYTES as u64..=MAX_IMAGE_BYTES).contains(t))
        .ok_or(FatbinError::BadSize(body))?;
    Ok(total as usize)
}

/// Says what an image passed to `cuModuleLoadData` and friends is.
pub fn classify(bytes: &[u8]) -> Classified {
    match read_u32(bytes, 0) {
        Ok(FATBIN_MAGIC) => Classified::Fatbin,
        Ok(FATBINC_WRAPPER_MAGIC) => Classified::FatbinWrapper,
        Ok(0x464c_457f) => Classified::Elf,
        _ => {
            let text = bytes
                .iter()
                .take(4096)
                .skip_while(|b| b.is_ascii_whitespace());
            let head: Vec<u8> = text.take(64).copied().collect();
            let head = String::from_utf8_lossy(&head);
            if head.starts_with("//") || head.starts_with(".version") || head.starts_with(".target")
            {
                Classified::Ptx
            } else {
                Classified::Unknown
            }
        }
    }
}

/// Every image in a fat binary, decompressed, in file order. Trailing bytes
/// after the fat binary are ignored; several fat binaries back to back (as
/// `nvcc -rdc` links them) are all read.
pub fn images(fatbin: &[u8]) -> Result<Vec<Image>, FatbinError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    loop {
        let size = fatbin_size(&fatbin[at..])?;
        let end = at
            .checked_add(size)
            .ok_or(FatbinError::BadSize(size as u64))?;
        if end > fatbin.len() {
            return Err(FatbinError::Truncated {
                needed: end,
                have: fatbin.len(),
            });
        }
        let header = read_u16(fatbin, at + 6)? as usize;
        parse_entries(&fatbin[at + header.min(size)..end], &mut out)?;
        at = end;
        // Another fat binary may follow, aligned to 8 bytes.
        let next = at.next_multiple_of(8);
        if next + HEADER_BYTES > fatbin.len() || read_u32(fatbin, next)? != FATBIN_MAGIC {
            break;
        }
        at = next;
    }
    Ok(out)
}

fn parse_entries(mut body: &[u8], out: &mut Vec<Image>) -> Result<(), FatbinError> {
    // Every entry consumes at least ENTRY_MIN_BYTES, so this loop is bounded.
    while body.len() >= ENTRY_MIN_BYTES {
        let kind = read_u16(body, 0)?;
        let header = read_u32(body, 4)? as usize;
        let padded = read_u64(body, 8)?;
        let compressed = read_u32(body, 16)? as u64;
        let version = read_u32(body, 24)?;
        let sm = read_u32(body, 28)?;
        let flags = read_u64(body, 40)?;
        let decompressed = read_u64(body, 56)?;
        if header < ENTRY_MIN_BYTES || padded > MAX_IMAGE_BYTES {
            return Err(FatbinError::BadSize(header as u64));
        }
        let end = header
            .checked_add(padded as usize)
            .filter(|e| *e <= body.len())
            .ok_or(FatbinError::Truncated {
                needed: header.saturating_add(padded as usize),
                have: body.len(),
            })?;
        let payload = &body[header..end];
        let kind = match kind {
            1 => ImageKind::Ptx,
            2 => ImageKind::Cubin,
            other => return Err(FatbinError::UnknownKind(other)),
        };
        let data = if flags & (FLAG_LZ4 | FLAG_ZSTD) != 0 {
            if compressed > padded || decompressed > MAX_IMAGE_BYTES {
                return Err(FatbinError::BadSize(decompressed));
            }
            let packed = &payload[..compressed as usize];
            if flags & FLAG_LZ4 != 0 {
                lz4_flex::block::decompress(packed, decompressed as usize)
                    .map_err(|e| FatbinError::Decompress(e.to_string()))?
            } else {
                zstd::bulk::decompress(packed, decompressed as usize)
                    .map_err(|e| FatbinError::Decompress(e.to_string()))?
            }
        } else {
            payload.to_vec()
        };
        let mut data = data;
        if kind == ImageKind::Ptx {
            while data.last() == Some(&0) {
                data.pop();
            }
        }
        out.push(Image {
            kind,
            sm,
            version,
            data,
        });
        body = &body[end..];
    }
    Ok(())
}

/// The PTX of the highest architecture in a fat binary, as text.
pub fn best_ptx(fatbin: &[u8]) -> Option<String> {
    images(fatbin)
        .ok()?
        .into_iter()
        .filter(|i| i.kind == ImageKind::Ptx)
        .max_by_key(|i| (i.sm, i.version))
        .and_then(|i| String::from_utf8(i.data).ok())
}

/// The PTX a device of compute capability `sm` (75 for 7.5) runs, as text:
/// the highest architecture at or below `sm`, as NVIDIA's driver picks it;
/// failing that, the lowest above it (its caller must then handle what that
/// PTX uses).
pub fn ptx_for(fatbin: &[u8], sm: u32) -> Option<String> {
    let ptx: Vec<Image> = images(fatbin)
        .ok()?
        .into_iter()
        .filter(|i| i.kind == ImageKind::Ptx)
        .collect();
    let fits = ptx
        .iter()
        .filter(|i| i.sm <= sm)
        .max_by_key(|i| (i.sm, i.version));
    let newer = || {
        ptx.iter()
            .filter(|i| i.sm > sm)
            .min_by_key(|i| (i.sm, i.version))
    };
    fits.or_else(newer)
        .and_then(|i| String::from_utf8(i.data.clone()).ok())
}

/// Size of an ELF image from its header (section headers come last in the
/// files nvcc writes), so a cubin passed by pointer alone can be copied.
pub fn elf_size(bytes_at: &[u8]) -> Result<usize, FatbinError> {
    if read_u32(bytes_at, 0)? != 0x464c_457f {
        return Err(FatbinError::BadMagic(read_u32(bytes_at, 0)?));
    }
    let shoff = read_u64(bytes_at, 0x28)?;
    let phoff = read_u64(bytes_at, 0x20)?;
    let phentsize = read_u16(bytes_at, 0x36)? as u64;
    let phnum = read_u16(bytes_at, 0x38)? as u64;
    let shentsize = read_u16(bytes_at, 0x3a)? as u64;
    let shnum = read_u16(bytes_at, 0x3c)? as u64;
    // Offsets near u64::MAX saturate, and are refused below like any other too large.
    let end = shoff
        .saturating_add(shentsize * shnum)
        .max(phoff.saturating_add(phentsize * phnum));
    if end > MAX_IMAGE_BYTES {
        return Err(FatbinError::BadSize(end));
    }
    Ok(end as usize)
}

/// Whether a module image can print: its code calls `vprintf` (device
/// `printf`). Looks inside fat binaries. Device `assert` (`__assertfail`) is
/// not counted: PyTorch builds it into most kernels, and a failed assert
/// reaches the program as `CUDA_ERROR_ASSERT` whatever is printed.
pub fn image_may_print(image: &[u8]) -> bool {
    image_mentions(image, b"vprintf")
}

/// Whether any code of `image` (each of a fat binary's, unpacked) names
/// `word`; an image of unknown layout is taken to.
pub fn image_mentions(image: &[u8], word: &[u8]) -> bool {
    let hit = |b: &[u8]| !word.is_empty() && b.windows(word.len()).any(|w| w == word);
    match classify(image) {
        Classified::Fatbin => match images(image) {
            Ok(images) => images.iter().any(|i| hit(&i.data)),
            // Unknown layout: assume it mentions it.
            Err(_) => true,
        },
        _ => hit(image),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(path).unwrap()
    }

    fn check_k(name: &str) {
        let bytes = fixture(name);
        assert_eq!(fatbin_size(&bytes).unwrap(), bytes.len(), "{name}");
        assert_eq!(classify(&bytes), Classified::Fatbin);
        let images = images(&bytes).unwrap();
        let ptx: Vec<_> = images.iter().filter(|i| i.kind == ImageKind::Ptx).collect();
        let cubins: Vec<_> = images
            .iter()
            .filter(|i| i.kind == ImageKind::Cubin)
            .collect();
        assert!(!ptx.is_empty(), "{name}: no PTX");
        for p in &ptx {
            let text = std::str::from_utf8(&p.data).unwrap();
            assert!(text.contains(".entry add"), "{name}");
            assert!(text.contains(".global .align 4 .b8 g_val[16]"), "{name}");
            assert_ne!(*p.data.last().unwrap(), 0);
            assert_eq!(classify(&p.data), Classified::Ptx);
        }
        for c in &cubins {
            assert_eq!(classify(&c.data), Classified::Elf);
            assert!(elf_size(&c.data).unwrap() <= c.data.len());
        }
        let best = best_ptx(&bytes).unwrap();
        assert!(best.contains(".entry scale"));
    }

    #[test]
    fn parses_every_compression_mode() {
        for name in [
            "default.fatbin",
            "lz4.fatbin",
            "zstd.fatbin",
            "uncompressed.fatbin",
            "multi.fatbin",
        ] {
            check_k(name);
        }
    }

    #[test]
    fn compressed_and_plain_agree() {
        let plain = images(&fixture("uncompressed.fatbin")).unwrap();
        for name in ["lz4.fatbin", "zstd.fatbin", "default.fatbin"] {
            let other = images(&fixture(name)).unwrap();
            assert_eq!(other.len(), plain.len());
            for (a, b) in plain.iter().zip(&other) {
                assert_eq!(a.kind, b.kind);
                assert_eq!(a.sm, b.sm);
                if a.kind == ImageKind::Ptx {
                    assert_eq!(a.data, b.data, "{name}");
                } else {
                    assert_eq!(&a.data[..b.data.len().min(a.data.len())], &b.data[..]);
                }
            }
        }
    }

    #[test]
    fn best_ptx_takes_the_highest_architecture() {
        let bytes = fixture("multi.fatbin");
        let images = images(&bytes).unwrap();
        let sms: Vec<u32> = images
            .iter()
            .filter(|i| i.kind == ImageKind::Ptx)
            .map(|i| i.sm)
            .collect();
        assert_eq!(sms, vec![75, 80]);
        assert!(best_ptx(&bytes).unwrap().contains(".target sm_80"));
        assert!(images
            .iter()
            .any(|i| i.kind == ImageKind::Cubin && i.sm == 86));
    }

    #[test]
    fn ptx_for_takes_the_highest_a_capability_runs_else_the_lowest_newer() {
        let bytes = fixture("multi.fatbin");
        assert!(ptx_for(&bytes, 75).unwrap().contains(".target sm_75"));
        assert!(ptx_for(&bytes, 79).unwrap().contains(".target sm_75"));
        assert!(ptx_for(&bytes, 90).unwrap().contains(".target sm_80"));
        assert!(ptx_for(&bytes, 70).unwrap().contains(".target sm_75"));
        assert!(ptx_for(b"not a fat binary", 75).is_none());
    }

    #[test]
    fn trailing_bytes_are_ignored_and_truncation_is_an_error() {
        let mut bytes = fixture("default.fatbin");
        let n = images(&bytes).unwrap().len();
        bytes.extend_from_slice(&[0u8; 40]);
        assert_eq!(images(&bytes).unwrap().len(), n);
        let short = &bytes[..bytes.len() - 100];
        assert!(images(short).is_err());
        assert!(images(&[]).is_err());
        assert_eq!(classify(b"garbage"), Classified::Unknown);
    }

    /// A header that claims fewer bytes than itself is an error, not a fat
    /// binary read again and again at the same place (found by cumux-fuzz).
    #[test]
    fn a_header_claiming_no_bytes_is_an_error() {
        let mut bytes = FATBIN_MAGIC.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[1, 0, 0, 0]);
        bytes.extend_from_slice(&0u64.to_le_bytes());
        bytes.extend_from_slice(&bytes.clone());
        assert_eq!(fatbin_size(&bytes), Err(FatbinError::BadSize(0)));
        assert_eq!(images(&bytes), Err(FatbinError::BadSize(0)));
    }

    /// Section or program header offsets near u64::MAX are an error, not an
    /// overflow (found by cumux-fuzz).
    #[test]
    fn header_offsets_near_the_top_are_an_error() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(&0x464c_457fu32.to_le_bytes());
        elf[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
        assert_eq!(elf_size(&elf), Err(FatbinError::BadSize(u64::MAX)));
        elf[0x28..0x30].copy_from_slice(&0u64.to_le_bytes());
        elf[0x20..0x28].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        assert_eq!(elf_size(&elf), Err(FatbinError::BadSize(u64::MAX)));
    }

    /// Deterministic mutations of real fat binaries: never a panic.
    #[test]
    fn mutations_never_panic() {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for name in [
            "default.fatbin",
            "lz4.fatbin",
            "zstd.fatbin",
            "multi.fatbin",
        ] {
            let original = fixture(name);
            for round in 0..1500 {
                let mut bytes = original.clone();
                let edits = 1 + (next() % 8) as usize;
                for _ in 0..edits {
                    let at = (next() % bytes.len() as u64) as usize;
                    // Headers are where the interesting fields live: favour them.
                    let at = if round % 2 == 0 { at % 160 } else { at };
                    bytes[at] = next() as u8;
                }
                if round % 7 == 0 {
                    let cut = (next() % bytes.len() as u64) as usize;
                    bytes.truncate(cut);
                }
                let _ = fatbin_size(&bytes);
                let _ = images(&bytes);
                let _ = best_ptx(&bytes);
                let _ = classify(&bytes);
                let _ = elf_size(&bytes);
            }
        }
    }
}
