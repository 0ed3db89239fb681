//! Parser error positions, and a deterministic mutation loop proving that the
//! parser, the loader and the interpreter never panic on damaged PTX.

use cumux_ptx::*;

const FIXTURES: [&str; 7] = [
    include_str!("fixtures/basic.ptx"),
    include_str!("fixtures/warp_misc.ptx"),
    include_str!("fixtures/ops.ptx"),
    include_str!("fixtures/misc.ptx"),
    include_str!("fixtures/legacy.ptx"),
    include_str!("fixtures/mma.ptx"),
    include_str!("fixtures/wmma.ptx"),
];

#[test]
fn parses_fixtures() {
    for f in FIXTURES {
        let m = parse(f).unwrap();
        assert_eq!(m.version, 90);
        assert!(m.targets.iter().any(|t| t.starts_with("sm_")));
    }
}

#[test]
fn error_names_line_column_and_token() {
    let src = ".version 8.5\n.target sm_75\n.address_size 64\n\n.visible .entry k()\n{\n    foo.bar %r1, baz;\n  !wrong;\n}\n";
    let e = parse(src).unwrap_err();
    assert_eq!((e.line, e.column), (8, 3), "{e}");
    assert_eq!(e.token, "!");
    assert_eq!(
        e.to_string(),
        "line 8, column 3: unexpected token `!`: expected instruction"
    );

    let e = parse(".version 8.5\n.target sm_75\n.entry k( .param .u32 a {").unwrap_err();
    assert_eq!((e.line, e.column), (3, 25), "{e}");
    assert_eq!(e.token, "{");

    let e = parse(".version 9.0\n.target sm_75\n.global .u32 x = 0fZZ;").unwrap_err();
    assert_eq!(e.line, 3);
    assert!(e.message.contains("number"), "{e}");

    let e = parse(".version 9.0\n.entry k() { ret; ").unwrap_err();
    assert_eq!(e.token, "end of input");
    let e = parse("\"unterminated").unwrap_err();
    assert_eq!((e.line, e.column), (1, 1));
}

#[test]
fn load_rejects_unknown_registers_and_labels() {
    let mem = DeviceMemory::new(1 << 20);
    let src = ".version 9.0\n.target sm_75\n.address_size 64\n.entry k()\n{\n .reg .b32 %r<2>;\n mov.u32 %r5, 1;\n ret;\n}\n";
    let e = Program::load(src, &mem).unwrap_err();
    assert_eq!(e.cu_code(), 218);
    let src = ".version 9.0\n.target sm_75\n.address_size 64\n.entry k()\n{\n bra $L_nowhere;\n}\n";
    let e = Program::load(src, &mem).unwrap_err();
    assert!(e.to_string().contains("$L_nowhere"), "{e}");
    assert_eq!(mem.used(), 0);
}

/// xorshift64*: deterministic pseudo-random numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const PIECES: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    ";",
    ",",
    "%r1",
    "%rd1",
    "%p1",
    "@%p1",
    "@!%p1",
    ".reg",
    ".b32",
    ".u64",
    ".f32",
    ".pred",
    "bra",
    "ret;",
    "exit;",
    "bar.sync 0;",
    "0f7FC00000",
    "-1",
    "0x7fffffffffffffff",
    "99999999999999999999999",
    "%r<4000000000>",
    ".shared",
    ".param",
    "$L__BB0_1",
    "$L__BB0_1:",
    "ld.global.u32",
    "st.shared.v4.f32",
    "\"",
    "/*",
    "//",
    "\n",
    "call.uni",
    "vprintf",
    "+",
    "-",
    "|",
    "!",
    "<",
    ">",
    "=",
    "shfl.sync.bfly.b32",
    "trap;",
    ".align 4096",
    ".v4",
    "[%rd1+-8]",
    "{%r1, %r2}",
    "_",
    "0d4000000000000000",
];

fn mutate(src: &str, rng: &mut Rng) -> String {
    let mut s: Vec<u8> = src.as_bytes().to_vec();
    let rounds = if rng.below(2) == 0 {
        1
    } else {
        1 + rng.below(4)
    };
    for _ in 0..rounds {
        let len = s.len();
        match rng.below(7) {
            0 => s.truncate(rng.below(len + 1)),
            1 => {
                let a = rng.below(len + 1);
                let b = (a + rng.below(64)).min(len);
                s.drain(a..b);
            }
            2 => {
                let a = rng.below(len + 1);
                let piece = PIECES[rng.below(PIECES.len())];
                s.splice(a..a, piece.bytes());
            }
            3 => {
                if len > 0 {
                    let a = rng.below(len);
                    let set = b"{}[]();,.%@!-+0123456789abcxyz \n";
                    s[a] = set[rng.below(set.len())];
                }
            }
            4 => {
                let a = rng.below(len + 1);
                let b = (a + rng.below(200)).min(len);
                let chunk = s[a..b].to_vec();
                let at = rng.below(len + 1);
                s.splice(at..at, chunk);
            }
            5 => {
                if len > 0 {
                    let a = rng.below(len);
                    s[a] = (rng.next() & 0xff) as u8;
                }
            }
            _ => {
                // swap two lines
                let text = String::from_utf8_lossy(&s).into_owned();
                let mut lines: Vec<&str> = text.lines().collect();
                if lines.len() > 2 {
                    let (i, j) = (rng.below(lines.len()), rng.below(lines.len()));
                    lines.swap(i, j);
                }
                s = lines.join("\n").into_bytes();
            }
        }
    }
    String::from_utf8_lossy(&s).into_owned()
}

#[test]
fn mutated_ptx_never_panics() {
    let cases: usize = std::env::var("PTX_MUTATION_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let mem = DeviceMemory::new(1 << 28);
    let buf = mem.alloc(1 << 16).unwrap();
    let seed = std::env::var("PTX_MUTATION_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x9E37_79B9_7F4A_7C15u64);
    let mut rng = Rng(seed | 1);
    let (mut parsed, mut loaded, mut launched) = (0, 0, 0);
    for case in 0..cases {
        let base = FIXTURES[case % FIXTURES.len()];
        let src = mutate(base, &mut rng);
        let started = std::time::Instant::now();
        let verbose = std::env::var("PTX_MUTATION_VERBOSE").is_ok();
        if verbose {
            eprintln!("case {case}");
            if std::env::var("PTX_MUTATION_DUMP").is_ok_and(|v| v == case.to_string()) {
                std::fs::write("/tmp/ptx_case.ptx", &src).ok();
            }
        }
        let r = std::panic::catch_unwind(|| parse(&src));
        let Ok(result) = r else {
            panic!("parser panicked on case {case}:\n{src}");
        };
        let Ok(_) = result else { continue };
        parsed += 1;
        let r = std::panic::catch_unwind(|| Program::load(&src, &mem));
        let Ok(result) = r else {
            panic!("loader panicked on case {case}:\n{src}");
        };
        let program = match result {
            Ok(program) => program,
            Err(e) => {
                // a malformed lowered module is a lowering bug, not bad input
                assert!(
                    !e.to_string().contains("internal error"),
                    "lowering broke the IR contract on case {case}: {e}\n{src}"
                );
                continue;
            }
        };
        loaded += 1;
        // launch kernels (every 4th case) with pointer-filled parameters under a budget
        for k in program
            .kernels()
            .iter()
            .filter(|_| case % 4 == 0)
            .cloned()
            .collect::<Vec<_>>()
        {
            let mut params = vec![0u8; k.params_bytes() as usize];
            for p in &k.params {
                let v = buf.to_le_bytes();
                let n = (p.size as usize).min(8);
                params[p.offset as usize..p.offset as usize + n].copy_from_slice(&v[..n]);
            }
            let cfg = LaunchConfig {
                grid: [2, 1, 1],
                block: [40, 1, 1],
                dynamic_shared_bytes: 256,
            };
            let rep = program.launch_limited(&mem, &k.name, &cfg, &params, 20_000);
            if let Err(Fault::Failed(m)) = &rep.result {
                assert!(
                    !m.contains("internal error"),
                    "interpreter panicked on case {case}: {m}\n{src}"
                );
            }
            launched += 1;
        }
        program.unload(&mem);
        if verbose && started.elapsed().as_millis() > 200 {
            eprintln!("case {case} took {:?}", started.elapsed());
        }
    }
    // after all that, memory is back to the one buffer and still works
    assert_eq!(mem.used(), 1 << 16);
    eprintln!("{cases} cases: {parsed} parsed, {loaded} loaded, {launched} launches");
    assert!(parsed > 0 && loaded > 0);
}
