//! Shared-memory `ld` and `st` of 32-bit narrow values in the lane kernel,
//! where its block's check covered them: one vector access when the lanes'
//! addresses are consecutive, one load when they are the same, else lane by lane.

use super::lane_defs::{add_imm, unaligned, Lazy};
use super::shared_checks::groups;
use super::translate::{LaneBase, Translator};
use crate::ir::{Address, Inst, MemOrder, Op, Sp, Src, NONE};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I32, I32X4, I64, I8};
use cranelift_codegen::ir::{ConstantData, InstBuilder, Value};

impl Translator<'_, '_> {
    /// How the lanes' addresses lie for each base of the covered shared
    /// accesses of block `start..end` (narrow bases only), computed once
    /// at the block's start.
    pub(super) fn shared_lane_bases(&mut self, start: u32, end: u32) -> Vec<LaneBase> {
        let (_, groups) = groups(self.ops, start, end);
        let mut out = Vec::new();
        for g in groups {
            let narrow = match g.base {
                Src::Reg(r) => self.vregs[r as usize].is_some(),
                _ => false,
            };
            if !narrow {
                continue;
            }
            let known = match (g.base, self.x_aligned) {
                (Src::Reg(r), Some(aligned)) => match self.strides[r as usize] {
                    Some(0) => Some((true, aligned)),
                    Some(4) => Some((false, aligned)),
                    _ => None,
                },
                _ => None,
            };
            if let Some((same, aligned)) = known {
                // the way is the register's stride's (where the group's
                // lanes are aligned, which the block's check adds)
                // (the low end the block's check made, where it did)
                let low = self
                    .span_lows
                    .iter()
                    .find(|s| s.0 == g.base && s.1 == g.lo && s.2 == 0)
                    .map(|s| s.3);
                let first = match low {
                    Some(lo64) => self.shared_at(lo64),
                    None => {
                        let lanes = self.vsrc_pub(g.base);
                        let first = self.fb.ins().extractlane(lanes, 0);
                        let first = match g.lo {
                            0 => first,
                            lo => add_imm(&mut self.fb, first, lo as u32 as i64),
                        };
                        let first = self.fb.ins().uextend(I64, first);
                        self.shared_unchecked(first)
                    }
                };
                out.push(LaneBase {
                    base: g.base,
                    lo: g.lo,
                    first,
                    consecutive: aligned,
                    equal: aligned,
                    mode: Some(same),
                    fixed: true,
                });
                continue;
            }
            let addr = Address {
                sp: Sp::Shared,
                base: g.base,
                off: g.lo,
            };
            let (_, low, (consecutive, equal)) = self.lane_addresses(&addr);
            let first = self.shared_unchecked(low);
            out.push(LaneBase {
                base: g.base,
                lo: g.lo,
                first,
                consecutive,
                equal,
                mode: None,
                fixed: false,
            });
        }
        out
    }

    /// Whether every base of the block's [`LaneBase`]s has its lanes'
    /// addresses consecutive or all the same (I8 conditions, each to hold).
    pub(super) fn lanes_regular(&mut self) -> Vec<Value> {
        // (the fixed bases' condition, `x_aligned`, holds wherever the
        // lane kernel runs: `fixed_shared_bases` has the launch see to it)
        let mut all = Vec::new();
        for k in 0..self.lane_bases.len() {
            let (c, e) = (self.lane_bases[k].consecutive, self.lane_bases[k].equal);
            if !self.lane_bases[k].fixed {
                all.push(self.fb.ins().bor(c, e));
            }
        }
        all
    }

    /// Sets the block's bases whose way is not fixed to way `way` (bit `k`:
    /// the `k`th such base's lanes all the same, else consecutive) and
    /// tells whether the lanes lie so.
    pub(super) fn lanes_way(&mut self, way: u32) -> Value {
        let mut all = self.fb.ins().iconst(I8, 1);
        let open: Vec<usize> = (0..self.lane_bases.len())
            .filter(|&k| !self.lane_bases[k].fixed)
            .collect();
        for (bit, k) in open.into_iter().enumerate() {
            let same = way >> bit & 1 != 0;
            let b = &mut self.lane_bases[k];
            b.mode = Some(same);
            let holds = if same { b.equal } else { b.consecutive };
            all = self.fb.ins().band(all, holds);
        }
        all
    }

    /// In the copy of a block its [`Self::lanes_regular`] check let run:
    /// the host pointer of the first lane's access at `addr` and whether
    /// the lanes' addresses are all the same (else consecutive).
    fn regular_at(&mut self, addr: &Address) -> Option<(Value, Value, Option<bool>)> {
        let b = self.lane_bases.iter().find(|b| b.base == addr.base)?;
        let (first, equal, mode, d) = (b.first, b.equal, b.mode, addr.off - b.lo);
        Some((add_imm(&mut self.fb, first, d), equal, mode))
    }

    /// Emits `inst`, a covered unguarded 32-bit shared `ld` or `st` of
    /// narrow registers, for every lane; whether it did.
    pub(super) fn vector_shared(&mut self, inst: &Inst) -> bool {
        let narrow = |t: &Self, s: Src| match s {
            Src::Reg(r) => t.vregs[r as usize].is_some(),
            Src::Imm(_) => true,
            Src::Frame(_) => false,
        };
        let fits = |t: &Self, addr: &Address, size: u32, n: u8| {
            inst.guard == NONE
                && addr.sp == Sp::Shared
                && size == 4
                && n == 1
                && narrow(t, addr.base)
                && t.covered(Sp::Shared)
        };
        match inst.op {
            Op::Ld {
                addr,
                size,
                n,
                ds,
                sext: false,
                order: MemOrder::Plain,
            } if fits(self, &addr, size, n) && narrow(self, Src::Reg(ds[0])) => {
                let flags = unaligned();
                let v = match self.regular_at(&addr) {
                    Some((p, _, Some(same))) => {
                        // loaded where read (as `f32` lanes, a word all
                        // lanes read broadcast from memory: one op)
                        self.vdef_lazy(ds[0], Lazy::Load { p, same });
                        return true;
                    }
                    Some((p, equal, None)) => {
                        // 16 bytes from the first lane's word (the block's
                        // shared memory has 16 bytes to spare past its end)
                        let whole = self.fb.ins().load(I32X4, flags, p, 0);
                        let one = self.fb.ins().load(I32, flags, p, 0);
                        let one = self.fb.ins().splat(I32X4, one);
                        self.fb.ins().select(equal, one, whole)
                    }
                    None => self.gather(&addr),
                };
                self.vdef(ds[0], v, None);
                true
            }
            Op::St {
                n,
                size,
                vals,
                addr,
                order: MemOrder::Plain,
            } if fits(self, &addr, size, n) && narrow(self, vals[0]) => {
                let flags = unaligned();
                let x = self.vsrc_pub(vals[0]);
                match self.regular_at(&addr) {
                    Some((p, _, Some(false))) => {
                        self.fb.ins().store(flags, x, p, 0);
                    }
                    Some((p, _, Some(true))) => {
                        // one word: the last lane's value stays, as the last thread's
                        let e = self.fb.ins().extractlane(x, self.width as u8 - 1);
                        self.fb.ins().store(flags, e, p, 0);
                    }
                    Some((p, equal, None)) => {
                        let (same, whole) = (self.fb.create_block(), self.fb.create_block());
                        let join = self.fb.create_block();
                        self.fb.ins().brif(equal, same, &[], whole, &[]);
                        self.fb.switch_to_block(same);
                        // one word: the last lane's value stays, as the last thread's
                        let e = self.fb.ins().extractlane(x, self.width as u8 - 1);
                        self.fb.ins().store(flags, e, p, 0);
                        self.fb.ins().jump(join, &[]);
                        self.fb.switch_to_block(whole);
                        self.fb.ins().store(flags, x, p, 0);
                        self.fb.ins().jump(join, &[]);
                        self.fb.switch_to_block(join);
                    }
                    None => {
                        // lane after lane: where two meet, the later thread's value stays
                        let at = self.lane_addrs(&addr);
                        for k in 0..self.width as u8 {
                            let a = self.fb.ins().extractlane(at, k);
                            let a = self.fb.ins().uextend(I64, a);
                            let p = self.shared_unchecked(a);
                            let e = self.fb.ins().extractlane(x, k);
                            self.fb.ins().store(flags, e, p, 0);
                        }
                    }
                }
                true
            }
            _ => false,
        }
    }

    /// The lanes' 32-bit addresses of `addr` (an I32X4).
    fn lane_addrs(&mut self, addr: &Address) -> Value {
        let base = self.vsrc_pub(addr.base);
        let off = self.fb.ins().iconst(I32, addr.off as u32 as i64);
        let off = self.fb.ins().splat(I32X4, off);
        self.fb.ins().iadd(base, off)
    }

    /// The words at each lane's address of `addr`, lane by lane.
    fn gather(&mut self, addr: &Address) -> Value {
        let flags = unaligned();
        let at = self.lane_addrs(addr);
        let zero = self.fb.ins().iconst(I32, 0);
        let mut x = self.fb.ins().splat(I32X4, zero);
        for k in 0..self.width as u8 {
            let a = self.fb.ins().extractlane(at, k);
            let a = self.fb.ins().uextend(I64, a);
            let p = self.shared_unchecked(a);
            let e = self.fb.ins().load(I32, flags, p, 0);
            x = self.fb.ins().insertlane(x, e, k);
        }
        x
    }

    /// The lanes' 32-bit addresses of `addr`, the first lane's (an I64),
    /// and whether they are consecutive words, and all the same.
    fn lane_addresses(&mut self, addr: &Address) -> (Value, Value, (Value, Value)) {
        let at = self.lane_addrs(addr);
        let first = self.fb.ins().extractlane(at, 0);
        let all_first = self.fb.ins().splat(I32X4, first);
        let words: Vec<u8> = [0u32, 4, 8, 12]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let c = self.fb.func.dfg.constants.insert(ConstantData::from(words));
        let words = self.fb.ins().vconst(I32X4, c);
        let expect = self.fb.ins().iadd(all_first, words);
        let eq = self.fb.ins().icmp(IntCC::Equal, at, expect);
        let consecutive = self.fb.ins().vall_true(eq);
        let eq = self.fb.ins().icmp(IntCC::Equal, at, all_first);
        let equal = self.fb.ins().vall_true(eq);
        let first = self.fb.ins().uextend(I64, first);
        (at, first, (consecutive, equal))
    }
}
