//! Writes the forwarding entry points of cumux's NVML: one for each of
//! NVIDIA's entry points (`nvidia_exports.txt`) that `src/` does not define.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

/// The `nvml…` functions `src/` defines with `extern "C" fn`.
fn defined_here(src: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(src).expect("src/ is readable") {
        let path = entry.expect("src/ entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a readable source");
        for line in text.lines() {
            let Some(rest) = line.split("extern \"C\" fn ").nth(1) else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.starts_with("nvml") {
                names.insert(name);
            }
        }
    }
    names
}

/// One entry point that jumps to slot `slot` of `FORWARD`, or to `absent`
/// while the slot is empty; every register the caller set is left as it was.
fn trampoline(out: &mut String, name: &str, slot: usize) {
    let offset = slot * 8;
    writeln!(
        out,
        r#"#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn {name}() {{
    #[cfg(target_arch = "x86_64")]
    core::arch::naked_asm!(
        "mov rax, qword ptr [rip + {{table}}@GOTPCREL]",
        "mov rax, qword ptr [rax + {offset}]",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "jmp qword ptr [rip + {{absent}}@GOTPCREL]",
        table = sym FORWARD,
        absent = sym absent,
    );
    #[cfg(target_arch = "aarch64")]
    core::arch::naked_asm!(
        "adrp x16, :got:{{table}}",
        "ldr x16, [x16, :got_lo12:{{table}}]",
        "ldr x16, [x16, #{offset}]",
        "cbz x16, 2f",
        "br x16",
        "2:",
        "adrp x16, :got:{{absent}}",
        "ldr x16, [x16, :got_lo12:{{absent}}]",
        "br x16",
        table = sym FORWARD,
        absent = sym absent,
    );
}}
"#
    )
    .expect("writing to a String");
}

fn main() {
    // Read when the script runs (the crate's folder then), not when it was built.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest_dir);
    let list = root.join("nvidia_exports.txt");
    println!("cargo:rerun-if-changed={}", list.display());
    println!("cargo:rerun-if-changed={}", root.join("src").display());
    let ours = defined_here(&root.join("src"));
    let text = std::fs::read_to_string(&list).expect("nvidia_exports.txt");
    let forwarded: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter(|name| !ours.contains(*name))
        .collect();
    let mut out = String::new();
    writeln!(
        out,
        "/// NVIDIA's entry points that go to NVIDIA's NVML, in slot order.\n\
         pub const FORWARDED: [&str; {}] = {:?};",
        forwarded.len(),
        forwarded
    )
    .expect("writing to a String");
    for (slot, name) in forwarded.iter().enumerate() {
        trampoline(&mut out, name, slot);
    }
    let dest = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("forwarded.rs");
    std::fs::write(dest, out).expect("writing forwarded.rs");
}
