//! Ordered vector accesses are whole (issue 22): a `ld.relaxed.v2.u64` that
//! races a `st.relaxed.v2.u64` of another block sees all of one store, as
//! CUB's tile descriptors (status and value in one access) need.

mod common;

use common::{linear, Device};
use cumux_ptx::{Engine, LaunchLimits};

/// One ordered vector form: element type, element count and the
/// qualifiers between `ld`/`st` and the state space.
struct Form {
    ty: &'static str,
    n: usize,
    order: &'static str,
}

const FORMS: [Form; 5] = [
    // CUB's tile descriptor of a 64-bit value: 16 bytes
    Form {
        ty: "u64",
        n: 2,
        order: "relaxed.gpu",
    },
    Form {
        ty: "u32",
        n: 4,
        order: "relaxed.gpu",
    },
    // older CUB's volatile descriptors
    Form {
        ty: "u64",
        n: 2,
        order: "volatile",
    },
    // 8 bytes
    Form {
        ty: "u32",
        n: 2,
        order: "relaxed.gpu",
    },
    Form {
        ty: "u16",
        n: 4,
        order: "volatile",
    },
];

impl Form {
    fn name(&self) -> String {
        format!(
            "tear_{}_v{}_{}",
            self.order.replace('.', "_"),
            self.n,
            self.ty
        )
    }

    /// A kernel whose block 0 waits until blocks 1..=`readers` started, then
    /// stores `{k, k, …}` for `k` = 1..=`rounds` at `slot` with the form's
    /// vector store, while each other block loads the slot with its vector
    /// load until it reads `rounds` whole (only thread 0 of each block
    /// works; higher blocks do nothing); a reader counts in `counts[2b]`
    /// the loads whose elements differ (torn) and in `counts[2b+1]` those
    /// that read a store between the first and the last (the race ran).
    fn kernel(&self) -> String {
        let (ty, n, order) = (self.ty, self.n, self.order);
        // 16-bit elements live in 32-bit registers of their own width
        let reg = match ty {
            "u64" => "b64",
            "u32" => "b32",
            _ => "b16",
        };
        let vals = |r: &str| (0..n).map(|_| r.to_string()).collect::<Vec<_>>().join(", ");
        let loaded = (0..n)
            .map(|i| format!("%v{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let rounds = match ty {
            "u64" => "cvt.u64.u32 %rr, %r1;",
            "u32" => "mov.u32 %rr, %r1;",
            _ => "cvt.u16.u32 %rr, %r1;",
        };
        let mut differ = String::new();
        for i in 2..n {
            differ.push_str(&format!(
                "    setp.ne.{ty} %p6, %v0, %v{i};\n    or.pred %p4, %p4, %p6;\n"
            ));
        }
        let name = self.name();
        format!(
            r#"
.version 7.5
.target sm_75
.address_size 64

.visible .entry {name}(.param .u64 slot, .param .u64 counts, .param .u64 started,
    .param .u32 rounds, .param .u32 readers)
{{
    .reg .pred %p<8>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<16>;
    .reg .{reg} %v<4>;
    .reg .{reg} %k;
    .reg .{reg} %rr;

    ld.param.u64 %rd1, [slot];
    ld.param.u64 %rd2, [counts];
    ld.param.u64 %rd3, [started];
    ld.param.u32 %r1, [rounds];
    ld.param.u32 %r2, [readers];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    cvta.to.global.u64 %rd3, %rd3;
    {rounds}
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r9, %tid.x;
    setp.ne.u32 %p1, %r9, 0;
    setp.gt.u32 %p2, %r3, %r2;
    or.pred %p1, %p1, %p2;
    @%p1 bra DONE;
    setp.ne.u32 %p1, %r3, 0;
    @%p1 bra READER;
WAIT:
    ld.volatile.global.u32 %r4, [%rd3];
    setp.lt.u32 %p2, %r4, %r2;
    @%p2 bra WAIT;
    mov.{ty} %k, 0;
WRITE:
    add.{ty} %k, %k, 1;
    st.{order}.global.v{n}.{ty} [%rd1], {{{k}}};
    setp.lt.{ty} %p3, %k, %rr;
    @%p3 bra WRITE;
    ret;
READER:
    atom.global.add.u32 %r6, [%rd3], 1;
    mov.u32 %r7, 0;
    mov.u32 %r8, 0;
READ:
    ld.{order}.global.v{n}.{ty} {{{loaded}}}, [%rd1];
    setp.ne.{ty} %p4, %v0, %v1;
{differ}    @%p4 add.u32 %r7, %r7, 1;
    @%p4 bra READ;
    setp.lt.{ty} %p5, %v0, %rr;
    setp.ne.{ty} %p7, %v0, 0;
    and.pred %p7, %p7, %p5;
    @%p7 add.u32 %r8, %r8, 1;
    @%p5 bra READ;
    mul.wide.u32 %rd4, %r3, 8;
    add.s64 %rd5, %rd2, %rd4;
    st.global.v2.u32 [%rd5], {{%r7, %r8}};
DONE:
    ret;
}}
"#,
            k = vals("%k"),
        )
    }
}

/// Blocks reading while block 0 writes: one per worker beside the writer's.
const READERS: usize = 3;
/// Blocks of the launch: one more than the workers, so that the compiler's
/// launch spreads the grid over its workers (a grid of at most 4,096
/// threads runs on one), and blocks of 1,024 threads.
const BLOCKS: usize = READERS + 2;
const THREADS: usize = 1024;

/// The torn loads and the loads of a store in the race that the readers
/// of `form` counted on `engine`.
fn race(form: &Form, engine: Engine, rounds: u32) -> (u64, u64) {
    let name = form.name();
    let mut dev = Device::load(&name, &form.kernel(), 1 << 24);
    dev.program.set_engine(engine);
    if engine == Engine::Compiler {
        dev.program
            .compiled(&name)
            .unwrap_or_else(|why| panic!("{name} stays interpreted: {why}"));
    }
    let slot = dev.alloc(16);
    let counts = dev.alloc((READERS + 1) * 8);
    let started = dev.alloc(4);
    // every reader block runs beside the writer; a spin that never ends
    // runs into the budget
    let limits = LaunchLimits {
        workers: READERS + 1,
        per_block: 4_000_000_000,
        ..LaunchLimits::NONE
    };
    let report = dev.launch_limited(
        &name,
        linear(BLOCKS, THREADS),
        &[&slot, &counts, &started, &rounds, &(READERS as u32)],
        &limits,
    );
    report
        .result
        .unwrap_or_else(|e| panic!("{name} on {engine:?}: {e:?}"));
    let got: Vec<u32> = dev.download(counts, (READERS + 1) * 2);
    let torn = got.chunks(2).skip(1).map(|c| c[0] as u64).sum();
    let mid = got.chunks(2).skip(1).map(|c| c[1] as u64).sum();
    (torn, mid)
}

fn no_torn_loads(engine: Engine, rounds: u32) {
    let mut failures = Vec::new();
    for form in &FORMS {
        // 16-bit forms wrap at 65,535
        let rounds = if form.ty == "u16" {
            rounds.min(65_000)
        } else {
            rounds
        };
        let (torn, mid) = race(form, engine, rounds);
        eprintln!(
            "{} on {engine:?}: {torn} torn loads, {mid} loads of a store in the race",
            form.name()
        );
        if torn != 0 {
            failures.push(format!("{}: {torn} torn loads", form.name()));
        }
        assert!(
            mid > 0,
            "{}: no reader saw a store between the first and the last: the race did not run",
            form.name()
        );
    }
    assert!(failures.is_empty(), "on {engine:?}: {failures:?}");
}

#[test]
fn ordered_vector_loads_see_whole_stores_on_the_compiler() {
    no_torn_loads(Engine::Compiler, 2_000_000);
}

#[test]
fn ordered_vector_loads_see_whole_stores_on_the_interpreter() {
    no_torn_loads(Engine::Interpreter, 2_000_000);
}

/// Ordered vector accesses at `p + off`: a 16-byte load, an 8-byte load
/// and 16- and 8-byte stores (elements `v`, `v + 1`, … ), each load's
/// elements sign-extended or not as stored to `out`.
const ACCESSES: &str = r#"
.version 7.5
.target sm_75
.address_size 64

.visible .entry ordered_at(.param .u64 p, .param .u64 off, .param .u64 out)
{
    .reg .b32 %r<16>;
    .reg .b64 %rd<16>;

    ld.param.u64 %rd1, [p];
    ld.param.u64 %rd2, [off];
    ld.param.u64 %rd3, [out];
    add.s64 %rd1, %rd1, %rd2;
    ld.relaxed.gpu.global.v2.u64 {%rd4, %rd5}, [%rd1];
    ld.acquire.gpu.global.v2.s32 {%r1, %r2}, [%rd1+16];
    ld.volatile.v4.u32 {%r3, %r4, %r5, %r6}, [%rd1+32];
    st.global.v2.u64 [%rd3], {%rd4, %rd5};
    st.global.v4.u32 [%rd3+16], {%r1, %r2, %r3, %r4};
    st.global.v2.u32 [%rd3+32], {%r5, %r6};
    add.s64 %rd6, %rd4, 1;
    st.release.gpu.global.v2.u64 [%rd1+48], {%rd5, %rd6};
    add.s32 %r7, %r1, 1;
    st.relaxed.gpu.v2.s32 [%rd1+64], {%r7, %r2};
    st.volatile.global.v4.u16 [%rd1+72], {%r3, %r4, %r5, %r6};
    ret;
}
"#;

/// What `ordered_at` did at offset `off` of an 80-byte buffer on `engine`:
/// the result, the values loaded and the buffer after.
fn accesses_at(engine: Engine, off: u64) -> (Result<(), String>, Vec<u32>, Vec<u32>) {
    let mut dev = Device::load("ordered_at", ACCESSES, 1 << 20);
    dev.program.set_engine(engine);
    if engine == Engine::Compiler {
        dev.program.compiled("ordered_at").expect("compiled");
    }
    let init: Vec<u32> = (0..20).map(|i| 0x8000_0000 | i).collect();
    let p = dev.upload(&init);
    let out = dev.alloc(40);
    let report = dev.try_launch("ordered_at", linear(1, 1), &[&p, &off, &out]);
    let result = report.result.map_err(|f| format!("{f:?}"));
    (result, dev.download(out, 10), dev.download(p, 20))
}

#[test]
fn ordered_vectors_keep_their_values_and_faults_on_both_engines() {
    let (result, loaded, after) = accesses_at(Engine::Interpreter, 0);
    assert_eq!(result, Ok(()), "aligned accesses run");
    let v = |i: u32| 0x8000_0000 | i;
    let want: Vec<u32> = [0, 1, 2, 3, 4, 5, 8, 9, 10, 11].map(v).to_vec();
    assert_eq!(loaded, want);
    let mut want: Vec<u32> = (0..20).map(v).collect();
    want[12..16].copy_from_slice(&[v(2), v(3), v(0) + 1, v(1)]);
    want[16..18].copy_from_slice(&[v(4) + 1, v(5)]);
    want[18..20].copy_from_slice(&[v(9) << 16 | v(8) & 0xffff, v(11) << 16 | v(10) & 0xffff]);
    assert_eq!(after, want);
    assert_eq!(accesses_at(Engine::Compiler, 0), (result, loaded, after));
    // 8 bytes off: the 16-byte load is misaligned; past the buffer's end:
    // out of bounds; each engine faults alike
    for off in [8u64, 1 << 16] {
        let interp = accesses_at(Engine::Interpreter, off);
        let err = interp.0.clone().expect_err("faults");
        let kind = if off == 8 {
            "MisalignedAddress"
        } else {
            "IllegalAddress"
        };
        assert!(err.starts_with(kind), "offset {off}: {err}");
        assert_eq!(accesses_at(Engine::Compiler, off), interp, "offset {off}");
    }
}
