//! Test-only helpers shared by every cumux test suite: where the workspace and the
//! CUDA corpus live, where NVIDIA's compiler is, and cached nvcc builds of CUDA
//! sources (PTX text or complete programs) under `target/cuda-cache/`.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

pub mod fake_gpu;
pub mod netem;

/// The root of the cargo workspace (the folder holding the root `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .expect("crates/testkit lies two levels below the workspace root")
        .to_path_buf()
}

/// The folder of self-checking CUDA programs: `tests/cuda/corpus`.
pub fn corpus_dir() -> PathBuf {
    workspace_root().join("tests").join("cuda").join("corpus")
}

/// The path of one corpus source, e.g. `corpus_source("vector_add")`.
pub fn corpus_source(name: &str) -> PathBuf {
    corpus_dir().join(format!("{name}.cu"))
}

/// The CUDA home holding `bin/nvcc` and `lib/`: `$CUMUX_CUDA_HOME` when set,
/// else the PyPI install that `scripts/setup-nvcc` makes under `.venv`.
///
/// Panics (so tests fail rather than skip) when no nvcc can be found.
pub fn cuda_home() -> PathBuf {
    if let Some(home) = std::env::var_os("CUMUX_CUDA_HOME") {
        let home = PathBuf::from(home);
        assert!(
            home.join("bin").join("nvcc").is_file(),
            "CUMUX_CUDA_HOME={} has no bin/nvcc; unset it or run scripts/setup-nvcc",
            home.display()
        );
        return home;
    }
    if let Some(home) = venv_cuda_home() {
        return home;
    }
    panic!(
        "nvcc not found: set CUMUX_CUDA_HOME, or run `scripts/setup-nvcc` from the \
         workspace root ({}) to install NVIDIA's CUDA 13.0 compiler into .venv",
        workspace_root().display()
    );
}

/// `<workspace>/.venv/lib/python3.X/site-packages/nvidia/cu13` for whichever
/// python3.X the virtual environment holds, if its `bin/nvcc` exists.
fn venv_cuda_home() -> Option<PathBuf> {
    let lib = workspace_root().join(".venv").join("lib");
    let mut candidates: Vec<PathBuf> = fs::read_dir(&lib)
        .ok()?
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("python3"))
        .map(|entry| {
            entry
                .path()
                .join("site-packages")
                .join("nvidia")
                .join("cu13")
        })
        .filter(|home| home.join("bin").join("nvcc").is_file())
        .collect();
    candidates.sort();
    candidates.pop()
}

/// A fresh folder under the system's temporary folder, named after `tag`,
/// this process and a counter; removed with everything in it at drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let n = unique_counter();
        let dir = std::env::temp_dir().join(format!("cumux-test-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap_or_else(|err| panic!("creating {}: {err}", dir.display()));
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// xorshift64*: a small deterministic generator for the tests that feed the
/// server hostile input, so a failure replays exactly from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// Fewer than `n` random bytes (at least one if `n > 1`).
    pub fn bytes_below(&mut self, n: u64) -> Vec<u8> {
        let len = self.below(n) as usize;
        self.bytes(len)
    }

    /// One of `items`, which must not be empty.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// The nvcc executable inside [`cuda_home`].
pub fn nvcc() -> PathBuf {
    cuda_home().join("bin").join("nvcc")
}

/// Compiles a CUDA source to PTX with nvcc's default architecture and returns
/// the PTX text. Cached: a second call with the same source is a file read.
pub fn compile_ptx(cu_path: impl AsRef<Path>) -> String {
    compile_ptx_with(cu_path, &[])
}

/// Like [`compile_ptx`], with extra nvcc arguments (e.g. `-arch=sm_80`).
pub fn compile_ptx_with(cu_path: impl AsRef<Path>, extra_args: &[&str]) -> String {
    let cu_path = cu_path.as_ref();
    let mut args: Vec<String> = vec!["-ptx".into()];
    args.extend(extra_args.iter().map(|arg| arg.to_string()));
    let out = cached_build(cu_path, &args, "ptx");
    fs::read_to_string(&out)
        .unwrap_or_else(|err| panic!("reading cached PTX {}: {err}", out.display()))
}

/// Builds a complete program from a CUDA source with nvcc's default flags plus
/// `extra_args`, linking against `<cuda_home>/lib`. Returns the executable's
/// path inside the cache; it is rebuilt only when source, flags or nvcc change.
pub fn compile_program(cu_path: impl AsRef<Path>, extra_args: &[&str]) -> PathBuf {
    let cu_path = cu_path.as_ref();
    let lib = cuda_home().join("lib");
    let mut args: Vec<String> = extra_args.iter().map(|arg| arg.to_string()).collect();
    args.push(format!("-L{}", lib.display()));
    cached_build(cu_path, &args, "bin")
}

/// Runs `nvcc <args> -o <tmp> <source>` unless an output for this exact
/// (source text, args, nvcc) already sits in the cache; then renames the
/// temporary output into place so concurrent builders never see a partial file.
fn cached_build(cu_path: &Path, args: &[String], extension: &str) -> PathBuf {
    let source = fs::read(cu_path)
        .unwrap_or_else(|err| panic!("reading CUDA source {}: {err}", cu_path.display()));
    let nvcc = nvcc();
    let mut key = Fingerprint::new();
    key.add(&source);
    add_local_includes(&mut key, cu_path, &source, &mut Vec::new());
    for arg in args {
        key.add(arg.as_bytes());
    }
    key.add(nvcc.to_string_lossy().as_bytes());
    if let Ok(modified) = fs::metadata(&nvcc).and_then(|meta| meta.modified()) {
        key.add(format!("{modified:?}").as_bytes());
    }
    let stem = cu_path
        .file_stem()
        .map(|stem| stem.to_string_lossy().into_owned())
        .unwrap_or_else(|| "source".into());
    let cache = cache_dir();
    let out = cache.join(format!("{stem}-{}.{extension}", key.hex()));
    if out.is_file() {
        return out;
    }
    fs::create_dir_all(&cache).unwrap_or_else(|err| panic!("creating {}: {err}", cache.display()));
    let tmp = cache.join(format!(
        ".{stem}-{}.{}-{}.tmp.{extension}",
        key.hex(),
        std::process::id(),
        unique_counter()
    ));
    let output = Command::new(&nvcc)
        .args(args)
        .arg("-o")
        .arg(&tmp)
        .arg(cu_path)
        .output()
        .unwrap_or_else(|err| panic!("running {}: {err}", nvcc.display()));
    if !output.status.success() {
        let _ = fs::remove_file(&tmp);
        let mut message = Vec::new();
        let _ = writeln!(
            message,
            "nvcc failed ({}) on {} with args {:?}",
            output.status,
            cu_path.display(),
            args
        );
        message.extend_from_slice(&output.stdout);
        message.extend_from_slice(&output.stderr);
        panic!("{}", String::from_utf8_lossy(&message));
    }
    fs::rename(&tmp, &out)
        .unwrap_or_else(|err| panic!("moving {} to {}: {err}", tmp.display(), out.display()));
    out
}

/// Adds to `key` the text of every `#include "…"` that `text` (the contents of
/// `file`) names and that exists beside `file`, where the compiler looks
/// first, and of theirs in turn: editing a shared header such as
/// `tests/cuda/corpus/check.h` rebuilds the programs that include it.
fn add_local_includes(key: &mut Fingerprint, file: &Path, text: &[u8], seen: &mut Vec<PathBuf>) {
    let dir = file.parent().unwrap_or(Path::new("."));
    for line in String::from_utf8_lossy(text).lines() {
        let Some(rest) = line.trim_start().strip_prefix("#include") else {
            continue;
        };
        let Some((name, _)) = rest
            .trim_start()
            .strip_prefix('"')
            .and_then(|r| r.split_once('"'))
        else {
            continue;
        };
        let header = dir.join(name);
        if seen.contains(&header) {
            continue;
        }
        let Ok(contents) = fs::read(&header) else {
            continue; // found on the include path instead; not ours to track
        };
        seen.push(header.clone());
        key.add(name.as_bytes());
        key.add(&contents);
        add_local_includes(key, &header, &contents, seen);
    }
}

/// `<workspace>/target/cuda-cache`, or under `$CARGO_TARGET_DIR` when set.
fn cache_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|dir| {
            if dir.is_absolute() {
                dir
            } else {
                workspace_root().join(dir)
            }
        })
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("cuda-cache")
}

fn unique_counter() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A 128-bit content fingerprint: two independent FNV-1a 64 lanes, each input
/// length-prefixed so that ("ab","c") and ("a","bc") differ.
struct Fingerprint {
    lanes: [u64; 2],
}

impl Fingerprint {
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Self {
        Fingerprint {
            lanes: [0xcbf2_9ce4_8422_2325, 0x6c62_272e_07bb_0142],
        }
    }

    fn add(&mut self, bytes: &[u8]) {
        let length = (bytes.len() as u64).to_le_bytes();
        for &byte in length.iter().chain(bytes) {
            self.lanes[0] = (self.lanes[0] ^ u64::from(byte)).wrapping_mul(Self::PRIME);
            self.lanes[1] = (self.lanes[1] ^ u64::from(byte.rotate_left(3)))
                .wrapping_mul(Self::PRIME)
                .rotate_left(5);
        }
    }

    fn hex(&self) -> String {
        format!("{:016x}{:016x}", self.lanes[0], self.lanes[1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_root_holds_the_workspace_manifest() {
        let manifest = fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
        assert!(manifest.contains("[workspace]"));
    }

    #[test]
    fn a_local_header_is_part_of_the_build_key() {
        let dir = TempDir::new("include-key");
        let source = dir.0.join("program.cu");
        let header = dir.0.join("check.h");
        let text = b"#include <cstdio>\n  #include \"check.h\"\nint main() {}\n";
        fs::write(&source, text).unwrap();
        let key_with = |header_text: &[u8]| {
            fs::write(&header, header_text).unwrap();
            let mut key = Fingerprint::new();
            add_local_includes(&mut key, &source, text, &mut Vec::new());
            key.hex()
        };
        assert_ne!(
            key_with(b"#define CHECK(x) x"),
            key_with(b"#define CHECK(x) (x)")
        );
        // A header that includes itself is read once.
        assert_eq!(
            key_with(b"#include \"check.h\""),
            key_with(b"#include \"check.h\"")
        );
    }

    #[test]
    fn fingerprint_separates_argument_boundaries() {
        let mut a = Fingerprint::new();
        a.add(b"ab");
        a.add(b"c");
        let mut b = Fingerprint::new();
        b.add(b"a");
        b.add(b"bc");
        assert_ne!(a.hex(), b.hex());
    }
}
