//! One check for a basic block's shared-memory accesses: where every `ld` and
//! `st` of shared memory whose base register the block does not change is in
//! bounds and aligned, a copy of the block runs them unchecked.

use super::lane_defs::add_imm;
use super::runtime::Ctx;
use super::translate::{ctx_off, Translator};
use crate::ir::{Op, Sp, Src, NONE};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I32, I64};
use cranelift_codegen::ir::{Block, InstBuilder, MemFlagsData, Value};
use std::mem::offset_of;

/// The shared accesses of one base operand in a basic block: the lowest
/// and highest offsets (and bytes at that end), the alignments they need.
pub(super) struct Group {
    pub base: Src,
    pub lo: i64,
    hi: i64,
    /// (offset modulo alignment, alignment) pairs every access needs.
    aligns: Vec<(i64, i64)>,
}

/// The pcs of `ops[start..end]` whose shared accesses one check can cover
/// (base operand unchanged before them in the block), grouped by base.
pub(super) fn groups(ops: &[Op], start: u32, end: u32) -> (Vec<u32>, Vec<Group>) {
    let mut written: Vec<u32> = Vec::new();
    let mut pcs = Vec::new();
    let mut groups: Vec<Group> = Vec::new();
    for pc in start..end {
        let op = &ops[pc as usize];
        let access = match *op {
            Op::Ld { addr, size, n, .. } | Op::St { addr, size, n, .. }
                if addr.sp == Sp::Shared =>
            {
                Some((addr, size, n))
            }
            _ => None,
        };
        if let Some((addr, size, n)) = access {
            let unchanged = match addr.base {
                Src::Reg(r) => !written.contains(&r),
                Src::Imm(_) => true,
                Src::Frame(_) => false,
            };
            let total = size as i64 * n as i64;
            if unchanged && total > 0 {
                pcs.push(pc);
                // each element aligned to its size, a vector to its whole size
                let mut needs = vec![(addr.off & (size as i64 - 1), size as i64)];
                if n > 1 {
                    let whole = total.min(16);
                    needs.push((addr.off & (whole - 1), whole));
                }
                let g = match groups.iter().position(|g| g.base == addr.base) {
                    Some(k) => &mut groups[k],
                    None => {
                        groups.push(Group {
                            base: addr.base,
                            lo: addr.off,
                            hi: addr.off + total,
                            aligns: Vec::new(),
                        });
                        groups.last_mut().expect("just pushed")
                    }
                };
                g.lo = g.lo.min(addr.off);
                g.hi = g.hi.max(addr.off + total);
                for need in needs {
                    if need.1 > 1 && !g.aligns.contains(&need) {
                        g.aligns.push(need);
                    }
                }
            }
        }
        op.for_each_dst(|d| {
            if d != NONE {
                written.push(d)
            }
        });
    }
    (pcs, groups)
}

impl Translator<'_, '_> {
    /// For the basic block `start..end`: the shared accesses one check
    /// covers and that check (I8 conditions, all of which hold where all
    /// of them are in bounds and aligned), if there are at least two;
    /// `shared_here` must be set.
    pub(super) fn shared_block_check(
        &mut self,
        start: u32,
        end: u32,
    ) -> Option<(Vec<u32>, Vec<Value>)> {
        self.shared_span_check(start, end, 2, 0)
    }

    /// The lane kernel's one check for all its lanes of basic block
    /// `start..end`'s covered shared accesses (even one), made on the
    /// first lane with its span `12` bytes longer: it holds for every lane
    /// once [`Self::lanes_regular`] says each base's lanes are consecutive
    /// words (the last lane 12 bytes on) or all the same. Only where each
    /// base is a narrow register or an immediate and no access needs more
    /// than word alignment (a lane 4 bytes on keeps the first's); else
    /// `None` (each lane is checked).
    pub(super) fn lanes_span_check(
        &mut self,
        start: u32,
        end: u32,
    ) -> Option<(Vec<u32>, Vec<Value>)> {
        let (pcs, groups) = groups(self.ops, start, end);
        let simple = groups.iter().all(|g| {
            let narrow = match g.base {
                Src::Reg(r) => self.vregs[r as usize].is_some(),
                Src::Imm(_) => true,
                Src::Frame(_) => false,
            };
            narrow && g.aligns.iter().all(|&(_, align)| align <= 4)
        });
        if pcs.is_empty() || !simple {
            return None;
        }
        self.set_lane(0);
        self.shared_span_check(start, end, 1, 4 * (self.width as i64 - 1))
    }

    /// The check of [`Self::shared_block_check`] for the running lane, if
    /// it covers `min` accesses at least, each base's span `slack` bytes
    /// longer: its conditions one by one (the caller branches on each: no
    /// flags ANDed together), and each base's low end, zero-extended, kept
    /// in [`Translator::span_lows`] for the block's pointers.
    fn shared_span_check(
        &mut self,
        start: u32,
        end: u32,
        min: usize,
        slack: i64,
    ) -> Option<(Vec<u32>, Vec<Value>)> {
        let (pcs, groups) = groups(self.ops, start, end);
        if pcs.len() < min.max(1) {
            return None;
        }
        let (_, bytes) = self.shared_here?;
        let mut conds = Vec::new();
        self.span_lows.clear();
        for g in groups {
            // the span's offsets must not wrap the 32-bit window: its low
            // end, wrapped, plus its length within the block's bytes
            // (every access then is the low end plus its distance)
            let span = g.hi - g.lo + slack;
            if !(0..1 << 31).contains(&span) {
                self.span_lows.clear();
                return None;
            }
            let lo32 = self.low_word(g.base, g.lo);
            let lo64 = self.fb.ins().uextend(I64, lo32);
            let end = add_imm(&mut self.fb, lo64, span);
            conds.push(
                self.fb
                    .ins()
                    .icmp(IntCC::UnsignedLessThanOrEqual, end, bytes),
            );
            for (rem, align) in g.aligns {
                // (the low end's own low bits where the access lies as it
                // does: `align` divides 2^32)
                let at = if (rem - g.lo).rem_euclid(align) == 0 {
                    lo32
                } else {
                    self.low_word(g.base, rem)
                };
                let low = self.fb.ins().band_imm_u(at, align - 1);
                conds.push(self.fb.ins().icmp_imm_u(IntCC::Equal, low, 0));
            }
            self.span_lows.push((g.base, g.lo, self.lane, lo64));
        }
        Some((pcs, conds))
    }

    /// Goes on to `fast` where every condition of `conds` holds, else to
    /// `checked`: a branch on each (the code generator compares and jumps,
    /// where flags ANDed together took it three ops each).
    pub(super) fn branch_all(&mut self, conds: Vec<Value>, fast: Block, checked: Block) {
        if conds.is_empty() {
            self.fb.ins().jump(fast, &[]);
            self.fb.switch_to_block(fast);
            return;
        }
        let last = conds.len() - 1;
        for (k, c) in conds.into_iter().enumerate() {
            let on = if k == last {
                fast
            } else {
                self.fb.create_block()
            };
            self.fb.ins().brif(c, on, &[], checked, &[]);
            self.fb.switch_to_block(on);
        }
    }

    /// The low 32 bits of `base` plus `off` for the running lane (an I32):
    /// a narrow register's lane as it is, no 64-bit round trip.
    fn low_word(&mut self, base: Src, off: i64) -> Value {
        let x = match base {
            Src::Reg(r) if self.vregs[r as usize].is_some() && self.width > 1 => {
                let var = self.vregs[r as usize].expect("narrow");
                let all = self.fb.use_var(var);
                self.fb.ins().extractlane(all, self.lane as u8)
            }
            _ => {
                let b = self.src(base);
                self.fb.ins().ireduce(I32, b)
            }
        };
        match off {
            0 => x,
            o => add_imm(&mut self.fb, x, o as u32 as i32 as i64),
        }
    }

    /// The host pointer of a shared access the block's check covered.
    pub(super) fn shared_unchecked(&mut self, addr: Value) -> Value {
        let a32 = self.fb.ins().ireduce(I32, addr);
        let off = self.fb.ins().uextend(I64, a32);
        self.shared_at(off)
    }

    /// The host pointer of shared offset `off` (below 2^32, zero-extended).
    pub(super) fn shared_at(&mut self, off: Value) -> Value {
        let base = match self.shared_here {
            Some((base, _)) => base,
            None => {
                let fixed = MemFlagsData::trusted().with_readonly();
                self.fb.ins().load(I64, fixed, self.ctx, ctx_off!(shared))
            }
        };
        self.fb.ins().iadd(base, off)
    }
}
