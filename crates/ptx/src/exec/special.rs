//! Special registers (`%tid`, `%laneid`, `%clock64`, `%lanemask_*` …) as the
//! interpreter reports them for one thread.

use super::limits::RESERVED_SMEM;
use super::state::{Block, Geo};
use crate::ir::SReg;

/// The value of special register `r` for thread `lin` (at `tid`) at `clock`.
pub(super) fn special(g: &Geo<'_>, b: &Block, clock: u64, tid: [u32; 3], lin: u32, r: SReg) -> u64 {
    let lane = lin % 32;
    match r {
        SReg::Tid(d) => tid[d as usize % 3] as u64,
        SReg::Ntid(9) => 1,
        SReg::Ntid(d) => g.config.block[d as usize % 3] as u64,
        SReg::Ctaid(d) => b.ctaid[d as usize % 3] as u64,
        SReg::Nctaid(d) => g.config.grid[d as usize % 3] as u64,
        SReg::Laneid => lane as u64,
        SReg::Warpid => (lin / 32) as u64,
        SReg::Nwarpid => (g.config.block.iter().product::<u32>()).div_ceil(32) as u64,
        SReg::Smid => b.smid as u64,
        SReg::Nsmid => 132,
        SReg::Gridid => 1,
        SReg::Clock => clock & 0xffff_ffff,
        SReg::Clock64 => clock,
        SReg::Globaltimer => g.start_ns.wrapping_add(clock),
        SReg::LanemaskEq => 1u64 << lane,
        SReg::LanemaskLt => (1u64 << lane) - 1,
        SReg::LanemaskLe => ((1u64 << lane) << 1).wrapping_sub(1) & 0xffff_ffff,
        SReg::LanemaskGt => !(((1u64 << lane) << 1).wrapping_sub(1)) & 0xffff_ffff,
        SReg::LanemaskGe => !((1u64 << lane) - 1) & 0xffff_ffff,
        SReg::DynSmem => g.config.dynamic_shared_bytes as u64,
        SReg::TotalSmem => g.shared_bytes,
        SReg::ReservedSmem(k) => {
            let (begin, half) = (g.reserved_smem, RESERVED_SMEM / 2);
            [
                begin,
                begin + RESERVED_SMEM,
                RESERVED_SMEM,
                begin,
                begin + half,
            ][k as usize % 5]
        }
        SReg::Envreg(1) => g.grid_workspace >> 32,
        SReg::Envreg(2) => g.grid_workspace & 0xffff_ffff,
        SReg::Envreg(_) | SReg::Zero => 0,
    }
}
