//! The fence pass (`cumux-ptx-fence`) end to end: rewritten fixtures and
//! corpus kernels assemble with NVIDIA's ptxas, and on the interpreter fenced
//! kernels give the same results in their partition and cannot leave it.

mod common;

use common::{linear, Device};
use cumux_ptx::{DeviceMemory, Program};
use cumux_ptx_fence::{fence_ptx, Fence, FenceError, FENCE_SYMBOL};
use std::path::{Path, PathBuf};
use std::process::Command;

/// NVIDIA's compiler home (`scripts/setup-nvcc`), if this machine has one.
fn cuda_home() -> Option<PathBuf> {
    let home = PathBuf::from(std::env::var_os("CUMUX_CUDA_HOME")?);
    home.join("bin/ptxas").exists().then_some(home)
}

fn ptxas(home: &Path, ptx: &Path) -> Result<(), String> {
    let out = Command::new(home.join("bin/ptxas"))
        .args(["-arch=sm_90", "-o", "/dev/null"])
        .arg(ptx)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Every PTX text of the project: the fixtures, and with nvcc the CUDA corpus.
fn corpus(home: &Path, dir: &Path) -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut texts = Vec::new();
    let mut fixtures: Vec<_> = std::fs::read_dir(root.join("tests/fixtures"))
        .expect("fixtures")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "ptx"))
        .collect();
    fixtures.sort();
    for path in fixtures {
        let text = std::fs::read_to_string(&path).expect("read fixture");
        texts.push((path.display().to_string(), text));
    }
    let cuda = root.join("../../tests/cuda/corpus");
    let mut sources: Vec<_> = std::fs::read_dir(&cuda)
        .expect("corpus")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    // nvcc's default architecture (what fat binaries carry unless told) and
    // the H100's: their code differs (inline-asm blocks after labels, …).
    for (source, arch) in sources
        .iter()
        .flat_map(|s| [(s, "-arch=sm_75"), (s, "-arch=sm_90")])
    {
        let stem = source.file_stem().unwrap().to_string_lossy();
        let out = dir.join(format!("{stem}-{arch}.ptx"));
        let status = Command::new(home.join("bin/nvcc"))
            .args(["-ptx", arch, "-I"])
            .arg(&cuda)
            .arg("-o")
            .arg(&out)
            .arg(source)
            .status()
            .expect("nvcc");
        assert!(status.success(), "nvcc {}", source.display());
        let text = std::fs::read_to_string(&out).expect("nvcc output");
        texts.push((format!("{} ({arch})", source.display()), text));
    }
    texts
}

#[test]
fn fenced_corpus_assembles_with_ptxas_for_sm_90() {
    let Some(home) = cuda_home() else {
        eprintln!("skipped: set CUMUX_CUDA_HOME=$(scripts/setup-nvcc)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("cumux-fence-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut failures = Vec::new();
    let mut fenced_total = 0;
    let mut assembled = 0;
    let inline = [("the inline kernels".to_string(), PEEK.to_string())];
    for (name, text) in corpus(&home, &dir).into_iter().chain(inline) {
        let original = dir.join("original.ptx");
        std::fs::write(&original, &text).expect("write");
        if ptxas(&home, &original).is_err() {
            eprintln!("{name}: the original does not assemble for sm_90; skipped");
            continue;
        }
        let fenced = match fence_ptx(&text) {
            Ok(fenced) => fenced,
            // What the pass refuses by design: strided fragments of global
            // memory, bulk copies, the device heap.
            Err(FenceError::Unfenceable { opcode, .. })
                if opcode.starts_with("wmma.") || opcode.contains("bulk") =>
            {
                eprintln!("{name}: refused ({opcode})");
                continue;
            }
            Err(FenceError::DeviceHeap) => {
                eprintln!("{name}: refused (device malloc)");
                continue;
            }
            Err(err) => {
                failures.push(format!("{name}: {err}"));
                continue;
            }
        };
        fenced_total += fenced.fenced;
        let path = dir.join("fenced.ptx");
        std::fs::write(&path, &fenced.ptx).expect("write");
        match ptxas(&home, &path) {
            Ok(()) => assembled += 1,
            Err(err) => failures.push(format!("{name}: {err}")),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(fenced_total > 100, "only {fenced_total} operands fenced");
    assert!(
        assembled >= 25,
        "only {assembled} modules fenced and assembled"
    );
}

/// A partition of `size` bytes aligned to its size, mapped on `mem`.
fn partition(mem: &DeviceMemory, size: u64) -> u64 {
    let base = mem.reserve(size, size).expect("reserve");
    let id = mem.create_physical(size).expect("physical");
    mem.map(base, size, id).expect("map");
    base
}

/// Loads `ptx` fenced on `mem` and fills its fence with `[base, base + size)`.
fn load_fenced(ptx: &str, mem: &DeviceMemory, base: u64, size: u64) -> Program {
    let fenced = fence_ptx(ptx).expect("fence");
    let program = Program::load(&fenced.ptx, mem).expect("load fenced");
    let var = program
        .globals()
        .iter()
        .find(|g| g.name == FENCE_SYMBOL)
        .expect("fence variable")
        .ptr;
    let fence = Fence::new(base, size, 0, 0).expect("fence values");
    assert!(
        !fence.guards(var, 32),
        "the fence lies outside the partition"
    );
    mem.write(var, &fence.to_bytes()).expect("fill fence");
    program
}

const PEEK: &str = r#"
.version 8.0
.target sm_75
.address_size 64

.visible .func (.param .b64 r) load_at(.param .b64 a)
{
	.reg .b64 %x<3>;
	ld.param.b64 %x1, [a];
	ld.u64 %x2, [%x1];
	st.param.b64 [r], %x2;
	ret;
}

// out[i] = *(u64*)(src + 8 i) (generic, through a .func); *(dst + 8 i) = i + 7 (global)
.visible .entry peek(.param .u64 out, .param .u64 src, .param .u64 dst)
{
	.reg .b32 %r<2>;
	.reg .b64 %rd<9>;
	ld.param.u64 %rd1, [out];
	ld.param.u64 %rd2, [src];
	ld.param.u64 %rd3, [dst];
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd4, %r1, 8;
	add.s64 %rd5, %rd2, %rd4;
	{
	.param .b64 a0;
	st.param.b64 [a0], %rd5;
	.param .b64 r0;
	call.uni (r0), load_at, (a0);
	ld.param.b64 %rd6, [r0];
	}
	add.s64 %rd7, %rd1, %rd4;
	st.global.u64 [%rd7], %rd6;
	cvt.u64.u32 %rd8, %r1;
	add.s64 %rd8, %rd8, 7;
	add.s64 %rd7, %rd3, %rd4;
	st.global.u64 [%rd7+0], %rd8;
	ret;
}

// Stages a value per thread in shared and local memory through generic
// pointers, then writes their sum: out[i] = 2 * in[i] + 1.
.visible .entry staged(.param .u64 out, .param .u64 in)
{
	.shared .align 8 .b8 stage[256];
	.local .align 8 .b8 spill[8];
	.reg .b32 %r<2>;
	.reg .b64 %rd<12>;
	ld.param.u64 %rd1, [out];
	ld.param.u64 %rd2, [in];
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd3, %r1, 8;
	add.s64 %rd4, %rd2, %rd3;
	ld.global.nc.u64 %rd5, [%rd4];
	mov.u64 %rd6, stage;
	cvta.shared.u64 %rd6, %rd6;
	add.s64 %rd6, %rd6, %rd3;
	st.u64 [%rd6], %rd5;
	mov.u64 %rd7, spill;
	cvta.local.u64 %rd7, %rd7;
	add.s64 %rd8, %rd5, 1;
	st.u64 [%rd7], %rd8;
	bar.sync 0;
	ld.u64 %rd9, [%rd6];
	ld.u64 %rd10, [%rd7];
	add.s64 %rd11, %rd9, %rd10;
	add.s64 %rd4, %rd1, %rd3;
	atom.global.exch.b64 %rd11, [%rd4], %rd11;
	red.global.add.u64 [%rd4], %rd5;
	ret;
}
"#;

const SIZE: u64 = 4 << 20;

fn bytes_u64(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn read_u64(mem: &DeviceMemory, at: u64, n: usize) -> Vec<u64> {
    let mut bytes = vec![0u8; n * 8];
    mem.read(at, &mut bytes).expect("read");
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn params(values: &[u64]) -> Vec<u8> {
    bytes_u64(values)
}

#[test]
fn in_partition_kernels_give_the_same_results_fenced() {
    let plain = Device::load("peek", PEEK, 64 << 20);
    let mem = DeviceMemory::new(64 << 20);
    let base = partition(&mem, SIZE);
    let fenced = load_fenced(PEEK, &mem, base, SIZE);
    let input: Vec<u64> = (0..32).map(|i| i * 3 + 5).collect();
    // Unfenced, ordinary allocations.
    let (src, out, dst) = (plain.upload(&input), plain.alloc(256), plain.alloc(256));
    plain.launch("peek", linear(1, 32), &[&out, &src, &dst]);
    let (out2, src2) = (plain.alloc(256), plain.upload(&input));
    plain.launch("staged", linear(1, 32), &[&out2, &src2]);
    // Fenced, the same data inside the partition.
    let (f_src, f_out, f_dst, f_out2) =
        (base + 0x1000, base + 0x2000, base + 0x3000, base + 0x4000);
    mem.write(f_src, &bytes_u64(&input)).unwrap();
    let run = |name: &str, args: &[u64]| {
        let report = fenced.launch(&mem, name, &linear(1, 32), &params(args));
        report.result.expect("fenced launch");
    };
    run("peek", &[f_out, f_src, f_dst]);
    run("staged", &[f_out2, f_src]);
    assert_eq!(read_u64(&mem, f_out, 32), plain.download::<u64>(out, 32));
    assert_eq!(read_u64(&mem, f_dst, 32), plain.download::<u64>(dst, 32));
    let staged = read_u64(&mem, f_out2, 32);
    assert_eq!(staged, plain.download::<u64>(out2, 32));
    assert_eq!(
        staged[3],
        2 * input[3] + 1 + input[3],
        "shared and local via generic"
    );
}

#[test]
fn a_kernel_aimed_at_another_partition_stays_in_its_own() {
    let mem = DeviceMemory::new(64 << 20);
    let mine = partition(&mem, SIZE);
    let theirs = partition(&mem, SIZE);
    let secret: Vec<u64> = (0..32).map(|i| 0x5ec0_0000 + i).collect();
    mem.write(theirs + 0x1000, &bytes_u64(&secret)).unwrap();
    let fenced = load_fenced(PEEK, &mem, mine, SIZE);
    // Read their buffer and write over it, from a kernel fenced to mine.
    let out = mine + 0x8000;
    let args = params(&[out, theirs + 0x1000, theirs + 0x1000]);
    let report = fenced.launch(&mem, "peek", &linear(1, 32), &args);
    report.result.expect("fenced launch");
    assert_eq!(
        read_u64(&mem, theirs + 0x1000, 32),
        secret,
        "theirs untouched"
    );
    let seen = read_u64(&mem, out, 32);
    assert!(
        seen.iter().all(|v| !secret.contains(v)),
        "no secret read: {seen:x?}"
    );
    // The write landed at the same offset inside my partition.
    let landed = read_u64(&mem, mine + 0x1000, 32);
    assert_eq!(landed, (7..39).collect::<Vec<u64>>());
    // An address far outside every partition is folded in too, not a fault.
    let wild = params(&[out, theirs + 9 * SIZE, mine + 0x1000 + 5 * SIZE]);
    fenced
        .launch(&mem, "peek", &linear(1, 32), &wild)
        .result
        .expect("wild");
}
