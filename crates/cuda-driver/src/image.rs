//! Module images before they reach the driver: what kind each is, whether its
//! headers fit the bytes given (the driver trusts them), which code the driver
//! will run on a given GPU, and the kernel and variable names inside, read from
//! cubin symbol tables and PTX declarations (the driver cannot list variables).

use cumux_fatbin::{Classified, ImageKind as FatbinImageKind};

use crate::error::CudaError;
use crate::sys::{CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_PTX};

/// What a module image is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// A fat binary: cubins and PTX for several architectures.
    Fatbin,
    /// One ELF cubin.
    Cubin,
    /// PTX text.
    Ptx,
}

/// The code the driver runs for a module on a GPU of compute capability `sm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeChoice {
    /// A cubin built for `sm` (same major, minor at most the GPU's).
    Cubin { sm: u32 },
    /// PTX for `sm`, compiled by the driver's JIT for the GPU.
    PtxJit { sm: u32 },
    /// Nothing the GPU can run (`CUDA_ERROR_NO_BINARY_FOR_GPU`).
    Nothing,
}

impl std::fmt::Display for CodeChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CodeChoice::Cubin { sm } => write!(f, "cubin sm_{sm}"),
            CodeChoice::PtxJit { sm } => write!(f, "PTX compute_{sm} (JIT)"),
            CodeChoice::Nothing => write!(f, "no code for this GPU"),
        }
    }
}

fn invalid(detail: &str) -> CudaError {
    CudaError::new(
        CUDA_ERROR_INVALID_IMAGE,
        "CUDA_ERROR_INVALID_IMAGE",
        "cuModuleLoadData",
    )
    .with_detail(detail)
}

/// The image's kind, once its headers are known to lie within `image`: the
/// driver reads as far as they say, so a lying header must never reach it.
pub fn check_image(image: &[u8]) -> Result<ImageKind, CudaError> {
    match cumux_fatbin::classify(image) {
        Classified::Fatbin => {
            let size = cumux_fatbin::fatbin_size(image)
                .map_err(|e| invalid(&format!("malformed fat binary: {e}")))?;
            if size > image.len() {
                return Err(invalid(&format!(
                    "the fat binary claims {size} bytes but {} were sent",
                    image.len()
                )));
            }
            cumux_fatbin::images(&image[..size])
                .map_err(|e| invalid(&format!("malformed fat binary: {e}")))?;
            Ok(ImageKind::Fatbin)
        }
        Classified::Elf => {
            let size = elf_extent(image).ok_or_else(|| invalid("malformed ELF header"))?;
            if size > image.len() {
                return Err(invalid(&format!(
                    "the cubin's headers reach byte {size} but {} were sent",
                    image.len()
                )));
            }
            Ok(ImageKind::Cubin)
        }
        Classified::Ptx => {
            let end = image.iter().position(|b| *b == 0).unwrap_or(image.len());
            std::str::from_utf8(&image[..end]).map_err(|_| {
                CudaError::new(
                    CUDA_ERROR_INVALID_PTX,
                    "CUDA_ERROR_INVALID_PTX",
                    "cuModuleLoadData",
                )
                .with_detail("PTX text is not UTF-8")
            })?;
            Ok(ImageKind::Ptx)
        }
        Classified::FatbinWrapper => Err(invalid(
            "a fat binary wrapper, not the fat binary it points to",
        )),
        Classified::Unknown => Err(invalid("neither a fat binary, a cubin nor PTX text")),
    }
}

/// The image as the driver gets it: 8-byte aligned, PTX NUL-terminated.
pub fn driver_copy(image: &[u8], kind: ImageKind) -> Vec<u64> {
    let bytes: &[u8] = match kind {
        ImageKind::Ptx => {
            let end = image.iter().position(|b| *b == 0).unwrap_or(image.len());
            &image[..end]
        }
        ImageKind::Fatbin | ImageKind::Cubin => image,
    };
    // One spare byte at least, so PTX ends in NUL; zero padding is harmless.
    let mut words = vec![0u64; bytes.len() / 8 + 1];
    for (i, chunk) in bytes.chunks(8).enumerate() {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        words[i] = u64::from_le_bytes(word);
    }
    words
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// Bytes an ELF64 image's headers span (section and program header tables),
/// or `None` when the header is not ELF64 little-endian or the sums overflow.
pub fn elf_extent(elf: &[u8]) -> Option<usize> {
    if elf.get(..4)? != b"\x7fELF" || *elf.get(4)? != 2 || *elf.get(5)? != 1 {
        return None;
    }
    let table_end = |off: u64, entsize: u16, num: u16| -> Option<u64> {
        off.checked_add(u64::from(entsize).checked_mul(u64::from(num))?)
    };
    let sections = table_end(u64_at(elf, 0x28)?, u16_at(elf, 0x3a)?, u16_at(elf, 0x3c)?)?;
    let programs = table_end(u64_at(elf, 0x20)?, u16_at(elf, 0x36)?, u16_at(elf, 0x38)?)?;
    usize::try_from(sections.max(programs).max(64)).ok()
}

/// What an ELF symbol names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymbolKind {
    Function,
    Object,
}

/// A defined function or object symbol of a cubin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfSymbol {
    pub name: String,
    pub kind: SymbolKind,
    pub size: u64,
}

/// Upper bound on the symbols read from one cubin.
const MAX_SYMBOLS: usize = 1 << 20;

/// The defined function and object symbols of an ELF64 cubin's symbol tables;
/// empty or partial (never a panic) on malformed input.
pub fn elf_symbols(elf: &[u8]) -> Vec<ElfSymbol> {
    let mut out = Vec::new();
    let _ = read_elf_symbols(elf, &mut out);
    out
}

fn read_elf_symbols(elf: &[u8], out: &mut Vec<ElfSymbol>) -> Option<()> {
    elf_extent(elf)?;
    let shoff = usize::try_from(u64_at(elf, 0x28)?).ok()?;
    let shentsize = usize::from(u16_at(elf, 0x3a)?);
    let shnum = usize::from(u16_at(elf, 0x3c)?);
    if shentsize < 64 {
        return None;
    }
    let section = |i: usize| -> Option<usize> { shoff.checked_add(i.checked_mul(shentsize)?) };
    let body = |sh: usize| -> Option<&[u8]> {
        let off = usize::try_from(u64_at(elf, sh + 24)?).ok()?;
        let size = usize::try_from(u64_at(elf, sh + 32)?).ok()?;
        elf.get(off..off.checked_add(size)?)
    };
    for i in 0..shnum {
        let sh = section(i)?;
        const SHT_SYMTAB: u32 = 2;
        if u32_at(elf, sh + 4)? != SHT_SYMTAB {
            continue;
        }
        let symbols = body(sh)?;
        let strings_index = usize::try_from(u32_at(elf, sh + 40)?).ok()?;
        let strings = body(section(strings_index)?)?;
        for sym in symbols.chunks_exact(24) {
            if out.len() >= MAX_SYMBOLS {
                return Some(());
            }
            let kind = match sym[4] & 0xf {
                1 => SymbolKind::Object,
                2 => SymbolKind::Function,
                _ => continue,
            };
            let defined = u16_at(sym, 6)? != 0;
            let name_at = usize::try_from(u32_at(sym, 0)?).ok()?;
            let name = strings.get(name_at..).and_then(|s| {
                let end = s.iter().position(|b| *b == 0)?;
                std::str::from_utf8(&s[..end]).ok()
            });
            match name {
                Some(name) if defined && !name.is_empty() => out.push(ElfSymbol {
                    name: name.to_string(),
                    kind,
                    size: u64_at(sym, 16)?,
                }),
                _ => {}
            }
        }
    }
    Some(())
}

/// Names a PTX module declares at module scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PtxNames {
    /// `.entry` kernels.
    pub entries: Vec<String>,
    /// `.global` and `.const` variables (not `.extern` ones).
    pub variables: Vec<String>,
}

/// The kernels and module-scope variables a PTX text declares.
pub fn ptx_names(ptx: &str) -> PtxNames {
    let mut names = PtxNames::default();
    let mut depth = 0usize;
    for raw in ptx.lines() {
        let line = raw.split("//").next().unwrap_or("").trim();
        if depth == 0 {
            let mut tokens = line
                .split(|c: char| c.is_whitespace() || c == '(')
                .filter(|t| !t.is_empty())
                .peekable();
            let mut is_extern = false;
            while let Some(t) = tokens.peek() {
                match *t {
                    ".visible" | ".weak" | ".common" => {}
                    ".extern" => is_extern = true,
                    _ => break,
                }
                tokens.next();
            }
            match tokens.next() {
                Some(".entry") => {
                    if let Some(name) = tokens.next() {
                        names.entries.push(name.trim_end_matches(',').to_string());
                    }
                }
                Some(".global") | Some(".const") if !is_extern => {
                    // `.global .align 4 .b8 name[16] = {…};`: the name is the
                    // first token that is not a directive.
                    let mut name = None;
                    while let Some(t) = tokens.next() {
                        if t == ".align" {
                            tokens.next();
                        } else if !t.starts_with('.') {
                            name = Some(t);
                            break;
                        }
                    }
                    if let Some(name) = name {
                        let end = name.find(['[', ';', '=', '<']).unwrap_or(name.len());
                        if end > 0 {
                            names.variables.push(name[..end].to_string());
                        }
                    }
                }
                _ => {}
            }
        }
        for c in line.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
    names
}

/// Candidate names of kernels and variables in an image, deduplicated, in
/// order of appearance. A candidate is confirmed by asking the driver for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageNames {
    pub kernels: Vec<String>,
    pub variables: Vec<String>,
}

fn push_unique(list: &mut Vec<String>, name: &str) {
    if !list.iter().any(|n| n == name) {
        list.push(name.to_string());
    }
}

/// The candidate names inside a fat binary, cubin or PTX image.
pub fn image_names(image: &[u8]) -> ImageNames {
    let mut names = ImageNames::default();
    let add_cubin = |names: &mut ImageNames, elf: &[u8]| {
        for s in elf_symbols(elf) {
            // `$str…` and section-like names are the compiler's, not the user's.
            if s.name.starts_with('$') || s.name.starts_with('.') {
                continue;
            }
            match s.kind {
                SymbolKind::Function => push_unique(&mut names.kernels, &s.name),
                SymbolKind::Object => push_unique(&mut names.variables, &s.name),
            }
        }
    };
    let add_ptx = |names: &mut ImageNames, ptx: &[u8]| {
        let end = ptx.iter().position(|b| *b == 0).unwrap_or(ptx.len());
        if let Ok(text) = std::str::from_utf8(&ptx[..end]) {
            let found = ptx_names(text);
            for k in &found.entries {
                push_unique(&mut names.kernels, k);
            }
            for v in found.variables.iter().filter(|v| !v.starts_with('$')) {
                push_unique(&mut names.variables, v);
            }
        }
    };
    match cumux_fatbin::classify(image) {
        Classified::Fatbin => {
            for img in cumux_fatbin::images(image).unwrap_or_default() {
                match img.kind {
                    FatbinImageKind::Cubin => add_cubin(&mut names, &img.data),
                    FatbinImageKind::Ptx => add_ptx(&mut names, &img.data),
                }
            }
        }
        Classified::Elf => add_cubin(&mut names, image),
        Classified::Ptx => add_ptx(&mut names, image),
        Classified::FatbinWrapper | Classified::Unknown => {}
    }
    names
}

/// The code the driver picks from `image` on a GPU of compute capability `sm`
/// (major × 10 + minor): the newest compatible cubin, else the newest PTX not
/// above the GPU, JIT-compiled.
pub fn code_choice(image: &[u8], sm: u32) -> CodeChoice {
    let entries: Vec<(FatbinImageKind, u32)> = match cumux_fatbin::classify(image) {
        Classified::Fatbin => cumux_fatbin::images(image)
            .unwrap_or_default()
            .iter()
            .map(|i| (i.kind, i.sm))
            .collect(),
        Classified::Elf => return cubin_choice(image, sm),
        Classified::Ptx => {
            return CodeChoice::PtxJit {
                sm: ptx_target(image).unwrap_or(0),
            }
        }
        _ => Vec::new(),
    };
    choose(&entries, sm)
}

/// The pure rule behind [`code_choice`], over (kind, sm) pairs.
pub fn choose(entries: &[(FatbinImageKind, u32)], sm: u32) -> CodeChoice {
    let cubin = entries
        .iter()
        .filter(|(k, s)| *k == FatbinImageKind::Cubin && s / 10 == sm / 10 && *s <= sm)
        .map(|(_, s)| *s)
        .max();
    if let Some(sm) = cubin {
        return CodeChoice::Cubin { sm };
    }
    entries
        .iter()
        .filter(|(k, s)| *k == FatbinImageKind::Ptx && *s <= sm)
        .map(|(_, s)| *s)
        .max()
        .map_or(CodeChoice::Nothing, |sm| CodeChoice::PtxJit { sm })
}

/// A lone cubin's architecture from its ELF `e_flags`: bits 8..16 in cubins of
/// ELF ABI version 8 and later (CUDA 13), the low byte before.
fn cubin_choice(elf: &[u8], sm: u32) -> CodeChoice {
    let (Some(abi), Some(flags)) = (elf.get(8), u32_at(elf, 0x30)) else {
        return CodeChoice::Nothing;
    };
    let arch = if *abi >= 8 {
        (flags >> 8) & 0xff
    } else {
        flags & 0xff
    };
    if arch == 0 {
        return CodeChoice::Nothing;
    }
    choose(&[(FatbinImageKind::Cubin, arch)], sm)
}

/// `.target sm_XX` of a PTX text.
fn ptx_target(ptx: &[u8]) -> Option<u32> {
    let end = ptx.iter().position(|b| *b == 0).unwrap_or(ptx.len());
    let text = std::str::from_utf8(&ptx[..end]).ok()?;
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(".target"))?;
    let target = line.split_whitespace().nth(1)?;
    let digits: String = target
        .trim_start_matches("sm_")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Byte offset and size of each kernel parameter, asked index by index until
/// the driver says the index is past the last one (`query` returns `None`).
/// At most `MAX_PARAMS` parameters (the launch buffer holds 32 764 bytes).
pub fn param_layout(
    mut query: impl FnMut(usize) -> Result<Option<(usize, usize)>, CudaError>,
) -> Result<Vec<(u32, u32)>, CudaError> {
    const MAX_PARAMS: usize = 32 * 1024;
    let mut params = Vec::new();
    for index in 0..MAX_PARAMS {
        let Some((offset, size)) = query(index)? else {
            return Ok(params);
        };
        let (Ok(offset), Ok(size)) = (u32::try_from(offset), u32::try_from(size)) else {
            return Err(CudaError::new(
                crate::sys::CUDA_ERROR_INVALID_VALUE,
                "CUDA_ERROR_INVALID_VALUE",
                "cuFuncGetParamInfo",
            )
            .with_detail("an implausible parameter layout"));
        };
        params.push((offset, size));
    }
    Ok(params)
}

/// Bytes a packed parameter buffer must hold for `layout`.
pub fn params_bytes(layout: &[(u32, u32)]) -> usize {
    layout
        .iter()
        .map(|(o, s)| *o as usize + *s as usize)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../fatbin/tests/fixtures/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(path).unwrap()
    }

    #[test]
    fn fat_binaries_pass_the_header_check_and_truncated_ones_fail() {
        for name in [
            "default.fatbin",
            "lz4.fatbin",
            "zstd.fatbin",
            "multi.fatbin",
        ] {
            let image = fixture(name);
            assert_eq!(check_image(&image), Ok(ImageKind::Fatbin), "{name}");
            let cut = check_image(&image[..image.len() - 1]).unwrap_err();
            assert_eq!(cut.code, CUDA_ERROR_INVALID_IMAGE, "{name}");
        }
        assert_eq!(
            check_image(b"garbage!").unwrap_err().code,
            CUDA_ERROR_INVALID_IMAGE
        );
        assert_eq!(check_image(b"").unwrap_err().code, CUDA_ERROR_INVALID_IMAGE);
    }

    #[test]
    fn cubins_are_checked_against_their_headers() {
        let images = cumux_fatbin::images(&fixture("default.fatbin")).unwrap();
        let cubin = images
            .iter()
            .find(|i| i.kind == FatbinImageKind::Cubin)
            .unwrap();
        assert_eq!(check_image(&cubin.data), Ok(ImageKind::Cubin));
        let cut = &cubin.data[..cubin.data.len() / 2];
        assert_eq!(check_image(cut).unwrap_err().code, CUDA_ERROR_INVALID_IMAGE);
        // A header whose tables would end past u64::MAX is refused, not a panic.
        let mut lying = cubin.data.clone();
        lying[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            check_image(&lying).unwrap_err().code,
            CUDA_ERROR_INVALID_IMAGE
        );
        assert_eq!(code_choice(&cubin.data, 75), CodeChoice::Cubin { sm: 75 });
        assert_eq!(code_choice(&cubin.data, 90), CodeChoice::Nothing);
    }

    #[test]
    fn names_come_from_cubin_symbols_and_ptx() {
        for name in ["default.fatbin", "multi.fatbin", "uncompressed.fatbin"] {
            let names = image_names(&fixture(name));
            for k in ["add", "scale"] {
                assert!(names.kernels.iter().any(|n| n == k), "{name}: {names:?}");
            }
            assert!(
                names.variables.iter().any(|n| n == "g_val"),
                "{name}: {names:?}"
            );
            assert!(names.variables.iter().all(|n| !n.starts_with('$')));
        }
        let images = cumux_fatbin::images(&fixture("default.fatbin")).unwrap();
        let cubin = images
            .iter()
            .find(|i| i.kind == FatbinImageKind::Cubin)
            .unwrap();
        let symbols = elf_symbols(&cubin.data);
        let g = symbols.iter().find(|s| s.name == "g_val").unwrap();
        assert_eq!((g.kind, g.size), (SymbolKind::Object, 16));
        let add = symbols.iter().find(|s| s.name == "add").unwrap();
        assert_eq!(add.kind, SymbolKind::Function);
    }

    #[test]
    fn ptx_declarations_are_read() {
        let ptx = "\
.version 9.0
.target sm_75
.address_size 64
.extern .func (.param .b32 func_retval0) vprintf
.extern .global .align 4 .b8 elsewhere[4];
.global .align 4 .b8 g_val[16];
.visible .const .align 4 .f32 table[8] = {1.0};
.visible .global .align 8 .u64 counter;
.global .align 1 .b8 $str[6] = {104, 105, 0};
.visible .entry kernel_one(
\t.param .u64 p0
)
{
\t.local .align 4 .b8 inner[4];
\tret;
}
.entry kernel_two()
{
\tret;
}
";
        let names = ptx_names(ptx);
        assert_eq!(names.entries, ["kernel_one", "kernel_two"]);
        assert_eq!(names.variables, ["g_val", "table", "counter", "$str"]);
        assert_eq!(
            code_choice(ptx.as_bytes(), 90),
            CodeChoice::PtxJit { sm: 75 }
        );
        assert_eq!(check_image(ptx.as_bytes()), Ok(ImageKind::Ptx));
    }

    #[test]
    fn the_driver_picks_a_matching_cubin_else_ptx() {
        use FatbinImageKind::{Cubin, Ptx};
        let default = [(Cubin, 75), (Ptx, 75)];
        assert_eq!(choose(&default, 75), CodeChoice::Cubin { sm: 75 });
        assert_eq!(choose(&default, 86), CodeChoice::PtxJit { sm: 75 });
        assert_eq!(choose(&default, 90), CodeChoice::PtxJit { sm: 75 });
        assert_eq!(choose(&default, 70), CodeChoice::Nothing);
        let multi = [(Ptx, 75), (Ptx, 80), (Cubin, 86)];
        assert_eq!(choose(&multi, 89), CodeChoice::Cubin { sm: 86 });
        assert_eq!(choose(&multi, 90), CodeChoice::PtxJit { sm: 80 });
        assert_eq!(choose(&multi, 80), CodeChoice::PtxJit { sm: 80 });
        assert_eq!(
            code_choice(&fixture("multi.fatbin"), 86),
            CodeChoice::Cubin { sm: 86 }
        );
        assert_eq!(
            code_choice(&fixture("default.fatbin"), 90),
            CodeChoice::PtxJit { sm: 75 }
        );
    }

    #[test]
    fn images_reach_the_driver_aligned_and_ptx_nul_terminated() {
        let words = driver_copy(b"abcdefgh", ImageKind::Ptx);
        assert_eq!(words.len(), 2);
        assert_eq!(words[1], 0);
        let words = driver_copy(b"ptx\0\0junk", ImageKind::Ptx);
        assert_eq!(words, [u64::from_le_bytes(*b"ptx\0\0\0\0\0")]);
        let fatbin = fixture("default.fatbin");
        let words = driver_copy(&fatbin, ImageKind::Fatbin);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(&bytes[..fatbin.len()], &fatbin[..]);
    }

    #[test]
    fn parameter_layouts_stop_at_the_first_invalid_index() {
        let params = [(0usize, 8usize), (8, 4), (16, 8)];
        let layout = param_layout(|i| Ok(params.get(i).copied())).unwrap();
        assert_eq!(layout, [(0, 8), (8, 4), (16, 8)]);
        assert_eq!(params_bytes(&layout), 24);
        assert_eq!(param_layout(|_| Ok(None)).unwrap(), []);
        assert_eq!(params_bytes(&[]), 0);
        let failing = param_layout(|_| Err(CudaError::new(700, "x", "cuFuncGetParamInfo")));
        assert_eq!(failing.unwrap_err().code, 700);
        let huge = param_layout(|i| Ok((i == 0).then_some((usize::MAX, 4))));
        assert_eq!(huge.unwrap_err().code, crate::sys::CUDA_ERROR_INVALID_VALUE);
        // A driver that never says stop is cut off.
        assert_eq!(
            param_layout(|i| Ok(Some((i * 4, 4)))).unwrap().len(),
            32 * 1024
        );
    }

    #[test]
    fn malformed_elf_yields_no_symbols_and_no_panic() {
        assert!(elf_symbols(b"").is_empty());
        assert!(elf_symbols(b"\x7fELF\x02\x01\x01").is_empty());
        let images = cumux_fatbin::images(&fixture("default.fatbin")).unwrap();
        let cubin = images
            .iter()
            .find(|i| i.kind == FatbinImageKind::Cubin)
            .unwrap();
        for cut in (0..cubin.data.len()).step_by(97) {
            let _ = elf_symbols(&cubin.data[..cut]);
            let mut flipped = cubin.data.clone();
            flipped[cut] ^= 0xff;
            let _ = elf_symbols(&flipped);
            let _ = image_names(&flipped);
        }
    }
}
