//! Tests of the lowering/execution boundary: a hand-built lowered module
//! that breaks the contract of `validate` is refused on both sides, by
//! lowering's hand-off (a load error) and by the interpreter (a failed
//! launch), while a well-formed one passes both.

use crate::exec::Executable;
use crate::ir::{Address, ArgLoc, CallInfo, Func, Inst, MemOrder, Module, Op, Sp, Src, NONE};
use crate::launch::{Fault, LaunchConfig, LaunchLimits};
use crate::lower::hand_off;
use crate::memory::{DeviceMemory, DEVICE_VA_BASE};

fn inst(op: Op) -> Inst {
    Inst {
        guard: NONE,
        guard_neg: false,
        op,
        line: 1,
    }
}

fn func(name: &str, nregs: u32, code: Vec<Op>) -> Func {
    Func {
        name: name.into(),
        code: code.into_iter().map(inst).collect(),
        nregs,
        frame_bytes: 16,
        uses_volatile: false,
        params: Vec::new(),
        rets: Vec::new(),
    }
}

/// A kernel that calls a helper (one parameter) and stores to global memory.
fn well_formed() -> Module {
    let mut helper = func("helper", 1, vec![Op::Ret]);
    helper.params = vec![(0, 4)];
    let kernel = func(
        "k",
        2,
        vec![
            Op::Mov {
                d: 0,
                a: Src::Imm(DEVICE_VA_BASE),
                mask: u64::MAX,
            },
            Op::Call(Box::new(CallInfo {
                func: 1,
                target: None,
                args: vec![ArgLoc::Val {
                    src: Src::Reg(1),
                    size: 4,
                }],
                rets: Vec::new(),
            })),
            Op::Bra { target: 3 },
            Op::St {
                addr: Address {
                    sp: Sp::Global,
                    base: Src::Reg(0),
                    off: 0,
                },
                size: 4,
                n: 1,
                vals: [Src::Imm(7); 4],
                order: MemOrder::Plain,
            },
            Op::Exit,
        ],
    );
    Module {
        funcs: vec![kernel, helper],
        kernels: vec![0],
        dyn_shared_base: 0,
    }
}

fn launch(m: Module, mem: &DeviceMemory) -> Result<(), Fault> {
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let limits = LaunchLimits {
        per_block: 1 << 20,
        ..LaunchLimits::NONE
    };
    Executable::new(m)
        .launch(mem, 0, &cfg, &[], &limits, false)
        .result
}

/// Each way of breaking the contract (what, what the check says, how),
/// applied to the well-formed module.
type Breakage = (&'static str, &'static str, fn(&mut Module));

fn breakages() -> Vec<Breakage> {
    vec![
        ("register past the count", "writes register 2 of 2", |m| {
            m.funcs[0].code[0].op = Op::Mov {
                d: 2,
                a: Src::Imm(0),
                mask: u64::MAX,
            }
        }),
        ("guard past the count", "guard register 9", |m| {
            m.funcs[0].code[3].guard = 9
        }),
        ("branch past the code", "branch to 5 of 5", |m| {
            m.funcs[0].code[2].op = Op::Bra { target: 5 }
        }),
        (
            "call with a wrong argument count",
            "with 0 arguments",
            |m| {
                if let Op::Call(info) = &mut m.funcs[0].code[1].op {
                    info.args.clear();
                }
            },
        ),
        ("call to no function", "call to function 7", |m| {
            if let Op::Call(info) = &mut m.funcs[0].code[1].op {
                info.func = 7;
            }
        }),
        ("frame argument outside the frame", "frame slot 12+8", |m| {
            if let Op::Call(info) = &mut m.funcs[0].code[1].op {
                info.args[0] = ArgLoc::Frame { off: 12, size: 8 };
            }
        }),
        (
            "parameter slot outside the frame",
            "parameter slot 16+4",
            |m| m.funcs[1].params = vec![(16, 4)],
        ),
        ("store of three bytes", "ld/st width", |m| {
            if let Op::St { size, .. } = &mut m.funcs[0].code[3].op {
                *size = 3;
            }
        }),
        ("kernel that falls off its end", "unguarded `exit`", |m| {
            m.funcs[0].code.pop();
        }),
        ("function ending in a guarded ret", "unguarded `ret`", |m| {
            m.funcs[1].code[0].guard = 0
        }),
        ("kernel index past the functions", "kernel index 2", |m| {
            m.kernels = vec![2]
        }),
        ("frame not in 16-byte units", "a frame of 8 bytes", |m| {
            m.funcs[0].frame_bytes = 8
        }),
        ("no registers", "0 registers", |m| m.funcs[1].nregs = 0),
    ]
}

#[test]
fn a_well_formed_module_passes_both_sides() {
    let mem = DeviceMemory::new(1 << 20);
    let out = mem.alloc(16).unwrap();
    assert_eq!(out, DEVICE_VA_BASE);
    let m = hand_off(well_formed()).expect("lowering hands it out");
    assert_eq!(launch(m, &mem), Ok(()));
    let mut word = [0u8; 4];
    mem.read(out, &mut word).unwrap();
    assert_eq!(u32::from_le_bytes(word), 7);
}

#[test]
fn lowering_refuses_to_hand_out_a_broken_module() {
    for (what, says, breakage) in breakages() {
        let mut m = well_formed();
        breakage(&mut m);
        let e = hand_off(m).expect_err(what);
        assert_eq!(e.cu_code(), 218, "{what}");
        let e = e.to_string();
        assert!(
            e.contains("malformed module") && e.contains(says),
            "{what}: {e}"
        );
    }
}

#[test]
fn the_interpreter_refuses_to_run_a_broken_module() {
    let mem = DeviceMemory::new(1 << 20);
    mem.alloc(16).unwrap();
    for (what, says, breakage) in breakages() {
        let mut m = well_formed();
        breakage(&mut m);
        match launch(m, &mem) {
            Err(Fault::Failed(e)) => {
                assert!(
                    e.contains("malformed module") && e.contains(says),
                    "{what}: {e}"
                )
            }
            other => panic!("{what}: launched with {other:?}"),
        }
    }
}
