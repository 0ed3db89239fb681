//! The lowered, executable form of a PTX module, the boundary between
//! lowering and execution: typed operations over resolved register slots,
//! immediates and branch targets (well formed as `validate` defines it).

/// Marker for "no register".
pub(crate) const NONE: u32 = u32::MAX;
/// Largest register count of one function.
pub(crate) const MAX_REGS: u32 = 1 << 16;
/// Largest local frame of one function (bytes).
pub(crate) const MAX_FRAME_BYTES: u32 = 512 * 1024;
/// Generic address of function 0; function `i` lives at `FUNC_WIN + i`
/// (function pointers, indirect calls).
pub(crate) const FUNC_WIN: u64 = 0x1300_0000_0000;

/// An operand value source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Src {
    Reg(u32),
    Imm(u64),
    /// Local-space address: current frame base + offset.
    Frame(u32),
}

/// Scalar types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    U8,
    U16,
    U32,
    U64,
    S8,
    S16,
    S32,
    S64,
    B8,
    B16,
    B32,
    B64,
    B128,
    F16,
    F16x2,
    BF16,
    BF16x2,
    F32,
    F64,
    Pred,
}

impl Ty {
    pub(crate) fn parse(s: &str) -> Option<Ty> {
        Some(match s {
            "u8" => Ty::U8,
            "u16" => Ty::U16,
            "u32" => Ty::U32,
            "u64" => Ty::U64,
            "s8" => Ty::S8,
            "s16" => Ty::S16,
            "s32" => Ty::S32,
            "s64" => Ty::S64,
            "b8" => Ty::B8,
            "b16" => Ty::B16,
            "b32" => Ty::B32,
            "b64" => Ty::B64,
            "b128" => Ty::B128,
            "f16" => Ty::F16,
            "f16x2" => Ty::F16x2,
            "bf16" => Ty::BF16,
            "bf16x2" => Ty::BF16x2,
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            "pred" => Ty::Pred,
            _ => return None,
        })
    }
    pub(crate) fn bytes(self) -> u32 {
        match self {
            Ty::U8 | Ty::S8 | Ty::B8 | Ty::Pred => 1,
            Ty::U16 | Ty::S16 | Ty::B16 | Ty::F16 | Ty::BF16 => 2,
            Ty::U32 | Ty::S32 | Ty::B32 | Ty::F32 | Ty::F16x2 | Ty::BF16x2 => 4,
            Ty::U64 | Ty::S64 | Ty::B64 | Ty::F64 => 8,
            Ty::B128 => 16,
        }
    }
    pub(crate) fn bits(self) -> u32 {
        if self == Ty::Pred {
            1
        } else {
            self.bytes() * 8
        }
    }
    pub(crate) fn mask(self) -> u64 {
        match self.bytes() {
            1 if self == Ty::Pred => 1,
            1 => 0xff,
            2 => 0xffff,
            4 => 0xffff_ffff,
            _ => u64::MAX,
        }
    }
    pub(crate) fn signed(self) -> bool {
        matches!(self, Ty::S8 | Ty::S16 | Ty::S32 | Ty::S64)
    }
    pub(crate) fn is_float(self) -> bool {
        matches!(
            self,
            Ty::F16 | Ty::F16x2 | Ty::BF16 | Ty::BF16x2 | Ty::F32 | Ty::F64
        )
    }
}

/// Memory state spaces as the interpreter addresses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sp {
    Global,
    Shared,
    Local,
    /// Kernel parameter buffer.
    Param,
    Generic,
}

/// Rounding modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rnd {
    Default,
    Rn,
    Rz,
    Rm,
    Rp,
    Rni,
    Rzi,
    Rmi,
    Rpi,
}

/// The float modifiers of an arithmetic op or conversion: its rounding,
/// whether subnormals flush to zero (`.ftz`) and whether the result
/// saturates (`.sat`, `.satfinite`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FloatMode {
    pub rnd: Rnd,
    pub ftz: bool,
    pub sat: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntOp {
    Add,
    Sub,
    MulLo,
    MulHi,
    MulWide,
    Mul24Lo,
    Div,
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    Shr,
    AddSat,
    SubSat,
    Bmsk,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FOp {
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
    Copysign,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnOp {
    Not,
    Neg,
    Abs,
    Popc,
    Clz,
    Brev,
    Bfind,
    BfindShift,
    Cnot,
    FNeg,
    FAbs,
    Sqrt,
    Rsqrt,
    Rcp,
    Sin,
    Cos,
    Ex2,
    Lg2,
    Tanh,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TernOp {
    MadLo,
    MadHi,
    MadWide,
    Mad24Lo,
    Fma,
    Selp,
    Bfe,
    Sad,
    Slct,
    Shfl,
    Shfr,
    Dp4a,
    Dp2aLo,
    Dp2aHi,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Lo,
    Ls,
    Hi,
    Hs,
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BoolOp {
    None,
    And,
    Or,
    Xor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtomOp {
    Add,
    Min,
    Max,
    Inc,
    Dec,
    Exch,
    Cas,
    And,
    Or,
    Xor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShflMode {
    Up,
    Down,
    Bfly,
    Idx,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VoteMode {
    All,
    Any,
    Uni,
    Ballot,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReduxOp {
    Add,
    Min,
    Max,
    And,
    Or,
    Xor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SReg {
    Tid(u8),
    Ntid(u8),
    Ctaid(u8),
    Nctaid(u8),
    Laneid,
    Warpid,
    Nwarpid,
    Smid,
    Nsmid,
    Gridid,
    Clock,
    Clock64,
    Globaltimer,
    LanemaskEq,
    LanemaskLt,
    LanemaskLe,
    LanemaskGt,
    LanemaskGe,
    DynSmem,
    TotalSmem,
    /// `%reserved_smem_offset_begin`, `_end`, `_cap`, `_0`, `_1`: the
    /// block's reserved shared memory (sm_80+), in that order.
    ReservedSmem(u8),
    /// `%envreg<n>`: 1 and 2 hold the high and low half of a cooperative
    /// launch's grid workspace (0 otherwise); the others read 0.
    Envreg(u8),
    Zero,
}

/// Where a call argument comes from / a return value goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ArgLoc {
    /// Bytes of a `.param` variable in the caller frame.
    Frame { off: u32, size: u32 },
    /// A register or immediate value of `size` bytes.
    Val { src: Src, size: u32 },
}

/// The device runtime functions of dynamic parallelism the CPU device runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CdpFn {
    /// `(func, grid dim3, block dim3, shared) -> buffer`
    GetParameterBuffer,
    /// `(buffer, stream) -> error`
    LaunchDevice,
    GetLastError,
    PeekAtLastError,
    /// `(stream *, flags) -> error`
    StreamCreate,
    /// `(stream) -> error`
    StreamDestroy,
    /// `(void **, size) -> error`
    Malloc,
    /// `(ptr) -> error`
    Free,
    /// `(int *) -> error`
    GetDevice,
}

/// A call of a [`CdpFn`]: its arguments and where its result goes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CdpCall {
    pub func: CdpFn,
    pub args: Vec<ArgLoc>,
    pub ret: Option<ArgLoc>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CallInfo {
    pub func: u32,
    /// Register holding a function address for indirect calls.
    pub target: Option<Src>,
    pub args: Vec<ArgLoc>,
    pub rets: Vec<ArgLoc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CarryKind {
    Add,
    Sub,
    MadLo,
    MadHi,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BarRed {
    None,
    Popc,
    And,
    Or,
}

/// How a load or store is ordered with other threads' accesses: PTX's
/// `.volatile`, `.relaxed`, `.acquire` and `.release` (of any scope), or
/// none (`.weak`). The interpreter runs every access as a relaxed atomic
/// and a module with volatile accesses in lockstep warps; the compiler
/// makes the ordered ones atomic in global memory (a spin on another
/// block's flag re-reads it) and steps a warp's lanes together at
/// volatile shared ones (`jit::lockstep`). Both make an ordered vector of
/// global memory one atomic access (`whole_vector`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemOrder {
    Plain,
    Volatile,
    Relaxed,
    Acquire,
    Release,
}

/// A memory operand: a base value plus a byte offset in a state space.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Address {
    pub sp: Sp,
    pub base: Src,
    pub off: i64,
}

/// What an [`Op::Mbarrier`] does. The object's 8 bytes hold, in the
/// interpreter's layout, the arrivals pending in the current phase (bits
/// 0-31), the arrivals each phase expects (32-62) and the phase's parity
/// (63); a state is the object as an arrive found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MbarKind {
    /// `mbarrier.init [addr], count`.
    Init,
    /// `mbarrier.arrive` (`drop`: `arrive_drop`) `state, [addr]{, count}`:
    /// the phase completes when its pending arrivals reach zero.
    Arrive { drop: bool },
    /// `cp.async.mbarrier.arrive[.noinc] [addr]`: an arrival once the
    /// thread's earlier `cp.async` copies are done, which they are at once;
    /// without `.noinc` the pending count is raised by one first, so only
    /// `.noinc` counts as one of the phase's arrivals.
    CopiesArrive { noinc: bool },
    /// `mbarrier.test_wait` / `try_wait` `p, [addr], state` (`parity`: of
    /// the phase whose parity `a` is): whether that phase completed.
    Wait { parity: bool },
    /// `mbarrier.pending_count count, state`: the state's pending arrivals.
    PendingCount,
    /// `mbarrier.inval [addr]`.
    Inval,
}

/// The tile of a `wmma.load`/`wmma.store`: element type, layout, where it
/// starts and the elements between its rows (or columns).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WmmaTile {
    pub ety: Ty,
    pub row: bool,
    pub addr: Address,
    pub stride: Src,
}

/// The operands of a warp matrix multiply-add `d = a * b + c`: the input
/// element type, the accumulator types and each fragment's registers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MmaOperands {
    pub ab: Ty,
    pub cty: Ty,
    pub dty: Ty,
    /// `wmma`'s `.satfinite`: integer sums past the `s32` range clamp to it
    /// (else they wrap); an infinite float result is the type's largest
    /// finite value, a NaN +0.
    pub satfinite: bool,
    pub d: Vec<u32>,
    /// The `a`, `b` and `c` fragments.
    pub src: [Vec<Src>; 3],
}

/// One lowered operation.
///
/// An explicit one-byte tag: the interpreter's loop dispatches on it for
/// every instruction, and a tag folded into a field's spare values (which
/// the compiler may choose otherwise) costs several instructions a time.
/// Each variant is laid out in field order, so small fields come first.
#[derive(Debug, Clone, PartialEq)]
#[repr(u8)]
pub(crate) enum Op {
    Mov {
        d: u32,
        a: Src,
        mask: u64,
    },
    Int {
        op: IntOp,
        t: Ty,
        d: u32,
        a: Src,
        b: Src,
    },
    Float {
        op: FOp,
        t: Ty,
        d: u32,
        a: Src,
        b: Src,
        mode: FloatMode,
    },
    Un {
        op: UnOp,
        t: Ty,
        d: u32,
        a: Src,
        mode: FloatMode,
    },
    Tern {
        op: TernOp,
        t: Ty,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
        mode: FloatMode,
    },
    Bfi {
        t: Ty,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
        e: Src,
    },
    /// Clamp negative values of a float register (or each half of a pair) to +0.
    Relu {
        d: u32,
        t: Ty,
    },
    /// `prmt`; `mode` 0 = default selector, 1..=6 = f4e, b4e, rc8, ecl, ecr, rc16.
    Prmt {
        d: u32,
        a: Src,
        b: Src,
        c: Src,
        mode: u8,
    },
    Lop3 {
        d: u32,
        a: Src,
        b: Src,
        c: Src,
        lut: u8,
    },
    Setp {
        cmp: Cmp,
        t: Ty,
        d: u32,
        d2: u32,
        a: Src,
        b: Src,
        bop: BoolOp,
        c: Src,
        cneg: bool,
        ftz: bool,
    },
    /// `set.cmp.dtype`: writes 0xffffffff/1.0 or 0.
    Set {
        cmp: Cmp,
        t: Ty,
        dt: Ty,
        d: u32,
        a: Src,
        b: Src,
    },
    /// Boolean op on predicates: and/or/xor/not of two inputs.
    Testp {
        d: u32,
        a: Src,
        t: Ty,
        kind: u8,
    },
    Cvt {
        d: u32,
        a: Src,
        dt: Ty,
        st: Ty,
        mode: FloatMode,
    },
    /// Pack several registers into one (`mov.b64 %rd, {%r1, %r2}`).
    Pack {
        d: u32,
        parts: Vec<Src>,
        bits: u32,
    },
    /// Split one value into several registers.
    Unpack {
        ds: Vec<u32>,
        a: Src,
        bits: u32,
    },
    Ld {
        addr: Address,
        size: u32,
        n: u8,
        ds: [u32; 4],
        sext: bool,
        order: MemOrder,
    },
    St {
        n: u8,
        size: u32,
        vals: [Src; 4],
        addr: Address,
        order: MemOrder,
    },
    Atom {
        addr: Address,
        op: AtomOp,
        t: Ty,
        d: u32,
        b: Src,
        c: Src,
    },
    Cvta {
        d: u32,
        a: Src,
        sp: Sp,
        to_generic: bool,
    },
    Isspacep {
        d: u32,
        a: Src,
        sp: Sp,
    },
    Special {
        d: u32,
        r: SReg,
    },
    Bra {
        target: u32,
    },
    Call(Box<CallInfo>),
    Printf {
        fmt: ArgLoc,
        args: ArgLoc,
        ret: Option<ArgLoc>,
    },
    Ret,
    Exit,
    Trap(String),
    /// `__assertfail(message, file, line, function, char_size)`: the four
    /// first arguments, printed like the driver's assertion line before the
    /// launch fails with CUDA_ERROR_ASSERT.
    AssertFail(Box<[ArgLoc; 4]>),
    /// Device `malloc(size)`: a block of the context's heap, or NULL.
    Malloc {
        size: ArgLoc,
        ret: Option<ArgLoc>,
    },
    /// Device `free(ptr)`.
    Free {
        ptr: ArgLoc,
    },
    /// A device runtime call of dynamic parallelism (`__cudaCDP2*`); only
    /// the interpreter runs them (modules that make them stay off the compiler).
    Cdp(Box<CdpCall>),
    Bar {
        id: Src,
        count: Src,
        wait: bool,
        red: BarRed,
        d: u32,
        p: Src,
        pneg: bool,
    },
    WarpSync {
        mask: Src,
    },
    Shfl {
        mode: ShflMode,
        d: u32,
        dp: u32,
        a: Src,
        b: Src,
        c: Src,
        mask: Src,
    },
    Vote {
        mode: VoteMode,
        d: u32,
        a: Src,
        neg: bool,
        mask: Src,
    },
    Match {
        all: bool,
        d: u32,
        dp: u32,
        a: Src,
        wide: bool,
        mask: Src,
    },
    Redux {
        op: ReduxOp,
        signed: bool,
        d: u32,
        a: Src,
        mask: Src,
    },
    /// Integer add/sub/mad with the carry flag (`add.cc`, `addc`, `madc` …).
    Carry {
        kind: CarryKind,
        t: Ty,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
        cin: bool,
        cout: bool,
        cc: u32,
    },
    /// `cp.async` to shared memory, done synchronously.
    CpAsync {
        dst: Src,
        doff: i64,
        src: Src,
        soff: i64,
        size: u32,
        src_size: Src,
    },
    /// An `mbarrier` operation on the barrier object at `addr` (8 bytes of
    /// shared memory), `a` its count, state or phase parity; `d` the state,
    /// count or predicate it gives (`NONE` where it gives none).
    Mbarrier {
        kind: MbarKind,
        d: u32,
        addr: Address,
        a: Src,
    },
    /// `wmma.load.{a,b,c}` of a 16x16 tile (per thread; fragment layout is ours:
    /// lane l holds logical elements l*8 .. l*8+8).
    WmmaLoad {
        tile: WmmaTile,
        ds: Vec<u32>,
    },
    WmmaStore {
        tile: WmmaTile,
        vals: Vec<Src>,
    },
    /// `mma.sync` m16n8k16 / m16n8k8 with the PTX ISA fragment layout.
    Mma {
        k: u8,
        mma: Box<MmaOperands>,
    },
    /// `ldmatrix.m8n8.x{1,2,4}[.trans].b16`: a warp collective.
    Ldmatrix {
        num: u8,
        trans: bool,
        ds: Vec<u32>,
        addr: Address,
    },
    /// `wmma.mma` m16n16k16: a warp collective.
    WmmaMma {
        mma: Box<MmaOperands>,
    },
    Activemask {
        d: u32,
    },
    /// `nanosleep t`: the thread waits about `t` nanoseconds
    /// ([`crate::sleep::nanosleep`]), as a spin loop's back-off does on a GPU.
    Sleep {
        ns: Src,
    },
    /// The compiler's own (never lowered from PTX): the lanes of a warp
    /// step together here, before a volatile shared access, as the
    /// interpreter's lockstep warps do (`jit::lockstep`). A no-op.
    WarpStep,
    Nop,
}

/// An op with its guard predicate.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Inst {
    pub guard: u32,
    pub guard_neg: bool,
    pub op: Op,
    pub line: u32,
}

/// A lowered function.
#[derive(Debug, Clone)]
pub(crate) struct Func {
    pub name: String,
    pub code: Vec<Inst>,
    pub nregs: u32,
    pub frame_bytes: u32,
    /// Uses `ld.volatile`/`st.volatile`: warp-synchronous code that needs lockstep.
    pub uses_volatile: bool,
    /// Offsets/sizes of formal params and return params inside the frame (for `.func`).
    pub params: Vec<(u32, u32)>,
    pub rets: Vec<(u32, u32)>,
}

/// A lowered module: what the interpreter runs.
#[derive(Debug, Clone)]
pub(crate) struct Module {
    pub funcs: Vec<Func>,
    /// Index into `funcs` of each kernel, in the module's kernel order.
    pub kernels: Vec<u32>,
    /// Offset of dynamic shared memory inside a block's shared area (bytes).
    pub dyn_shared_base: u32,
}
