//! JIT linking (`cuLink*`) for the CPU device, which runs PTX: every input is
//! reduced to PTX text (PTX as given; of a fat binary, the PTX the device's
//! compute capability runs) and the texts are merged into one module. A declaration `.extern` in one input and
//! defined in another is dropped, and defining inputs are placed before the
//! inputs that use them. A single input of any kind passes through untouched.

use std::collections::HashSet;

use crate::errors::*;

/// `CUjitInputType`.
pub const INPUT_CUBIN: u32 = 0;
pub const INPUT_PTX: u32 = 1;
pub const INPUT_FATBINARY: u32 = 2;

#[derive(Default)]
pub struct LinkState {
    pub inputs: Vec<(u32, Vec<u8>)>,
    /// The linked image, kept alive until `cuLinkDestroy`.
    pub output: Vec<u8>,
}

/// Input `bytes` of `kind` as PTX text; of a fat binary, the PTX a device of
/// compute capability `sm` runs.
fn as_ptx(kind: u32, bytes: &[u8], sm: u32) -> CuResult<String> {
    match kind {
        INPUT_PTX => {
            let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
            String::from_utf8(bytes[..end].to_vec()).map_err(|_| CUDA_ERROR_INVALID_PTX)
        }
        INPUT_FATBINARY => cumux_fatbin::ptx_for(bytes, sm).ok_or(CUDA_ERROR_NO_BINARY_FOR_GPU),
        _ => {
            tracing::warn!(
                "cuLink: input of type {kind} (cubin/object/library) cannot be linked for the CPU device"
            );
            Err(CUDA_ERROR_NOT_SUPPORTED)
        }
    }
}

/// The statements of a PTX text: `(statement, is an .extern declaration)`,
/// where a declaration may span several lines up to its `;`.
fn split(ptx: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut pending: Option<String> = None;
    for line in ptx.lines() {
        let t = line.trim_start();
        if let Some(p) = pending.as_mut() {
            p.push('\n');
            p.push_str(line);
            if t.trim_end().ends_with(';') {
                out.push((pending.take().unwrap_or_default(), true));
            }
            continue;
        }
        if t.starts_with(".version") || t.starts_with(".target") || t.starts_with(".address_size") {
            continue;
        }
        if t.starts_with(".extern") {
            if t.trim_end().ends_with(';') {
                out.push((line.to_string(), true));
            } else {
                pending = Some(line.to_string());
            }
            continue;
        }
        out.push((line.to_string(), false));
    }
    if let Some(p) = pending {
        out.push((p, true));
    }
    out
}

/// The name an `.extern` declaration declares.
fn declared_name(decl: &str) -> Option<String> {
    let text: String = decl.split_whitespace().collect::<Vec<_>>().join(" ");
    let body = text.strip_prefix(".extern ")?;
    if let Some(rest) = body.strip_prefix(".func ") {
        // Skip a return-value list "(...)".
        let rest = rest.trim_start();
        let rest = if rest.starts_with('(') {
            &rest[rest.find(')')? + 1..]
        } else {
            rest
        };
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
            .collect();
        return (!name.is_empty()).then_some(name);
    }
    // `.extern .global .align 4 .b8 name[16];`
    let before = body.trim_end_matches(';').trim_end();
    let before = before.split('[').next()?;
    before.split_whitespace().last().map(str::to_string)
}

/// Names of the functions and variables a PTX text defines.
fn defined_names(statements: &[(String, bool)]) -> HashSet<String> {
    let mut names = HashSet::new();
    for (s, is_decl) in statements {
        if *is_decl {
            continue;
        }
        let t = s.trim_start();
        let t = t
            .strip_prefix(".visible ")
            .or_else(|| t.strip_prefix(".weak "))
            .unwrap_or(t)
            .trim_start();
        if let Some(rest) = t.strip_prefix(".func").or_else(|| t.strip_prefix(".entry")) {
            let fake = format!(".extern .func {rest}");
            if let Some(n) = declared_name(&fake) {
                names.insert(n);
            }
        } else if t.starts_with(".global") || t.starts_with(".const") {
            let fake = format!(".extern {}", t.split('=').next().unwrap_or(t).trim_end());
            let fake = if fake.ends_with(';') {
                fake
            } else {
                format!("{fake};")
            };
            if let Some(n) = declared_name(&fake) {
                names.insert(n);
            }
        }
    }
    names
}

fn ptx_version(ptx: &str) -> (u32, u32) {
    ptx.lines()
        .find_map(|l| l.trim().strip_prefix(".version"))
        .and_then(|v| {
            let (a, b) = v.trim().split_once('.')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .unwrap_or((0, 0))
}

/// The index of the last line of the top-level item starting at `start`: a
/// prototype or variable ends at its `;`, a definition at its closing brace.
fn item_end(lines: &[(String, bool)], start: usize) -> usize {
    let mut depth = 0i32;
    let mut opened = false;
    for (at, (l, _)) in lines.iter().enumerate().skip(start) {
        depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
        opened |= l.contains('{');
        if (opened && depth <= 0) || (!opened && l.trim_end().ends_with(';')) {
            return at;
        }
    }
    lines.len().saturating_sub(1)
}

/// Merges PTX modules into one.
pub fn merge_ptx(modules: &[String]) -> String {
    let parsed: Vec<Vec<(String, bool)>> = modules.iter().map(|m| split(m)).collect();
    let defines: Vec<HashSet<String>> = parsed.iter().map(|p| defined_names(p)).collect();
    let all_defined: HashSet<&String> = defines.iter().flatten().collect();
    // Inputs that define what others use go first: order by how many of
    // their own external references another input satisfies.
    let mut order: Vec<usize> = (0..modules.len()).collect();
    let needs = |i: usize| {
        parsed[i]
            .iter()
            .filter(|(s, d)| *d && declared_name(s).is_some_and(|n| all_defined.contains(&n)))
            .count()
    };
    order.sort_by_key(|&i| needs(i));
    let (major, minor) = modules
        .iter()
        .map(|m| ptx_version(m))
        .max()
        .unwrap_or((7, 0));
    let target = modules
        .iter()
        .flat_map(|m| m.lines())
        .find(|l| l.trim_start().starts_with(".target"))
        .unwrap_or(".target sm_75")
        .trim()
        .to_string();
    let mut out = format!(".version {major}.{minor}\n{target}\n.address_size 64\n");
    // `.weak` definitions (template instances, inline functions) and their
    // prototypes appear in every unit that uses them: keep the first of each.
    let mut weak_seen = HashSet::new();
    for i in order {
        let statements = &parsed[i];
        let mut skip_until: Option<usize> = None;
        for (at, (s, is_decl)) in statements.iter().enumerate() {
            if skip_until.is_some_and(|end| at <= end) {
                continue;
            }
            if *is_decl && declared_name(s).is_some_and(|n| all_defined.contains(&n)) {
                continue;
            }
            if s.trim_start().starts_with(".weak") {
                let end = item_end(statements, at);
                let prototype = statements[at..=end].iter().all(|(l, _)| !l.contains('{'))
                    && s.contains(".func");
                let names = defined_names(&[(s.replacen(".weak", ".visible", 1), false)]);
                if let Some(name) = names.into_iter().next() {
                    let key = (name, prototype);
                    if !weak_seen.insert(key) {
                        skip_until = Some(end);
                        continue;
                    }
                }
            }
            out.push_str(s);
            out.push('\n');
        }
    }
    out
}

/// Links the inputs into one image (a PTX text with a trailing NUL, or the
/// single input as it was).
pub fn link(inputs: &[(u32, Vec<u8>)], sm: u32) -> CuResult<Vec<u8>> {
    match inputs {
        [] => Err(CUDA_ERROR_INVALID_VALUE),
        [(kind, bytes)] if *kind == INPUT_CUBIN || *kind == INPUT_FATBINARY => Ok(bytes.clone()),
        _ => {
            let texts = inputs
                .iter()
                .map(|(k, b)| as_ptx(*k, b, sm))
                .collect::<CuResult<Vec<_>>>()?;
            let mut merged = merge_ptx(&texts).into_bytes();
            merged.push(0);
            Ok(merged)
        }
    }
}

/// The bytes of a named section of an ELF file.
fn elf_section<'a>(elf: &'a [u8], wanted: &str) -> Option<&'a [u8]> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(elf.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?));
    if elf.get(..4)? != b"\x7fELF" || *elf.get(4)? != 2 {
        return None;
    }
    let shoff = u64_at(0x28)? as usize;
    let shentsize = u16_at(0x3a)? as usize;
    let shnum = u16_at(0x3c)? as usize;
    let shstrndx = u16_at(0x3e)? as usize;
    let header = |i: usize| shoff.checked_add(i.checked_mul(shentsize)?);
    let strtab = u64_at(header(shstrndx)? + 0x18)? as usize;
    for i in 0..shnum.min(1 << 16) {
        let h = header(i)?;
        let name_at = strtab.checked_add(u32_at(h)? as usize)?;
        let name = elf.get(name_at..)?.split(|b| *b == 0).next()?;
        if name == wanted.as_bytes() {
            let offset = u64_at(h + 0x18)? as usize;
            let size = u64_at(h + 0x20)? as usize;
            return elf.get(offset..offset.checked_add(size)?);
        }
    }
    None
}

/// PTX for a program built with `nvcc -rdc=true`: the image the runtime
/// loads holds only the device-linked cubin, but each translation unit's fat
/// binary, PTX included, stays in the executable's `__nv_relfatbin` section.
/// Their PTX merged is the program's device code for the CPU device.
pub fn relocatable_ptx_of_program() -> Option<String> {
    static PTX: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    PTX.get_or_init(|| {
        let exe = std::fs::read("/proc/self/exe").ok()?;
        let section = elf_section(&exe, "__nv_relfatbin")?;
        let mut texts = Vec::new();
        let mut at = 0;
        // Back-to-back fat binaries, each 8-byte aligned; bounded by the section.
        while at + 16 <= section.len() {
            let Ok(size) = cumux_fatbin::fatbin_size(&section[at..]) else {
                at += 8;
                continue;
            };
            let end = (at + size).min(section.len());
            if let Some(ptx) = cumux_fatbin::best_ptx(&section[at..end]) {
                texts.push(ptx);
            }
            at = end.next_multiple_of(8).max(at + 8);
        }
        tracing::debug!("{} relocatable PTX modules in the program", texts.len());
        (!texts.is_empty()).then(|| merge_ptx(&texts))
    })
    .clone()
}

/// The (is PTX, architecture) of every entry of a fat binary and of those
/// back to back after it, read from the entry headers alone (nothing is
/// decompressed); `None` for anything that is not a well-formed fat binary.
pub fn fatbin_entries(image: &[u8]) -> Option<Vec<(bool, u32)>> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(image.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(image.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(image.get(o..o + 8)?.try_into().ok()?));
    let mut out = Vec::new();
    let mut at = 0usize;
    // Each fat binary and each entry moves `at` forward by at least 16 bytes.
    while u32_at(at)? == 0xba55_ed50 {
        let header = u16_at(at + 6)? as usize;
        let end = at
            .checked_add(header)?
            .checked_add(u64_at(at + 8)? as usize)?;
        if end > image.len() || header < 16 {
            return None;
        }
        let mut entry = at + header;
        while entry + 64 <= end {
            let kind = u16_at(entry)?;
            let entry_header = u32_at(entry + 4)? as usize;
            let payload = u64_at(entry + 8)? as usize;
            if !(1..=2).contains(&kind) || entry_header < 64 {
                return None;
            }
            out.push((kind == 1, u32_at(entry + 28)?));
            entry = entry.checked_add(entry_header)?.checked_add(payload)?;
        }
        at = end.next_multiple_of(8);
        if at + 16 > image.len() {
            break;
        }
    }
    Some(out)
}

/// Whether a fat binary holds nothing a device of architecture `sm` (75 for
/// 7.5; `None` for the CPU device, which runs PTX only) can run: no PTX it
/// can JIT, no cubin of its major version and a minor version it reaches.
/// `false` whenever that cannot be told from the headers.
pub fn has_no_code_for(image: &[u8], sm: Option<u32>) -> bool {
    let Some(entries) = fatbin_entries(image) else {
        return false;
    };
    !entries.is_empty()
        && !entries.iter().any(|&(ptx, arch)| match sm {
            None => ptx,
            Some(dev) if ptx => arch <= dev,
            Some(dev) => arch / 10 == dev / 10 && arch % 10 <= dev % 10,
        })
}

/// An image for the CPU device: a fat binary without PTX from an `-rdc`
/// program is replaced by the program's merged relocatable PTX.
pub fn with_ptx(image: Vec<u8>) -> Vec<u8> {
    if cumux_fatbin::classify(&image) != cumux_fatbin::Classified::Fatbin {
        return image;
    }
    let has_ptx = cumux_fatbin::images(&image)
        .map(|imgs| imgs.iter().any(|i| i.kind == cumux_fatbin::ImageKind::Ptx))
        .unwrap_or(true);
    if has_ptx {
        return image;
    }
    match relocatable_ptx_of_program() {
        Some(ptx) => {
            tracing::debug!("fat binary without PTX: using the program's relocatable PTX");
            let mut bytes = ptx.into_bytes();
            bytes.push(0);
            bytes
        }
        None => image,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fat binary of the given (is PTX, sm) entries, each 16 bytes of payload.
    fn fatbin(entries: &[(bool, u32)]) -> Vec<u8> {
        let mut body = Vec::new();
        for &(ptx, sm) in entries {
            let mut e = vec![0u8; 64];
            e[0..2].copy_from_slice(&(if ptx { 1u16 } else { 2u16 }).to_le_bytes());
            e[4..8].copy_from_slice(&64u32.to_le_bytes());
            e[8..16].copy_from_slice(&16u64.to_le_bytes());
            e[28..32].copy_from_slice(&sm.to_le_bytes());
            body.extend(e);
            body.extend([0u8; 16]);
        }
        let mut f = Vec::new();
        f.extend(0xba55_ed50u32.to_le_bytes());
        f.extend(1u16.to_le_bytes());
        f.extend(16u16.to_le_bytes());
        f.extend((body.len() as u64).to_le_bytes());
        f.extend(body);
        f
    }

    #[test]
    fn code_for_a_device_is_told_from_the_headers() {
        let hopper_only = fatbin(&[(false, 90), (false, 100)]);
        assert_eq!(
            fatbin_entries(&hopper_only),
            Some(vec![(false, 90), (false, 100)])
        );
        assert!(!has_no_code_for(&hopper_only, Some(90)));
        assert!(has_no_code_for(&hopper_only, Some(80)));
        // sm_86 runs an sm_80 cubin, not the reverse.
        assert!(!has_no_code_for(&fatbin(&[(false, 80)]), Some(86)));
        assert!(has_no_code_for(&fatbin(&[(false, 86)]), Some(80)));
        // PTX is JIT-compiled for any newer device, and is all the CPU runs.
        let ptx = fatbin(&[(false, 75), (true, 75)]);
        assert!(!has_no_code_for(&ptx, Some(120)));
        assert!(!has_no_code_for(&ptx, None));
        assert!(has_no_code_for(&hopper_only, None));
        // Two fat binaries back to back are both read.
        let mut two = fatbin(&[(false, 100)]);
        two.extend(fatbin(&[(false, 90)]));
        assert!(!has_no_code_for(&two, Some(90)));
        // Anything malformed or not a fat binary: not known to lack code.
        assert!(!has_no_code_for(b".version 8.0", Some(90)));
        assert!(!has_no_code_for(&hopper_only[..40], Some(80)));
        assert!(!has_no_code_for(&fatbin(&[]), Some(80)));
    }

    #[test]
    fn header_scan_agrees_with_the_fatbin_reader() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fatbin/tests/fixtures");
        for name in ["zstd", "lz4", "multi", "uncompressed", "default"] {
            let bytes = std::fs::read(format!("{dir}/{name}.fatbin")).expect("fixture");
            let images = cumux_fatbin::images(&bytes).expect("parses");
            let want: Vec<(bool, u32)> = images
                .iter()
                .map(|i| (i.kind == cumux_fatbin::ImageKind::Ptx, i.sm))
                .collect();
            assert_eq!(fatbin_entries(&bytes), Some(want), "{name}");
        }
    }

    const USER: &str = ".version 9.0\n.target sm_75\n.address_size 64\n\
        .extern .func  (.param .b32 func_retval0) _Z6helperi\n(\n\t.param .b32 _Z6helperi_param_0\n)\n;\n\
        .extern .global .align 4 .b8 table[16];\n\
        .visible .entry _Z1kPi(\n\t.param .u64 _Z1kPi_param_0\n)\n{\n\tret;\n}\n";
    const DEFINER: &str = ".version 8.5\n.target sm_75\n.address_size 64\n\
        .visible .global .align 4 .b8 table[16];\n\
        .visible .func  (.param .b32 func_retval0) _Z6helperi(\n\t.param .b32 _Z6helperi_param_0\n)\n{\n\tret;\n}\n";

    #[test]
    fn names_of_declarations_and_definitions() {
        let s = split(USER);
        let decls: Vec<_> = s
            .iter()
            .filter(|(_, d)| *d)
            .filter_map(|(t, _)| declared_name(t))
            .collect();
        assert_eq!(decls, vec!["_Z6helperi".to_string(), "table".to_string()]);
        let defs = defined_names(&split(DEFINER));
        assert!(
            defs.contains("_Z6helperi") && defs.contains("table"),
            "{defs:?}"
        );
    }

    #[test]
    fn merged_module_defines_before_use_and_drops_satisfied_externs() {
        let merged = merge_ptx(&[USER.to_string(), DEFINER.to_string()]);
        assert!(merged.starts_with(".version 9.0\n.target sm_75\n.address_size 64\n"));
        assert_eq!(merged.matches(".version").count(), 1);
        assert!(!merged.contains(".extern"), "{merged}");
        let def = merged.find(".visible .func").unwrap();
        let entry = merged.find(".visible .entry").unwrap();
        assert!(def < entry, "{merged}");
    }

    #[test]
    fn weak_definitions_are_kept_once() {
        let weak = ".version 8.0\n.target sm_75\n.address_size 64\n\
            .weak .func _Z3twoi\n(\n\t.param .b32 x\n)\n;\n\
            .weak .func _Z3twoi(\n\t.param .b32 x\n)\n{\n\t{\n\tret;\n\t}\n}\n\
            .weak .global .align 4 .u32 shared_counter;\n";
        let a = format!("{weak}.visible .entry a()\n{{\n\tret;\n}}\n");
        let b = format!("{weak}.visible .entry b()\n{{\n\tret;\n}}\n");
        let merged = merge_ptx(&[a, b]);
        assert_eq!(merged.matches(".weak .func _Z3twoi").count(), 2, "{merged}");
        assert_eq!(merged.matches("ret;").count(), 3, "{merged}");
        assert_eq!(merged.matches("shared_counter").count(), 1, "{merged}");
        assert!(
            merged.contains(".entry a") && merged.contains(".entry b"),
            "{merged}"
        );
        assert_eq!(merged.matches('{').count(), merged.matches('}').count());
    }

    #[test]
    fn single_inputs_pass_through() {
        let fatbin = vec![1u8, 2, 3];
        assert_eq!(
            link(&[(INPUT_FATBINARY, fatbin.clone())], 75).unwrap(),
            fatbin
        );
        assert!(link(&[], 75).is_err());
        let ptx = link(&[(INPUT_PTX, DEFINER.as_bytes().to_vec())], 75).unwrap();
        assert_eq!(ptx.last(), Some(&0));
    }
}
