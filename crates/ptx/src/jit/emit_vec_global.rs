//! Global and generic `ld` and `st` of 32-bit narrow values in the lane kernel:
//! one 16-byte access (a store logged first) where the lanes' addresses are consecutive words inside the allocation the access resolved last, else lane by lane.

use super::lane_defs::{add_imm, unaligned};
use super::runtime::{Ctx, GLOBAL_ENTRY_BYTES};
use super::translate::{ctx_off, Translator};
use crate::ir::{Address, Inst, MemOrder, Op, Sp, Src, NONE};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I32, I32X4, I64, I8};
use cranelift_codegen::ir::{BlockArg, InstBuilder, MemFlagsData, Value};
use std::mem::offset_of;

/// Every lane's address of a global access: each lane's (I64s, made
/// lane by lane from per-lane registers), or two I64X2 of a vector-wide
/// base, whose lanes are taken out only on the lane-by-lane path.
enum LaneAddrs {
    Each(Vec<Value>),
    Halves([Value; 2]),
    /// The first lane's, and the stride between the lanes' (a strided base).
    Strided(Value, u64),
}

impl Translator<'_, '_> {
    /// `ld` of a narrow 32-bit register from, or `st` of one (or an
    /// immediate) to, global or generic memory at a wide address,
    /// unguarded: one 16-byte access where the lanes' addresses are
    /// consecutive words inside the allocation the access resolved last,
    /// else lane by lane; whether it did.
    pub(super) fn vector_global(&mut self, inst: &Inst) -> bool {
        let (addr, value) = match inst.op {
            Op::Ld {
                addr,
                size: 4,
                n: 1,
                ds,
                sext: false,
                order: MemOrder::Plain,
            } if self.vregs[ds[0] as usize].is_some() => (addr, Err(ds[0])),
            Op::St {
                addr,
                size: 4,
                n: 1,
                vals,
                order: MemOrder::Plain,
            } => match vals[0] {
                Src::Reg(r) if self.vregs[r as usize].is_some() => (addr, Ok(vals[0])),
                Src::Imm(_) => (addr, Ok(vals[0])),
                _ => return false,
            },
            _ => return false,
        };
        let wide = matches!(addr.base, Src::Reg(r) if self.vregs[r as usize].is_none());
        let spaces = matches!(addr.sp, Sp::Global | Sp::Generic);
        if inst.guard != NONE || !wide || !spaces || self.width != 4 {
            return false;
        }
        // (a strided base whose lanes are consecutive words is known so
        // before the run; one with another stride goes lane by lane)
        let (addrs, first, consecutive) = match self.strided_address(addr.base, addr.off) {
            Some((first, 4)) => (LaneAddrs::Strided(first, 4), first, None),
            Some(_) => return false,
            None => {
                let (addrs, first, consecutive) = self.global_lane_addrs(&addr);
                (addrs, first, Some(consecutive))
            }
        };
        self.next_site(addr.sp);
        let site = self.site;
        let pc = self.pc_now;
        let covered = self
            .hoist
            .and_then(|h| h.sites.iter().position(|(at, _)| *at == pc));
        if let (None, Some(h)) = (consecutive, covered) {
            // the block's check found every group's access inside one
            // allocation: its host pointer less its address (`jit::hoist`)
            self.hoisted.push((pc, site));
            let p = self.fb.ins().iadd(first, self.hoist_deltas[h]);
            match value {
                Err(d) => {
                    let x = self.fb.ins().load(I32X4, unaligned(), p, 0);
                    self.vdef(d, x, None);
                }
                Ok(val) => {
                    let x = self.vsrc_pub(val);
                    if !self.plan.final_stores.contains(&pc) {
                        self.log_store(p, 16);
                    }
                    self.fb.ins().store(unaligned(), x, p, 0);
                }
            }
            return true;
        }
        // one compare: the offset in the allocation the site resolved last,
        // rotated right by 2, is below its length in words less 3 exactly
        // when the offset is a multiple of 4 and its 16 bytes end inside
        // (a misaligned offset rotates its low bits to the top; lengths are
        // far below 2^60; `GlobalEntry::words`)
        let flags = MemFlagsData::trusted();
        let fixed = flags.with_readonly();
        let cache = self.fb.ins().load(I64, fixed, self.ctx, ctx_off!(gcache));
        let entry = add_imm(&mut self.fb, cache, site as i64 * GLOBAL_ENTRY_BYTES);
        // (each load next to its one use, where it folds into the op)
        let gbase = self.fb.ins().load(I64, flags, entry, 0);
        let off = self.fb.ins().isub(first, gbase);
        let words = self.fb.ins().rotr_imm_u(off, 2);
        let starts = self.fb.ins().load(I64, flags, entry, 24);
        let inside = self.fb.ins().icmp(IntCC::UnsignedLessThan, words, starts);
        let all = match consecutive {
            Some(c) => self.fb.ins().band(c, inside),
            None => inside,
        };
        let (whole, each) = (self.fb.create_block(), self.fb.create_block());
        self.fb.set_cold_block(each);
        let join = self.fb.create_block();
        match value {
            Err(d) => {
                let v = self.fb.append_block_param(join, I32X4);
                self.fb.ins().brif(all, whole, &[], each, &[]);
                self.fb.switch_to_block(whole);
                let p = self.host_at(entry, off);
                let x = self.fb.ins().load(I32X4, unaligned(), p, 0);
                self.fb.ins().jump(join, &[BlockArg::Value(x)]);
                self.fb.switch_to_block(each);
                let x = self.lane_by_lane(&addr, &addrs, site, inst.line, None);
                self.fb
                    .ins()
                    .jump(join, &[BlockArg::Value(x.expect("loaded"))]);
                self.fb.switch_to_block(join);
                self.vdef(d, v, None);
            }
            Ok(val) => {
                let x = self.vsrc_pub(val);
                self.fb.ins().brif(all, whole, &[], each, &[]);
                self.fb.switch_to_block(whole);
                let p = self.host_at(entry, off);
                // (a group that stored last never runs again: `restart`)
                if !self.plan.final_stores.contains(&self.pc_now) {
                    self.log_store(p, 16);
                }
                self.fb.ins().store(unaligned(), x, p, 0);
                self.fb.ins().jump(join, &[]);
                self.fb.switch_to_block(each);
                self.lane_by_lane(&addr, &addrs, site, inst.line, Some(x));
                self.fb.ins().jump(join, &[]);
                self.fb.switch_to_block(join);
            }
        }
        true
    }

    /// The host pointer `off` bytes into the allocation of global-cache
    /// entry `entry`.
    fn host_at(&mut self, entry: Value, off: Value) -> Value {
        let gptr = self.fb.ins().load(I64, MemFlagsData::trusted(), entry, 16);
        self.fb.ins().iadd(gptr, off)
    }

    /// The lanes' addresses of `addr`, the first lane's (an I64) and
    /// whether they are consecutive words (an I8 condition).
    fn global_lane_addrs(&mut self, addr: &Address) -> (LaneAddrs, Value, Value) {
        if let Some((halves, first, consecutive)) = self.wide_addresses(addr) {
            return (LaneAddrs::Halves(halves), first, consecutive);
        }
        let lane = self.lane;
        let addrs: Vec<Value> = (0..self.width as usize)
            .map(|k| {
                self.set_lane(k);
                let b = self.src(addr.base);
                add_imm(&mut self.fb, b, addr.off)
            })
            .collect();
        self.set_lane(lane);
        let mut all = self.fb.ins().iconst(I8, 1);
        for (k, &a) in addrs.iter().enumerate().skip(1) {
            let want = add_imm(&mut self.fb, addrs[0], 4 * k as i64);
            let eq = self.fb.ins().icmp(IntCC::Equal, a, want);
            all = self.fb.ins().band(all, eq);
        }
        let first = addrs[0];
        (LaneAddrs::Each(addrs), first, all)
    }

    /// The access lane by lane, each through the access's site (a fault
    /// undoes the block, which runs again thread by thread): a load's
    /// words (an I32X4), or the store of `stored`'s lanes.
    fn lane_by_lane(
        &mut self,
        addr: &Address,
        addrs: &LaneAddrs,
        site: u32,
        line: u32,
        stored: Option<Value>,
    ) -> Option<Value> {
        let lane = self.lane;
        self.site_pin = Some(site);
        let zero = self.fb.ins().iconst(I32, 0);
        let mut x = self.fb.ins().splat(I32X4, zero);
        for k in 0..self.width as usize {
            self.set_lane(k);
            let a = match addrs {
                LaneAddrs::Each(v) => v[k],
                LaneAddrs::Halves(h) => self.fb.ins().extractlane(h[k / 2], (k % 2) as u8),
                LaneAddrs::Strided(first, stride) => {
                    let step = stride.wrapping_mul(k as u64) as i64;
                    add_imm(&mut self.fb, *first, step)
                }
            };
            match stored {
                Some(v) => {
                    let e = self.fb.ins().extractlane(v, k as u8);
                    let e = self.fb.ins().uextend(I64, e);
                    self.store(addr.sp, a, 4, e, line);
                }
                None => {
                    let e = self.load(addr.sp, a, 4, line);
                    let e = self.fb.ins().ireduce(I32, e);
                    x = self.fb.ins().insertlane(x, e, k as u8);
                }
            }
        }
        self.site_pin = None;
        self.set_lane(lane);
        stored.is_none().then_some(x)
    }
}
