//! One kernel to Cranelift IR: a dispatch on the resume point, registers as
//! variables loaded where a thread resumes and stored where it stops, counts,
//! control flow, guards and `trap`; ops live in `emit_ops` and `emit_mem`.

use super::count::{count_add, count_add_imm, count_now};
use super::dirty::{add_writes, holds, stops};
use super::hoist::Hoist;
use super::inline::{CHECKS, UNCOUNTED};
use super::lane_defs::{add_imm, Lazy};
use super::narrow::{narrow_regs, uniform_wide_regs, wide_vector_regs};
use super::needed::needed_in;
use super::params::{hoist_params, hoist_specials, hoisted_loads, HoistedParams};
use super::plan::{polls, Plan};
use super::resident::{lane_slots, resident_regs};
use super::restart::group_start;
use super::runtime::{
    rt_checkpoint, rt_trap, Ctx, RET_EXIT, RET_FAULT, RET_PARTED, STOP_BARRIER, STOP_BITS,
    STOP_WARP, STOP_YIELD,
};
use super::strides::{fixed_shared_bases, lane_strides, wide_strides};
use crate::ir::{Func, Inst, Op, SReg, Sp, Src, NONE};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I32, I32X4, I64, I64X2, I8};
use cranelift_codegen::ir::{
    AbiParam, Block, BlockArg, InstBuilder, JumpTableData, MemFlagsData, Signature, StackSlotData,
    StackSlotKind, Type, Value,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, Variable};
use std::mem::offset_of;

/// The signature of a compiled kernel ([`super::runtime::KernelFn`]).
pub(super) fn kernel_signature(call_conv: CallConv) -> Signature {
    let mut sig = Signature::new(call_conv);
    for t in [I64, I64, I64, I32, I32, I64, I64, I64] {
        sig.params.push(AbiParam::new(t));
    }
    sig.returns.push(AbiParam::new(I32));
    sig
}

/// The state of translating one kernel.
pub(super) struct Translator<'a, 'f> {
    pub fb: FunctionBuilder<'f>,
    pub call_conv: CallConv,
    pub func: &'a Func,
    /// The kernel's ops, owned by the compiled kernel (helpers get pointers).
    pub ops: &'a [Op],
    pub plan: &'a Plan,
    /// Threads run in step by one call: 1 (the thread loop) or
    /// `lanes::LANES` (the lane kernel).
    pub width: u32,
    /// The running lane's registers (`regs` below; the other lanes' wait
    /// in `lane_regs`); its thread values come from lane 0's (`regs_at`,
    /// `local_at`, `lin_at`, `tid_at`).
    pub lane: usize,
    pub lane_regs: Vec<Vec<Variable>>,
    /// The end of the basic block being emitted.
    pub block_end: u32,
    pub regs: Vec<Variable>,
    /// In the lane kernel, each narrow register's vector of every lane's
    /// value (an I32X4; its `regs` entries unused).
    pub vregs: Vec<Option<Variable>>,
    /// In the lane kernel, each vector-wide register's two vectors of
    /// 64-bit lanes (I64X2: lanes 0 and 1, lanes 2 and 3; its `regs`
    /// entries unused).
    pub wregs: Vec<Option<[Variable; 2]>>,
    /// In the lane kernel, each strided register's lane 0 value (an I64)
    /// and the stride between its lanes (`strides::wide_strides`; its
    /// `regs` and `wregs` entries unused).
    pub sregs: Vec<Option<(Variable, u64)>>,
    /// The lane kernel's group's narrow registers between runs: a vector
    /// of 16 bytes for each register of `lane_slot` (`Ctx::lane_file`,
    /// group `first / LANES`).
    pub lane_file: Variable,
    pub lane_slot: Vec<u32>,
    /// Which registers live in the lane file between blocks (`jit::resident`).
    pub resident: Vec<bool>,
    /// Whether the running thread's run began at its start (an I8; only
    /// where `Plan::fresh_start`): its stops store what it wrote since.
    pub fresh: Variable,
    pub ctx: Value,
    /// The thread loop's `%tid` (its body's values: the lane kernel loads
    /// its lanes' through `tid_ptr`).
    pub tid: [Value; 3],
    pub blocks: Vec<Block>,
    /// The thread running (an I32; lane 0's, its `%tid`'s place too),
    /// where its stop code goes, and the block that goes on with the next
    /// thread of the range.
    pub thread: Variable,
    pub codes: Value,
    pub next_thread: Block,
    /// Where the loop goes on with the next group without the dispatch
    /// ([`super::direct`]).
    pub direct: Direct,
    pub exit_block: Block,
    pub fault_block: Block,
    /// Instructions of the current basic block after the one being
    /// emitted: counted on entry, taken back when that one faults.
    pub excess: i64,
    /// The block's shared memory (host base, bytes), loaded at the start of
    /// a basic block with shared accesses (it dominates them all).
    pub shared_here: Option<(Value, Value)>,
    /// The global-cache site of the access being emitted, and the sites so far.
    pub site: u32,
    pub sites: u32,
    /// The site every access takes while set (a lane kernel's lanes of one
    /// access share their vector access's site).
    pub site_pin: Option<u32>,
    /// Whether the access being emitted is ordered (volatile, relaxed,
    /// acquire, release) in global or generic memory: its fast path is an
    /// atomic load or store, which no code motion merges or drops.
    pub atomic: bool,
    /// A 16-byte stack slot the load helpers write into.
    pub slot: cranelift_codegen::ir::StackSlot,
    /// The float each value of float-op result bits came from (register
    /// bits made by `canon_bits`), so a float op reading them skips the
    /// moves between integer and float registers.
    pub floats: std::collections::HashMap<(Value, bool), Value>,
    /// The shared accesses the running copy of a basic block runs without
    /// checks (its block's check passed), and the pc being emitted.
    pub unchecked: Vec<u32>,
    /// In the lane kernel's copy of a block whose shared accesses its check
    /// covered: how the lanes' addresses from each base lie ([`LaneBase`]).
    pub lane_bases: Vec<LaneBase>,
    /// The low ends (as I64) a block's shared check made: (base, offset, lane).
    pub span_lows: Vec<(Src, i64, usize, Value)>,
    /// Vector constants made so far in the basic block being emitted.
    pub vconsts: Vec<(u32, Value)>,
    /// Narrow registers that an `f32` vector op of the straight run being
    /// emitted wrote, with its result before NaNs were made canonical: a
    /// later `f32` op reads that (NaN in, NaN out, made canonical at its
    /// end), keeping the canonicalisation off chains of dependent ops.
    pub vraw: Vec<(u32, Value)>,
    /// Narrow registers of the straight run defined late ([`Lazy`]).
    pub lazy: Vec<(u32, Lazy)>,
    /// Predicate registers that a vector `setp` (or `and`, `or`, `xor` of
    /// such) of the straight run being emitted wrote, with its lanes as
    /// masks (all ones where it holds; where the flag is set, the mask of
    /// its negation: a signed `ge` or `le`, or `ne`, is one compare so):
    /// a guard reads the mask's top bits at once, not the 0/1 lanes.
    pub vmasks: Vec<(u32, Value, bool)>,
    pub pc_now: u32,
    /// The global accesses one check a block covers (`jit::hoist`; a lane
    /// kernel's copy run where it passed), and the `(pc, site)` of each
    /// emitted unchecked.
    pub hoist: Option<&'a Hoist>,
    pub hoisted: Vec<(u32, u32)>,
    /// `Ctx::hoisted`, loaded once a call.
    pub hoist_deltas: Vec<Value>,
    /// The parameters loaded before the thread loop.
    pub params: HoistedParams,
    /// What the straight run being emitted knows of its vector-wide
    /// registers' lanes (`emit_wide`), and of registers whose lanes it
    /// found consecutive words or not (an I8 condition).
    pub wfacts: Vec<(u32, WideFact)>,
    pub wconsecutive: Vec<(u32, Value)>,
    /// The vector-wide registers that hold one value in every lane all
    /// along (`narrow::uniform_wide_regs`).
    pub uniform: Vec<bool>,
    /// The lane kernel's `%ntid`, `%ctaid` and `%nctaid` components the
    /// kernel reads, each in every lane (made before the group loop).
    pub specials: Vec<(SReg, Value)>,
    /// Products of two of `specials` (made once a call: vector add's
    /// `%ctaid.x * %ntid.x`), for an op whose operands are those values.
    pub products: Vec<(Value, Value, Value)>,
    /// The stride between a group's lanes each narrow register holds all
    /// along where `x_aligned` (`strides::lane_strides`), and that
    /// condition (the lane kernel's only: true, the launch sees to it).
    pub strides: Vec<Option<u32>>,
    pub x_aligned: Option<Value>,
    /// Whether a backward branch past the block's next check checks its
    /// budgets in place (`runtime::rt_checkpoint`) and goes on, rather
    /// than yield to the block's other threads: the lane kernel's, where
    /// no thread spins on what another writes (it has no ordered loads;
    /// its yields came at other counts than the interpreter's anyway, and
    /// each cost the launch a round over the block's threads).
    pub checks_in_place: bool,
}

/// What is known of a vector-wide register's lanes since its last write in
/// the straight run being emitted.
#[derive(Clone, Copy)]
pub(super) enum WideFact {
    /// It is a uniform value plus register `root` as it was then (its
    /// lanes lie as `root`'s: consecutive words exactly when `root`'s are).
    Offset { root: u32 },
}

/// The lanes' shared addresses from one base register of a basic block
/// (which the block does not change), its accesses covered by the block's
/// check: the host pointer of the first lane's lowest access, and whether
/// the lanes' addresses are consecutive words, and all the same.
pub(super) struct LaneBase {
    pub base: Src,
    pub lo: i64,
    pub first: Value,
    pub consecutive: Value,
    pub equal: Value,
    /// In a copy of the block made for one way the lanes lie: all the
    /// same (`Some(true)`) or consecutive (`Some(false)`); `None`: either.
    pub mode: Option<bool>,
    /// Whether `mode` is known before the run (the base register's
    /// stride, where `x_aligned`): every copy of the block has it.
    pub fixed: bool,
}

/// The `%tid` of thread `thread` (an I32) at `tids + 16 thread`, loaded
/// where `load_tid` (else `thread` three times: the lane kernel loads its
/// lanes' where read).
fn thread_tid(
    fb: &mut FunctionBuilder<'_>,
    thread: Value,
    tids: Value,
    load_tid: bool,
) -> [Value; 3] {
    let t64 = fb.ins().uextend(I64, thread);
    let tid_off = fb.ins().ishl_imm_u(t64, 4);
    let tid_at = fb.ins().iadd(tids, tid_off);
    let fixed = MemFlagsData::trusted().with_readonly();
    [0, 4, 8].map(|o| match load_tid {
        true => fb.ins().load(I32, fixed, tid_at, o),
        false => thread,
    })
}

/// A group's values (the thread loop's: a thread's) as variables, set where
/// the loop enters it: its first thread (an I32) and lane file (its
/// register file, local memory and `%tid`s are made from the thread where
/// read: `Translator::group_ptr`).
#[derive(Clone, Copy)]
pub(super) struct GroupVars {
    pub thread: Variable,
    pub lane_file: Variable,
}

/// What a lane kernel's stop needs to go on with the next group at its
/// run's resume point without the loop's dispatch ([`super::direct`]).
pub(super) struct Direct {
    /// The range's end, the loop's head (its next thread the parameter)
    /// and the block returning the end.
    pub end: Value,
    pub head: Block,
    pub done: Block,
    pub resume_ids: Value,
    pub bases: [Value; 3],
    /// Each resume point's block, and the one entering a group there (made
    /// where a stop first goes to it; a group's first thread its parameter).
    pub resume_blocks: Vec<Block>,
    pub entries: Vec<Option<Block>>,
    /// The resume points whose runs reach the stop being emitted, and
    /// the stops each resume point's runs reach (found at the first stop).
    pub origins: Vec<u32>,
    pub reached: Option<Vec<Vec<u32>>>,
}

/// Enters group (or thread) `thread` (an I32): sets `vars` to its values;
/// its `%tid` (the thread loop's) and `thread` as an I64.
#[allow(clippy::too_many_arguments)]
pub(super) fn enter_group(
    fb: &mut FunctionBuilder<'_>,
    func: &Func,
    plan: &Plan,
    ctx: Value,
    width: u32,
    thread: Value,
    bases: [Value; 3],
    vars: GroupVars,
) -> ([Value; 3], Value) {
    let tid = thread_tid(fb, thread, bases[2], width == 1);
    let t64 = fb.ins().uextend(I64, thread);
    // (a lane kernel whose registers never wait in the lane file
    // loads no pointer to it: the load would stay, unused)
    let lane_file = if width == 1 || lane_slots(func, plan).1 == 0 {
        bases[0]
    } else {
        let file = fb
            .ins()
            .load(I64, MemFlagsData::trusted(), ctx, ctx_off!(lane_file));
        // (the group's first thread is a multiple of `width`: its
        // group's slots start `16 / width` bytes a slot on for each)
        let off = fb
            .ins()
            .imul_imm_s(t64, lane_slots(func, plan).1 as i64 * 16 / width as i64);
        fb.ins().iadd(file, off)
    };
    fb.def_var(vars.thread, thread);
    fb.def_var(vars.lane_file, lane_file);
    (tid, t64)
}

/// Flags of the lane file's 16-byte accesses (lanes in memory order).
pub(super) fn lanes_flags() -> MemFlagsData {
    MemFlagsData::trusted().with_endianness(cranelift_codegen::ir::Endianness::Little)
}

/// A field of [`Ctx`] at its offset.
macro_rules! ctx_off {
    ($field:ident) => {
        offset_of!(Ctx<'static>, $field) as i32
    };
}
pub(super) use ctx_off;

impl<'a, 'f> Translator<'a, 'f> {
    /// Builds the whole function into `fb`'s function, the thread loop
    /// (`width` 1) or the lane kernel (`width` threads in step from
    /// `first`, all at one resume point); returns its number of
    /// global-cache sites, the parameter bytes its hoisted loads read and
    /// whether it needs each group's lanes aligned in `%tid.x` (`%ntid.x` a
    /// multiple of its width: its strided registers follow narrow strides).
    pub(super) fn translate(
        mut fb: FunctionBuilder<'f>,
        target: TargetFrontendConfig,
        func: &'a Func,
        ops: &'a [Op],
        plan: &'a Plan,
        width: u32,
        hoist: Option<&'a Hoist>,
    ) -> (u32, u64, bool, Vec<(u32, u32)>) {
        let entry = fb.create_block();
        fb.append_block_params_for_function_params(entry);
        fb.switch_to_block(entry);
        let p = fb.block_params(entry).to_vec();
        let (ctx, regs_base, local_base, first, end) = (p[0], p[1], p[2], p[3], p[4]);
        let (resume_ids, tids, codes) = (p[5], p[6], p[7]);
        let mut lane_regs: Vec<Vec<Variable>> = (0..width)
            .map(|_| (0..func.nregs).map(|_| fb.declare_var(I64)).collect())
            .collect();
        let regs = std::mem::take(&mut lane_regs[0]);
        let narrow = narrow_regs(func);
        let mut uniform = vec![false; func.nregs as usize];
        let live_at_start = plan.live_in.first().map_or(&[][..], |l| l);
        let strides = lane_strides(func, live_at_start);
        let n = func.nregs as usize;
        let (vregs, wregs, sregs) = if width == 1 {
            (vec![None; n], vec![None; n], vec![None; n])
        } else {
            let wide = wide_vector_regs(func, &narrow);
            uniform = uniform_wide_regs(func, &wide);
            let narrow_strides: Vec<Option<u32>> = (0..func.nregs as usize)
                .map(|r| strides[r].filter(|_| narrow[r]))
                .collect();
            let hoisted = hoisted_loads(ops);
            let strided = wide_strides(func, &narrow_strides, &wide, &hoisted, live_at_start);
            let vregs: Vec<Option<Variable>> = narrow
                .iter()
                .map(|&n| n.then(|| fb.declare_var(I32X4)))
                .collect();
            let wregs: Vec<Option<[Variable; 2]>> = (0..func.nregs as usize)
                .map(|r| {
                    (wide[r] && strided[r].is_none())
                        .then(|| [fb.declare_var(I64X2), fb.declare_var(I64X2)])
                })
                .collect();
            let sregs: Vec<Option<(Variable, u64)>> = strided
                .iter()
                .map(|s| s.map(|s| (fb.declare_var(I64), s)))
                .collect();
            (vregs, wregs, sregs)
        };
        // (strided registers other than the uniform ones, and shared bases'
        // fixed ways, follow narrow strides, which hold only where the
        // group's lanes are aligned: the lane kernel runs only where they are)
        let needs_aligned = (0..n).any(|r| sregs[r].is_some() && !uniform[r])
            || (width > 1 && fixed_shared_bases(ops, &strides, &narrow));
        let fresh = fb.declare_var(I8);
        // (a hoisted copy whose every store is hoisted and final logs none)
        let logs = !hoist.is_some_and(|h| h.unlogged(ops, &plan.final_stores));
        group_start(&mut fb, ctx, width > 1 && plan.restart, logs);
        let params = hoist_params(&mut fb, ctx, ops, width > 1);
        let (specials, products) = hoist_specials(&mut fb, ctx, ops, width > 1);
        let fixed = MemFlagsData::trusted().with_readonly();
        let hoist_deltas = (0..hoist.map_or(0, |h| h.sites.len()))
            .map(|k| {
                fb.ins()
                    .load(I64, fixed, ctx, ctx_off!(hoisted) + 8 * k as i32)
            })
            .collect();
        // each group's lanes are consecutive in `%tid.x` and share `%tid.y`
        // and `%tid.z` wherever the lane kernel runs (`needs_aligned`): the
        // lanes of registers with a known stride lie as `strides` says
        let x_aligned = (width > 1).then(|| fb.ins().iconst(I8, 1));
        // the loop over the range's threads: each runs from its resume point
        // to its next stop, its registers and local memory at fixed strides
        // (the lane kernel's loop goes group by group, `width` threads a step)
        let next_thread = fb.create_block();
        let bases = [regs_base, local_base, tids];
        let head = fb.create_block();
        let first_thread = fb.append_block_param(head, I32);
        let body = fb.create_block();
        let done = fb.create_block();
        // the lane kernel takes its hoisted parameters as loaded: where the
        // launch's fall short, its first group gives up before the loop
        // (the thread loop faults as it should)
        let short = match (params.all_in, width > 1) {
            (Some(all_in), true) => {
                let short = fb.create_block();
                fb.ins()
                    .brif(all_in, head, &[BlockArg::Value(first)], short, &[]);
                Some(short)
            }
            _ => {
                fb.ins().jump(head, &[BlockArg::Value(first)]);
                None
            }
        };
        fb.switch_to_block(head);
        let more = fb.ins().icmp(IntCC::UnsignedLessThan, first_thread, end);
        fb.ins().brif(more, body, &[], done, &[]);
        fb.switch_to_block(done);
        fb.ins().return_(&[end]);
        // (the group running: the loop's head's, or the one a stop went
        // on with at its resume point, `jit::direct`)
        let vars = GroupVars {
            thread: fb.declare_var(I32),
            lane_file: fb.declare_var(I64),
        };
        fb.switch_to_block(next_thread);
        let running = fb.use_var(vars.thread);
        let following = fb.ins().iadd_imm_s(running, width as i64);
        fb.ins().jump(head, &[BlockArg::Value(following)]);
        fb.switch_to_block(body);
        group_start(&mut fb, ctx, width > 1 && plan.restart, logs);
        // (the lane kernel works out each lane's from lane 0's where used)
        let (tid, t64) = enter_group(&mut fb, func, plan, ctx, width, first_thread, bases, vars);
        // (a kernel with one resume point, its start, goes there at once)
        let resume = (plan.resumes.len() > 1).then(|| {
            let id_off = fb.ins().ishl_imm_u(t64, 2);
            let id_at = fb.ins().iadd(resume_ids, id_off);
            fb.ins().load(I32, MemFlagsData::trusted(), id_at, 0)
        });
        let blocks: Vec<Block> = plan.starts.iter().map(|_| fb.create_block()).collect();
        let exit_block = fb.create_block();
        let fault_block = fb.create_block();
        let slot =
            fb.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, 16, 3));
        let call_conv = target.default_call_conv;
        // (jit::resident: narrow and strided registers, the lane kernel's)
        let kept: Vec<bool> = (0..n).map(|r| narrow[r] || sregs[r].is_some()).collect();
        let resident = match width {
            1 => vec![false; n],
            _ => resident_regs(func, plan, &kept, &lane_slots(func, plan).0),
        };
        let mut t = Translator {
            fb,
            call_conv,
            func,
            ops,
            plan,
            width,
            lane: 0,
            lane_regs,
            block_end: 0,
            regs,
            vregs,
            wregs,
            sregs,
            lane_file: vars.lane_file,
            lane_slot: lane_slots(func, plan).0,
            resident,
            fresh,
            ctx,
            tid,
            blocks,
            thread: vars.thread,
            codes,
            next_thread,
            direct: Direct {
                end,
                head,
                done,
                resume_ids,
                bases,
                resume_blocks: Vec::new(),
                entries: vec![None; plan.resumes.len()],
                origins: Vec::new(),
                reached: None,
            },
            exit_block,
            fault_block,
            excess: 0,
            shared_here: None,
            site: u32::MAX,
            sites: 0,
            site_pin: None,
            atomic: false,
            slot,
            floats: std::collections::HashMap::new(),
            unchecked: Vec::new(),
            lane_bases: Vec::new(),
            span_lows: Vec::new(),
            vconsts: Vec::new(),
            vraw: Vec::new(),
            lazy: Vec::new(),
            vmasks: Vec::new(),
            pc_now: 0,
            hoist,
            hoisted: Vec::new(),
            hoist_deltas,
            params,
            wfacts: Vec::new(),
            wconsecutive: Vec::new(),
            uniform,
            specials,
            products,
            strides,
            x_aligned,
            checks_in_place: width > 1 && !polls(ops),
        };
        // dispatch on the resume point: load its live registers, go on there
        let resume_blocks: Vec<Block> = plan.resumes.iter().map(|_| t.fb.create_block()).collect();
        t.direct.resume_blocks = resume_blocks.clone();
        let calls: Vec<_> = resume_blocks
            .iter()
            .map(|&b| t.fb.func.dfg.block_call(b, &[]))
            .collect();
        let default = t.fb.func.dfg.block_call(exit_block, &[]);
        let table = t.fb.create_jump_table(JumpTableData::new(default, &calls));
        match resume {
            Some(resume) => {
                // (a lane kernel's groups resume after stops alone: a compare
                // for each such point, then the table, 8 instructions)
                for (k, &pc) in plan.resumes.iter().enumerate() {
                    if width > 1 && t.checks_in_place && pc > 0 && stops(&ops[pc as usize - 1]) {
                        let is = t.fb.ins().icmp_imm_u(IntCC::Equal, resume, k as i64);
                        let next = t.fb.create_block();
                        t.fb.ins().brif(is, resume_blocks[k], &[], next, &[]);
                        t.fb.switch_to_block(next);
                    }
                }
                t.fb.ins().br_table(resume, table);
            }
            None => {
                t.fb.ins().jump(resume_blocks[0], &[]);
            }
        }
        let needed = needed_in(func, plan);
        for (k, &rb) in resume_blocks.iter().enumerate() {
            t.fb.switch_to_block(rb);
            let lane_file = t.fb.use_var(t.lane_file);
            let pc = plan.resumes[k];
            let b = plan.block_at(pc);
            let start = pc == 0 && plan.fresh_start;
            let began = t.fb.ins().iconst(I8, start as i64);
            t.fb.def_var(t.fresh, began);
            // the registers live here, and the shuffled ones, which every
            // stop and exit stores again
            let mut loaded = plan.live_in[b].clone();
            // (of those, the ones the run may read before it writes them:
            // the others' values are never used; a thread's start sets
            // them all to 0, as its stops store every one it reaches live)
            loaded.retain(|&r| start || holds(&needed[b], r));
            loaded.extend(&plan.shuffled);
            loaded.sort_unstable();
            loaded.dedup();
            for &r in &loaded {
                if let Some(v) = t.vregs[r as usize] {
                    // (a resident register waits in the lane file: 0 at a start)
                    let resident = t.resident[r as usize];
                    if resident && !start {
                        continue;
                    }
                    let x = if pc == 0 && plan.fresh_start {
                        let zero = t.fb.ins().iconst(I32, 0);
                        t.fb.ins().splat(I32X4, zero)
                    } else {
                        let slot = t.slot_at(r);
                        t.fb.ins().load(I32X4, lanes_flags(), lane_file, slot)
                    };
                    match resident {
                        true => t.store_narrow(r, x),
                        false => t.fb.def_var(v, x),
                    }
                }
                if let Some((var, _)) = t.sregs[r as usize] {
                    let resident = t.resident[r as usize];
                    if resident && !start {
                        continue;
                    }
                    let x = if pc == 0 && plan.fresh_start {
                        t.fb.ins().iconst(I64, 0)
                    } else {
                        let slot = t.slot_at(r);
                        t.fb.ins()
                            .load(I64, MemFlagsData::trusted(), lane_file, slot)
                    };
                    match resident {
                        true => t.store_strided(r, x),
                        false => t.fb.def_var(var, x),
                    }
                }
                if let (None, Some(halves)) = (t.vregs[r as usize], t.wregs[r as usize]) {
                    let slot = t.slot_at(r);
                    for (k, half) in halves.into_iter().enumerate() {
                        let x = if pc == 0 && plan.fresh_start {
                            let zero = t.fb.ins().iconst(I64, 0);
                            t.fb.ins().splat(I64X2, zero)
                        } else {
                            let at = slot + 16 * k as i32;
                            t.fb.ins().load(I64X2, lanes_flags(), lane_file, at)
                        };
                        t.fb.def_var(half, x);
                    }
                }
            }
            loaded.retain(|&r| {
                t.vregs[r as usize].is_none()
                    && t.wregs[r as usize].is_none()
                    && t.sregs[r as usize].is_none()
            });
            for &r in &loaded {
                // (each lane's value goes in below)
                t.clear_vector(r);
            }
            for lane in 0..width as usize {
                t.set_lane(lane);
                let rp = t.regs_at();
                for &r in &loaded {
                    // a thread's start reads registers as 0 (the worker's
                    // file holds the block before's)
                    let v = if pc == 0 && plan.fresh_start {
                        t.fb.ins().iconst(I64, 0)
                    } else {
                        t.fb.ins()
                            .load(I64, MemFlagsData::trusted(), rp, (r * 8) as i32)
                    };
                    t.set(r, v);
                }
            }
            t.fb.ins().jump(t.blocks[b], &[]);
        }
        for b in 0..plan.starts.len() {
            t.basic_block(b);
        }
        t.fb.switch_to_block(exit_block);
        // an exited lane's shuffled values stay readable, as the interpreter's
        for lane in 0..width as usize {
            t.set_lane(lane);
            let rp = t.regs_at();
            for &r in &plan.shuffled {
                let v = t.src(Src::Reg(r));
                t.fb.ins()
                    .store(MemFlagsData::trusted(), v, rp, (r * 8) as i32);
            }
        }
        t.finish_all(RET_EXIT);
        t.fb.switch_to_block(fault_block);
        let excess = t.fb.append_block_param(fault_block, I64);
        let back = t.fb.ins().ineg(excess);
        count_add(&mut t.fb, ctx, back);
        t.finish_all(RET_FAULT);
        t.fill_entries();
        if let Some(short) = short {
            t.fb.switch_to_block(short);
            t.fb.set_cold_block(short);
            t.fb.def_var(t.thread, first);
            t.finish_all(RET_PARTED);
        }
        t.fb.seal_all_blocks();
        let facts = (t.sites, t.params.extent, needs_aligned, t.hoisted);
        t.fb.finalize(target);
        facts
    }

    /// Ends the running thread with stop code `code`: a barrier, a warp
    /// collective or an exit goes on with the next thread of the range; a
    /// yield or a fault returns (the instruction count stored), the
    /// threads up to this one done.
    pub(super) fn finish_with(&mut self, code: u32) {
        let c = self.fb.ins().iconst(I32, code as i64);
        let thread = self.fb.use_var(self.thread);
        let t64 = self.fb.ins().uextend(I64, thread);
        let off = self.fb.ins().ishl_imm_u(t64, 2);
        let at = self.fb.ins().iadd(self.codes, off);
        self.fb.ins().store(MemFlagsData::trusted(), c, at, 0);
        self.note_code(code);
        let returns = code == RET_FAULT || code & ((1 << STOP_BITS) - 1) == STOP_YIELD;
        if returns {
            let done = add_imm(&mut self.fb, thread, 1);
            self.fb.ins().return_(&[done]);
        } else {
            self.fb.ins().jump(self.next_thread, &[]);
        }
    }

    /// Adds stop code `code` to the call's `Ctx::codes_and` and
    /// `Ctx::codes_or` (in place: an `and` and an `or` on memory).
    pub(super) fn note_code(&mut self, code: u32) {
        let flags = MemFlagsData::trusted();
        let (ctx, and_at, or_at) = (self.ctx, ctx_off!(codes_and), ctx_off!(codes_or));
        // (an exit's code, all ones, leaves the AND as it is)
        if code != u32::MAX {
            let all = self.fb.ins().load(I32, flags, ctx, and_at);
            let all = self.fb.ins().band_imm_u(all, code as i64);
            self.fb.ins().store(flags, all, ctx, and_at);
        }
        let any = self.fb.ins().load(I32, flags, ctx, or_at);
        let any = self.fb.ins().bor_imm_u(any, code as i64);
        self.fb.ins().store(flags, any, ctx, or_at);
    }

    /// Stops the thread to resume at `pc` later: stores the registers live
    /// there (and `also`, what a warp collective reads) and returns its
    /// resume id with why it stopped (`STOP_*`) in the low bits.
    pub(super) fn stop_at(&mut self, pc: u32, why: u32, also: &[u32]) {
        self.store_live(pc, also);
        let id = self.plan.resume_id(pc);
        self.direct.origins = self.origins(self.pc_now);
        self.finish_all(id << STOP_BITS | why);
        self.direct.origins.clear();
    }

    /// Stores each lane's registers live at `pc` (and `also`, and the
    /// shuffled ones) that it may have changed since it resumed: narrow
    /// ones of the lane kernel to its lane file (those in `also` to the
    /// threads' files too, for the launch to read).
    fn store_live(&mut self, pc: u32, also: &[u32]) {
        let b = self.plan.block_at(pc);
        let mut stored: Vec<u32> = self.plan.live_in[b].clone();
        stored.extend(also.iter().chain(&self.plan.shuffled));
        stored.sort_unstable();
        stored.dedup();
        // of those, the ones the thread may have changed since it resumed:
        // a run that began at a resume point changed fewer than one that
        // began at the thread's start (`Plan::dirty_resumed`)
        let at = self.pc_now;
        let k = self
            .plan
            .starts
            .partition_point(|&s| s <= at)
            .saturating_sub(1);
        let mut dirty = self.plan.dirty_in[k].clone();
        add_writes(self.func, self.plan.starts[k], at, &mut dirty);
        let mut resumed = self.plan.dirty_resumed[k]
            .clone()
            .unwrap_or_else(|| dirty.clone());
        add_writes(self.func, self.plan.starts[k], at, &mut resumed);
        stored.retain(|&r| holds(&dirty, r) && (!self.resident[r as usize] || also.contains(&r)));
        let (always, at_start): (Vec<u32>, Vec<u32>) =
            stored.into_iter().partition(|&r| holds(&resumed, r));
        self.store_regs(&always, also);
        if !at_start.is_empty() {
            let (store, join) = (self.fb.create_block(), self.fb.create_block());
            let fresh = self.fb.use_var(self.fresh);
            self.fb.ins().brif(fresh, store, &[], join, &[]);
            self.fb.switch_to_block(store);
            self.fb.set_cold_block(store);
            self.store_regs(&at_start, also);
            self.fb.ins().jump(join, &[]);
            self.fb.switch_to_block(join);
        }
    }

    /// Stores registers `stored` of each lane: narrow ones of the lane
    /// kernel to its lane file (those in `also` to the threads' files too).
    fn store_regs(&mut self, stored: &[u32], also: &[u32]) {
        let mut to_threads = Vec::new();
        let lane_file = self.fb.use_var(self.lane_file);
        for &r in stored {
            if let Some((var, _)) = self.sregs[r as usize] {
                let slot = self.slot_at(r);
                let v = self.fb.use_var(var);
                self.fb
                    .ins()
                    .store(MemFlagsData::trusted(), v, lane_file, slot);
                if also.contains(&r) {
                    to_threads.push(r);
                }
                continue;
            }
            match (self.vregs[r as usize], self.wregs[r as usize]) {
                (Some(var), _) => {
                    let slot = self.slot_at(r);
                    let v = self.fb.use_var(var);
                    self.fb.ins().store(lanes_flags(), v, lane_file, slot);
                    if also.contains(&r) {
                        to_threads.push(r);
                    }
                }
                (None, Some(halves)) => {
                    let slot = self.slot_at(r);
                    for (k, half) in halves.into_iter().enumerate() {
                        let v = self.fb.use_var(half);
                        let at = slot + 16 * k as i32;
                        self.fb.ins().store(lanes_flags(), v, lane_file, at);
                    }
                    if also.contains(&r) {
                        to_threads.push(r);
                    }
                }
                (None, None) => to_threads.push(r),
            }
        }
        for lane in 0..self.width as usize {
            self.set_lane(lane);
            let rp = self.regs_at();
            for &r in &to_threads {
                let v = self.src(Src::Reg(r));
                self.fb
                    .ins()
                    .store(MemFlagsData::trusted(), v, rp, (r * 8) as i32);
            }
        }
    }

    fn basic_block(&mut self, b: usize) {
        self.fb.switch_to_block(self.blocks[b]);
        let start = self.plan.starts[b];
        let end = self
            .plan
            .starts
            .get(b + 1)
            .copied()
            .unwrap_or(self.func.code.len() as u32);
        self.load_resident(start, end);
        let here = self.counted(start, end) as i64 * self.width as i64;
        count_add_imm(&mut self.fb, self.ctx, here);
        let shared_accesses = (start..end)
            .filter(|&pc| match self.ops[pc as usize] {
                Op::Ld { addr, .. } | Op::St { addr, .. } => addr.sp == Sp::Shared,
                _ => false,
            })
            .count();
        // (the lane kernel's one check lets even one access run as a vector)
        let checked_once = shared_accesses > 1 || (self.width > 1 && shared_accesses > 0);
        self.shared_here = checked_once.then(|| {
            let fixed = MemFlagsData::trusted().with_readonly();
            let bytes = self
                .fb
                .ins()
                .load(I64, fixed, self.ctx, ctx_off!(shared_bytes));
            let base = self.fb.ins().load(I64, fixed, self.ctx, ctx_off!(shared));
            (base, bytes)
        });
        // where one check covers the block's shared accesses, a copy of it
        // runs them unchecked; the other copy checks each as it comes
        // (and, in the lane kernel, where the lanes' addresses from each
        // base are consecutive words or all the same)
        if let Some((pcs, mut ok)) = self.lanes_shared_check(start, end) {
            let fast = self.fb.create_block();
            let checked = self.fb.create_block();
            if self.width > 1 {
                self.lane_bases = self.shared_lane_bases(start, end);
                ok.extend(self.lanes_regular());
            }
            self.branch_all(ok, fast, checked);
            self.unchecked = pcs;
            // a copy for each way the lanes of (at most two) bases whose
            // way is not known before the run lie
            let open = self.lane_bases.iter().filter(|b| !b.fixed).count();
            let ways = match open {
                n @ 1..=2 => 1u32 << n,
                _ => 1,
            };
            for way in 0..ways {
                if ways > 1 {
                    let this = self.lanes_way(way);
                    let copy = self.fb.create_block();
                    let other = self.fb.create_block();
                    self.fb.ins().brif(this, copy, &[], other, &[]);
                    self.fb.switch_to_block(copy);
                    self.emit_range(b, start, end);
                    self.fb.switch_to_block(other);
                    continue;
                }
                self.emit_range(b, start, end);
            }
            if ways > 1 {
                // (every way was tried: unreachable)
                self.fb.ins().jump(checked, &[]);
            }
            self.unchecked.clear();
            self.lane_bases.clear();
            self.fb.switch_to_block(checked);
        }
        self.emit_range(b, start, end);
    }

    /// Emits `start..end`, basic block `b`'s instructions, and its fall
    /// through to the next.
    fn emit_range(&mut self, b: usize, start: u32, end: u32) {
        self.block_end = end;
        self.vconsts.clear();
        self.vraw.clear();
        self.lazy.clear();
        self.vmasks.clear();
        self.wfacts.clear();
        self.wconsecutive.clear();
        for pc in start..end {
            self.excess = self.counted(pc + 1, end) as i64;
            self.pc_now = pc;
            let more = if self.width == 1 {
                self.inst(pc)
            } else {
                self.lane_inst(pc)
            };
            if !more {
                return;
            }
        }
        self.settle_lazy(end);
        self.store_resident(start, end);
        match self.blocks.get(b + 1) {
            Some(&next) => {
                self.fb.ins().jump(next, &[]);
            }
            None => {
                self.fb.ins().jump(self.exit_block, &[]);
            }
        }
    }

    /// Instructions of `start..end` the interpreter counts (not those the
    /// inliner added).
    pub(super) fn counted(&self, start: u32, end: u32) -> u32 {
        self.func.code[start as usize..end as usize]
            .iter()
            .filter(|i| i.line & UNCOUNTED == 0)
            .count() as u32
    }

    /// The byte offset of register `r`'s vector in the group's lane file.
    pub(super) fn slot_at(&self, r: u32) -> i32 {
        let slot = self.lane_slot[r as usize];
        assert!(slot != u32::MAX, "register {r} has a lane file slot");
        slot as i32 * 16
    }

    /// The guard of `inst` as a 0/1 condition, if it has one.
    pub(super) fn guard(&mut self, inst: &Inst) -> Option<Value> {
        if inst.guard == NONE {
            return None;
        }
        let g = self.src(Src::Reg(inst.guard));
        let bit = self.fb.ins().band_imm_u(g, 1);
        let cc = if inst.guard_neg {
            IntCC::Equal
        } else {
            IntCC::NotEqual
        };
        Some(self.fb.ins().icmp_imm_u(cc, bit, 0))
    }

    /// The block after `pc` (the next basic block when `pc` ends one).
    pub(super) fn next_block(&self, pc: u32) -> Block {
        self.blocks
            .get(self.plan.block_at(pc + 1))
            .copied()
            .unwrap_or(self.exit_block)
    }

    /// Emits instruction `pc`; false once it ended the basic block.
    fn inst(&mut self, pc: u32) -> bool {
        let inst = &self.func.code[pc as usize];
        let guard = self.guard(inst);
        match inst.op {
            Op::Bra { target } => {
                let go = self.fb.create_block();
                match guard {
                    Some(c) => {
                        let next = self.next_block(pc);
                        self.fb.ins().brif(c, go, &[], next, &[]);
                    }
                    None => {
                        self.fb.ins().jump(go, &[]);
                    }
                }
                self.fb.switch_to_block(go);
                self.branch_to(target, pc, inst.line);
                false
            }
            Op::Ret | Op::Exit => {
                match guard {
                    Some(c) => {
                        let next = self.next_block(pc);
                        self.fb.ins().brif(c, self.exit_block, &[], next, &[]);
                    }
                    None => {
                        self.fb.ins().jump(self.exit_block, &[]);
                    }
                }
                false
            }
            Op::Trap(_) => {
                let trap = self.fb.create_block();
                match guard {
                    Some(c) => {
                        let next = self.next_block(pc);
                        self.fb.ins().brif(c, trap, &[], next, &[]);
                    }
                    None => {
                        self.fb.ins().jump(trap, &[]);
                    }
                }
                self.fb.switch_to_block(trap);
                let op = self.imm(&self.ops[pc as usize] as *const Op as usize as i64);
                let line = self.imm32(inst.line as i64);
                let lin = self.lin_at();
                self.call_runtime(rt_trap as *const (), &[self.ctx, op, line, lin], &[I32]);
                self.jump_to_fault();
                false
            }
            ref op if stops(op) => {
                let wait = self.fb.create_block();
                match guard {
                    Some(c) => {
                        let next = self.next_block(pc);
                        self.fb.ins().brif(c, wait, &[], next, &[]);
                    }
                    None => {
                        self.fb.ins().jump(wait, &[]);
                    }
                }
                self.fb.switch_to_block(wait);
                // the barrier (its id, count and `bar.red` predicate) or the
                // collective reads its operands from the register file
                let why = match inst.op {
                    Op::Bar { .. } => STOP_BARRIER,
                    _ => STOP_WARP,
                };
                self.stop_at(pc + 1, why, &inst.op.src_regs());
                false
            }
            _ => {
                let (on, cont) = match guard {
                    Some(c) => {
                        let on = self.fb.create_block();
                        let cont = self.fb.create_block();
                        self.fb.ins().brif(c, on, &[], cont, &[]);
                        self.fb.switch_to_block(on);
                        (Some(on), Some(cont))
                    }
                    None => (None, None),
                };
                self.op(pc);
                if let (Some(_), Some(cont)) = (on, cont) {
                    self.fb.ins().jump(cont, &[]);
                    self.fb.switch_to_block(cont);
                }
                true
            }
        }
    }

    /// The taken way of a branch at `pc` to `target`: a backward one
    /// yields when the block's count passed its next check.
    pub(super) fn branch_to(&mut self, target: u32, pc: u32, line: u32) {
        let to = self.blocks[self.plan.block_at(target)];
        // as the interpreter: a backward branch and a call check the
        // block's budget (a branch the inliner added does not)
        let checks = (target <= pc && line & UNCOUNTED == 0) || line & CHECKS != 0;
        let line = line & !(UNCOUNTED | CHECKS);
        if checks {
            // a long loop yields so that the block's budgets are checked
            let n = count_now(&mut self.fb, self.ctx);
            let at = self
                .fb
                .ins()
                .load(I64, MemFlagsData::trusted(), self.ctx, ctx_off!(check_at));
            let over = self.fb.ins().icmp(IntCC::UnsignedGreaterThan, n, at);
            let stop = self.fb.create_block();
            self.fb.set_cold_block(stop);
            self.fb.ins().brif(over, stop, &[], to, &[]);
            self.fb.switch_to_block(stop);
            if self.checks_in_place {
                let line = self.imm(line as i64);
                let failed = self.call_status(rt_checkpoint as *const (), &[self.ctx, n, line]);
                self.fault_if(failed);
                self.fb.ins().jump(to, &[]);
                return;
            }
            let line = self.fb.ins().iconst(I64, line as i64);
            self.fb.ins().store(
                MemFlagsData::trusted(),
                line,
                self.ctx,
                ctx_off!(yield_line),
            );
            self.stop_at(target, STOP_YIELD, &[]);
        } else {
            self.fb.ins().jump(to, &[]);
        }
    }

    /// The value of `s` as 64 register bits.
    pub(super) fn src(&mut self, s: Src) -> Value {
        match s {
            Src::Reg(r) => match self.vregs[r as usize] {
                Some(v) => {
                    let all = self.fb.use_var(v);
                    let x = self.fb.ins().extractlane(all, self.lane as u8);
                    self.fb.ins().uextend(I64, x)
                }
                None => match self.wregs[r as usize] {
                    Some(halves) => {
                        let half = self.fb.use_var(halves[self.lane / 2]);
                        self.fb.ins().extractlane(half, (self.lane % 2) as u8)
                    }
                    None if self.sregs[r as usize].is_some() => self.strided_at(r, self.lane),
                    None => self.fb.use_var(self.regs[r as usize]),
                },
            },
            Src::Imm(v) => self.fb.ins().iconst(I64, v as i64),
            // a kernel's frame starts at local address 0
            Src::Frame(o) => self.fb.ins().iconst(I64, o as i64),
        }
    }

    pub(super) fn set(&mut self, d: u32, v: Value) {
        assert!(
            self.sregs[d as usize].is_none(),
            "strided register {d} is written by `strided_op` alone"
        );
        match self.vregs[d as usize] {
            Some(var) => {
                self.vraw.retain(|x| x.0 != d);
                self.vmasks.retain(|x| x.0 != d);
                // a narrow register: `v` is below 2^32
                let all = self.fb.use_var(var);
                let x = self.fb.ins().ireduce(I32, v);
                let all = self.fb.ins().insertlane(all, x, self.lane as u8);
                self.fb.def_var(var, all);
            }
            None => match self.wregs[d as usize] {
                Some(halves) => {
                    let var = halves[self.lane / 2];
                    let half = self.fb.use_var(var);
                    let half = self.fb.ins().insertlane(half, v, (self.lane % 2) as u8);
                    self.fb.def_var(var, half);
                }
                None => self.fb.def_var(self.regs[d as usize], v),
            },
        }
    }

    /// `v` sign-extended from its low `bits`.
    pub(super) fn sext(&mut self, v: Value, bits: u32) -> Value {
        if bits >= 64 {
            return v;
        }
        let s = self.fb.ins().ishl_imm_u(v, (64 - bits) as i64);
        self.fb.ins().sshr_imm_u(s, (64 - bits) as i64)
    }

    /// Jumps to the fault exit when `failed` (an I32 status) is non-zero.
    pub(super) fn fault_if(&mut self, failed: Value) {
        let ok = self.fb.create_block();
        let excess = self.fb.ins().iconst(I64, self.excess);
        self.fb.ins().brif(
            failed,
            self.fault_block,
            &[BlockArg::Value(excess)],
            ok,
            &[],
        );
        self.fb.switch_to_block(ok);
    }

    /// Jumps to the fault exit (the current block ends).
    pub(super) fn jump_to_fault(&mut self) {
        let excess = self.fb.ins().iconst(I64, self.excess);
        self.fb
            .ins()
            .jump(self.fault_block, &[BlockArg::Value(excess)]);
    }

    /// An I32 constant.
    pub(super) fn imm32(&mut self, v: i64) -> Value {
        self.fb.ins().iconst(I32, v)
    }

    /// A 64-bit constant.
    pub(super) fn imm(&mut self, v: i64) -> Value {
        self.fb.ins().iconst(I64, v)
    }

    /// A type of `bytes` bytes.
    pub(super) fn int_type(bytes: u32) -> Type {
        Type::int_with_byte_size(bytes as u16).unwrap_or(I64)
    }

    /// Jumps to `to` passing `v` (`emit_mem`'s joins).
    pub(super) fn jump_with(&mut self, to: Block, v: Value) {
        self.fb.ins().jump(to, &[BlockArg::Value(v)]);
    }
}
